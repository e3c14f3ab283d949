"""bsuite's experiments as studies: the envs (shared starts, exact restores, flat observations, fixed episode
lengths), bsuite's scores on hand-built episode logs, the study's plan and refusals, and a tiny sweep end to end."""

from __future__ import annotations

import csv
from pathlib import Path

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest

from envs import EnvOptions, bsuite, episode_limit, make_vector, snapshot
from envs.start_states import reset_groups, restore_mode
from lab import bsuite_study, credit
from lab.cli import main
from tests.conftest import REPO

SETTINGS = {
    "umbrella_length": {"chain_length": 3, "n_distractor": 20},
    "umbrella_distract": {"n_distractor": 2},
    "discounting_chain": {"mapping_seed": 3},
    "memory_len": {"memory_length": 2},
}


# ── the envs ─────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("experiment", list(SETTINGS))
def test_same_seed_same_start_and_a_restore_replays_exactly(experiment: str) -> None:
    kwargs = SETTINGS[experiment]
    env_id = bsuite.env_id(experiment)
    vector = make_vector(env_id, 4, EnvOptions(vectorization="sync"), **kwargs)
    obs = reset_groups(vector, [7, 8], 2)  # (4, n): members 0, 1 share seed 7, members 2, 3 seed 8
    assert obs.ndim == 2 and np.array_equal(obs[0], obs[1]) and np.array_equal(obs[2], obs[3])
    vector.close()
    assert restore_mode(env_id, **kwargs) == "direct"
    env = gym.make(env_id, **kwargs)
    env.reset(seed=1)
    env.step(1)
    saved = snapshot.snapshot(env)
    actions = [1, 0, 1, 1, 0, 0, 1, 0]
    first = [env.step(a)[:4] for a in actions]  # through an episode's end and the next one's start
    snapshot.restore(env, saved)
    again = [env.step(a)[:4] for a in actions]
    for (o1, r1, t1, u1), (o2, r2, t2, u2) in zip(first, again, strict=True):
        assert np.array_equal(o1, o2) and (r1, t1, u1) == (r2, t2, u2)
    env.close()


def test_episode_lengths_are_fixed_and_known_to_the_factory() -> None:
    assert bsuite.episode_length("umbrella_length", chain_length=7, n_distractor=20) == 7
    assert bsuite.episode_length("umbrella_distract", n_distractor=5) == 20
    assert bsuite.episode_length("discounting_chain", mapping_seed=0) == 100
    assert bsuite.episode_length("memory_len", memory_length=4) == 5
    assert episode_limit("bsuite/memory_len-v0", memory_length=4) == 5  # GRPO's H, with no time limit to set
    assert bsuite.num_episodes("umbrella_length") == 10_000 and bsuite.num_episodes("discounting_chain") == 1_000


def test_counters_rebuilt_from_last_rewards_match_the_envs_own() -> None:
    """bsuite_frame's total_regret / total_perfect equal the env's bsuite_info() after every episode."""
    rng = np.random.default_rng(0)
    for experiment, keys in (("umbrella_length", ("total_regret",)), ("memory_len", ("total_regret", "total_perfect"))):
        env = gym.make(bsuite.env_id(experiment), **SETTINGS[experiment])
        env.reset(seed=3)
        rows, counters = [], []
        while len(rows) < 60:
            ret, length, done = 0.0, 0, False
            while not done:
                _, reward, terminated, truncated, _ = env.step(int(rng.integers(2)))
                ret, length, done = ret + reward, length + 1, terminated or truncated
            rows.append({"episode": len(rows) + 1, "return": ret, "length": length, "last_reward": reward})
            counters.append(env.unwrapped._env.bsuite_info())
            env.reset()
        index = str(bsuite.settings(experiment).index(SETTINGS[experiment]))
        frame = bsuite_study.bsuite_frame(pd.DataFrame(rows), experiment, index)
        for key in keys:
            assert frame[key].tolist() == [c[key] for c in counters], key
        env.close()


# ── bsuite's scores on hand-built logs ───────────────────────────────────────────────────────────────────


def episodes(last_rewards: list[float], length: int, returns: list[float] | None = None) -> pd.DataFrame:
    """An episodes.csv of the given last rewards (and returns, else the last rewards)."""
    n = len(last_rewards)
    return pd.DataFrame(
        {
            "global_step": np.arange(1, n + 1) * length,
            "episode": np.arange(1, n + 1),
            "return": returns if returns is not None else last_rewards,
            "length": length,
            "last_reward": last_rewards,
        }
    )


def wrong_share(share: float, n: int = 10_000) -> list[float]:
    """n episodes, the first ``share`` of them wrong (−1), the rest right (+1)."""
    wrong = round(share * n)
    return [-1.0] * wrong + [1.0] * (n - wrong)


def umbrella_score(*settings: tuple[str, list[float]]) -> float:
    frames = [bsuite_study.bsuite_frame(episodes(last, 1), "umbrella_length", i) for i, last in settings]
    return bsuite_study.score("umbrella_length", frames)


