"""`testbed credit`: planning a study, a tiny sweep end to end, env labels, and the env options that
every command takes (env kwargs, reward delay) reaching each agent's envs."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from agents import sb3
from agents.config import resolve_config
from agents.ppo import PPOConfig
from agents.run_envs import open_envs
from envs import EnvOptions
from envs.errors import BadInput
from lab import bench, credit
from lab.cli import main
from lab.results import env_label
from tests.conftest import REPO


def test_a_task_sweeps_its_horizon_and_a_delayed_env_its_reward_delay() -> None:
    chain = credit.plan_study("chain", ["10", "300"], ["distractor_scale:0.1"])
    assert chain.env_id == "testbed/Chain-v0" and chain.axis == "horizon"
    assert chain.variants() == {
        "horizon10": ["env_kwargs=distractor_scale:0.1,horizon:10"],
        "horizon300": ["env_kwargs=distractor_scale:0.1,horizon:300"],
    }
    delayed = credit.plan_study("delayed:HalfCheetah-v5", None)
    assert delayed.axis == "reward_delay" and delayed.horizons == ["1", "20", "100", "end"]
    assert delayed.variants()["delayend"] == ["reward_delay=end"]


@pytest.mark.parametrize(
    "task,horizons,message",
    [
        ("umbrella", None, "unknown --task 'umbrella'; choose chain, keydoor or delayed:ENV_ID"),
        ("chain", ["0"], "episode lengths (integers >= 1)"),
        ("keydoor", ["end"], "episode lengths (integers >= 1)"),
        ("delayed:HalfCheetah-v5", ["-3"], "reward delays (integers >= 1, or end)"),
        ("delayed:HalfCheeta-v5", None, "Closest registered ids: HalfCheetah-v5"),
    ],
)
def test_bad_studies_are_refused(task: str, horizons: list[str] | None, message: str) -> None:
    with pytest.raises(BadInput, match=message.replace("(", "\\(").replace(")", "\\)")):
        credit.plan_study(task, horizons)


def test_env_labels_keep_horizons_and_delays_apart() -> None:
    assert env_label({"env_id": "CartPole-v1"}) == "CartPole-v1"
    assert env_label({"env_id": "HalfCheetah-v5", "reward_delay": "end", "env_kwargs": {}}) == (
        "HalfCheetah-v5[reward_delay=end]"
    )
    config = {"env_id": "testbed/Chain-v0", "env_kwargs": {"horizon": 30, "distractor_scale": 0.1}}
    assert env_label(config) == "testbed/Chain-v0[distractor_scale=0.1,horizon=30]"


def test_plain_key_value_sets_apply_to_every_algo() -> None:
    grid = bench.plan_grid(
        None, ["ppo", "grpo"], ["testbed/Chain-v0"], 1, None, ["reward_delay=5", "ppo.ent_coef=0.0"], "t"
    )
    assert grid.overrides == {"ppo": ["reward_delay=5", "ent_coef=0.0"], "grpo": ["reward_delay=5"]}


def test_the_env_options_reach_the_training_and_evaluation_envs() -> None:
    cfg, _ = resolve_config(
        PPOConfig,
        "ppo",
        "testbed/Chain-v0",
        False,
        {"env_kwargs": "horizon:6", "reward_delay": "3", "eval_episodes": 2},
    )
    envs = open_envs(cfg, 2, EnvOptions(gamma=1.0, reward_delay=cfg.reward_delay))
    # Training: 6-step episodes with the rewards of steps 0–2 released at step 2 and the rest at step 5
    # (three distractors of ±0.05 never sum to 0).
    envs.train.reset(seed=0)
    rewards = np.array([envs.train.step(np.zeros(2, dtype=np.int64))[1] for _ in range(6)])  # (6, 2)
    assert np.all(rewards[[0, 1, 3, 4]] == 0) and np.all(rewards[[2, 5]] != 0)
    # Evaluation: the same horizon, no delay, and no distractors (the task preset's eval_env_kwargs).
    envs.eval.reset(seed=[0, 1])
    eval_rewards = np.array([envs.eval.step(np.zeros(2, dtype=np.int64))[1] for _ in range(6)])
    assert np.all(eval_rewards[:5] == 0) and np.all(np.abs(eval_rewards[5]) == 1)
    envs.close()
    # sb3-ppo's own VecEnv gets the same kwargs and delay.
    env = sb3.make_sb3_env(cfg)
    env.reset()
    sb3_rewards = np.array([env.step(np.zeros(cfg.n_envs, dtype=np.int64))[1] for _ in range(6)])
    assert np.all(sb3_rewards[[0, 1, 3, 4]] == 0) and np.all(sb3_rewards[[2, 5]] != 0)
    env.close()


def test_a_tiny_sweep_writes_its_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the cells are `python -m lab` processes started here
    argv = [
        "credit",
        "--task",
        "chain",
        "--horizons",
        "4",
        "8",
        "--algos",
        "ppo",
        "grpo",
        "--seeds",
        "1",
        "--total-steps",
        "3000",
        "--set",
        "eval_interval=1000",
        "--set",
        "eval_episodes=4",
        "--workers",
        "2",
        "--name",
        "tiny",
    ]
    assert main(argv) == 0
    study_dir = tmp_path / "runs" / "bench" / "tiny"
    for name in (
        "credit.md",
        "credit.html",
        "report.md",
        "summary.csv",
        "plots/credit-score.png",
        "plots/credit-steps-to-solve.png",
        "plots/credit-curves.png",
    ):
        assert (study_dir / name).is_file(), name
    report = (study_dir / "credit.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith(("| 4 |", "| 8 |"))]
    assert [row.split(" | ")[:2] for row in rows] == [["| 4", "grpo"], ["| 4", "ppo"], ["| 8", "grpo"], ["| 8", "ppo"]]
    with open(study_dir / "summary.csv", newline="") as f:
        envs = sorted({row["env_id"] for row in csv.DictReader(f)})
    assert envs == ["testbed/Chain-v0[horizon=4]", "testbed/Chain-v0[horizon=8]"]
    assert (study_dir / "testbed_Chain-v0" / "horizon8" / "grpo" / "seed0" / "summary.json").is_file()
    # Rerunning trains nothing, and `testbed report` rebuilds the study's report as well.
    (study_dir / "credit.md").unlink()
    assert main(argv) == 0
    assert main(["report", str(study_dir)]) == 0 and (study_dir / "credit.md").is_file()