def test_umbrella_scores_the_share_of_settings_with_average_regret_below_a_half() -> None:
    assert umbrella_score(("0", wrong_share(0.0)), ("5", wrong_share(0.0))) == 1.0  # always right
    assert umbrella_score(("0", wrong_share(0.5))) == 0.0  # chance: regret 1 per episode
    # 20% wrong: regret 0.4 < 0.5 passes; 30% wrong: 0.6 fails → one setting of two.
    assert umbrella_score(("0", wrong_share(0.2)), ("5", wrong_share(0.3))) == 0.5
    # Only the first 10,000 episodes count; a run that stopped early is scored over the episodes it ran.
    assert umbrella_score(("0", wrong_share(0.0) + [-1.0] * 5_000)) == 1.0
    assert umbrella_score(("0", wrong_share(0.3, n=100))) == 0.0


def test_discounting_chain_scores_the_average_return_against_the_bonus_chain() -> None:
    def scored(returns: list[float]) -> float:
        frame = bsuite_study.bsuite_frame(episodes([0.0] * len(returns), 100, returns), "discounting_chain", "0")
        return bsuite_study.score("discounting_chain", [frame])

    assert scored([1.1] * 1_000) == pytest.approx(1.0)  # the bonus chain every time
    assert scored([1.0] * 1_000) == pytest.approx(0.0)  # 1 − 10 · (1.1 − 1.0)
    assert scored([1.1] * 500 + [1.0] * 500) == pytest.approx(0.5)  # average 1.05


def test_memory_scores_the_share_of_settings_wrong_less_than_three_quarters_of_chance() -> None:
    def scored(*settings: tuple[str, list[float]]) -> float:
        frames = [bsuite_study.bsuite_frame(episodes(last, 2), "memory_len", i) for i, last in settings]
        return bsuite_study.score("memory_len", frames)

    assert scored(("0", wrong_share(0.0))) == 1.0
    assert scored(("0", wrong_share(0.5))) == 0.0  # chance: (1/2) / (1/2) = 1 ≥ 0.75
    assert scored(("0", wrong_share(0.3)), ("1", wrong_share(0.4))) == 0.5  # 0.6 passes, 0.8 fails


# ── the study ────────────────────────────────────────────────────────────────────────────────────────────


def test_the_study_runs_bsuites_sweep_with_bsuites_episode_budget() -> None:
    study = credit.plan_study("bsuite:umbrella_length", None)
    assert study.env_id == "bsuite/umbrella_length-v0" and study.horizons == [str(i) for i in range(23)]
    chosen = credit.plan_study("bsuite:discounting_chain", ["0", "4"]).variants()
    assert chosen == {
        "setting0": ["env_kwargs=mapping_seed:0", "total_steps=101000"],  # 1,000 episodes × (100 + 1) steps
        "setting4": ["env_kwargs=mapping_seed:4", "total_steps=101000"],
    }
    umbrella = credit.plan_study("bsuite:umbrella_length", ["22"]).variants()
    assert umbrella["setting22"] == ["env_kwargs=chain_length:100,n_distractor:20", "total_steps=1010000"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--task", "bsuite:umbrella"], "unknown bsuite experiment 'umbrella'; choose one of umbrella_length"),
        (["--task", "bsuite:memory_len", "--horizons", "23"], "indices into bsuite's sweep, 0 to 22"),
        (["--task", "bsuite:memory_len", "--horizons", "1", "x"], "got x"),
        (["--task", "bsuite:memory_len", "--env-kwargs", "memory_length:3"], "pick settings with --horizons"),
    ],
)
def test_bad_bsuite_studies_are_refused_in_one_line_before_any_work(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["credit", *argv, "--algos", "ppo"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not Path("runs").exists()


def test_a_tiny_sweep_runs_and_writes_its_bsuite_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the cells are `python -m lab` processes started here
    argv = ["credit", "--task", "bsuite:umbrella_length", "--horizons", "0", "1", "--algos", "ppo", "grpo"]
    argv += ["--seeds", "1", "--total-steps", "800", "--set", "eval_episodes=2", "--workers", "2", "--name", "tiny"]
    assert main(argv) == 0
    study_dir = tmp_path / "runs" / "bench" / "tiny"
    for name in ("credit.md", "credit.html", "report.md", "plots/credit-score.png", "plots/credit-curves.png"):
        assert (study_dir / name).is_file(), name
    run_dir = study_dir / "bsuite_umbrella_length-v0" / "setting1" / "grpo" / "seed0"
    with open(run_dir / "episodes.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["episode"]) for r in rows] == list(range(1, len(rows) + 1))
    assert {int(r["length"]) for r in rows} == {2} and {float(r["last_reward"]) for r in rows} <= {-1.0, 1.0}
    report = (study_dir / "credit.md").read_text()
    table = [line.split(" | ") for line in report.splitlines() if line.startswith("| umbrella_length/")]
    assert [(row[0], row[2]) for row in table] == [
        ("| umbrella_length/0", "grpo"),
        ("| umbrella_length/0", "ppo"),
        ("| umbrella_length/1", "grpo"),
        ("| umbrella_length/1", "ppo"),
    ]
    assert all(float(row[4]) in (0.0, 1.0) for row in table)  # a setting passes or fails
    assert "set by --total-steps" in report
    assert main(["report", str(study_dir)]) == 0
