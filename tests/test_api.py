"""``lab.api``: the testbed from Python, through the command line's own parser, planners and lifecycle; the user's own
env factories (``envs.custom``), sent by value to a bench's trainers (``lab.factories``); callbacks; and the page
docs/python-api.md, whose every block runs here."""

from __future__ import annotations

import csv
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from envs import custom
from envs.errors import BadInput
from lab import api
from tests.conftest import REPO
from tests.test_cli import run_testbed

DOCS_PAGE = REPO / "docs" / "python-api.md"
DOC_STEPS = "2_048"
"""The budget the page's blocks run at here, in place of their 20_000: the same calls, in seconds."""
FAST = {"eval_episodes": 2}
"""Few evaluation episodes: the tests check what happens, not how well."""


def cartpole(run_dir: Path, **options: Any) -> api.Run:
    """PPO on CartPole for 1024 steps, evaluated at 512, in ``run_dir``."""
    overrides = {"eval_interval": 512, **FAST, **options.pop("overrides", {})}
    return api.train("ppo", "CartPole-v1", seed=1, total_steps=1024, run_dir=run_dir, overrides=overrides, **options)


def progress(run_dir: Path) -> list[dict[str, str]]:
    """progress.csv's rows without what depends on the clock."""
    with open(run_dir / "progress.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return [{k: v for k, v in row.items() if k not in ("wall_time_s", "charts/SPS")} for row in rows]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]


def make_seedless() -> gym.Env:
    """An env whose ``reset`` takes no seed: PPO trains it, GRPO refuses it."""
    return gym.wrappers.TimeLimit(SeedlessCorridor(), max_episode_steps=20)


class SeedlessCorridor(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self) -> tuple[np.ndarray, dict[str, Any]]:  # type: ignore[override]
        return self.np_random.random(1).astype(np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return np.zeros(1, np.float32), float(action), False, False, {}


# ── the page's example, and the issue's ─────────────────────────────────────────────────────────────


def test_every_block_of_the_python_page_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/python-api.md's blocks, in order, in one namespace, at small budgets: a block titled ``NAME.py`` is
    written to that file (a module of the reader's), every other ``python`` block is run."""
    text = DOCS_PAGE.read_text()
    blocks = re.findall(r'^```python( title="([\w.]+)")?\n(.*?)^```$', text, re.DOTALL | re.MULTILINE)
    assert len(blocks) >= 5 and "20_000" in text
    namespace: dict[str, Any] = {"__name__": "__main__"}  # a notebook's or a script's: its functions import nowhere
    sys.path.insert(0, str(Path.cwd()))  # as `python script.py` in this folder would find myenvs.py
    try:
        for _, title, code in blocks:
            if title:
                Path(title).write_text(code)
                continue
            exec(compile(code.replace("20_000", DOC_STEPS), str(DOCS_PAGE), "exec"), namespace)  # our own page
    finally:
        sys.path.remove(str(Path.cwd()))
        sys.modules.pop("myenvs", None)
    out = capsys.readouterr().out
    run, bench, policy = namespace["run"], namespace["bench"], namespace["policy"]
    # The example: a summary, curves as a DataFrame, a bench of a factory env, a policy that acts.
    assert run.summary["status"] == "completed" and len(run.curves) == 8 and "eval/return_mean" in run.curves
    assert namespace["env"].action_space.contains(int(namespace["action"]))
    assert list(bench.summary.algo) == ["grpo", "grpo", "ppo", "ppo"]
    assert set(bench.summary.status) == {"completed"} and set(bench.summary.env) == {"factory/make_env"}
    assert (bench.path / "factory_make_env" / "grpo" / "seed1" / "checkpoint.pt").exists()  # trained in a trainer
    assert "report.md" in bench.reports and len(bench.curves) >= 4
    assert policy(np.zeros((3, 4), np.float32)).shape == (3,)  # a batch of observations
    # Custom envs under each of their names; the callback's row numbers; the CLI's message.
    assert namespace["by_object"].config["env_id"] == "myenvs:make_corridor"
    assert namespace["by_id"].summary["status"] == namespace["by_path"].summary["status"] == "completed"
    assert namespace["finished"].summary["status"] == "completed"
    assert "unknown config key 'learning_rat'" in out


# ── one path: the command line's numbers and its errors ──────────────────────────────────────────────


def test_api_train_and_testbed_train_give_the_same_numbers(tmp_path: Path) -> None:
    run = cartpole(tmp_path / "api", overrides={"learning_rate": 1e-3, "hidden_sizes": (32, 32)})
    argv = shlex.split(run.command or "")
    assert argv[:2] == ["testbed", "train"] and "learning_rate=0.001" in argv and "hidden_sizes=32,32" in argv
    argv[argv.index("--run-dir") + 1] = str(tmp_path / "cli")
    done = run_testbed(*argv[1:])
    assert done.returncode == 0, done.stderr
    assert progress(tmp_path / "api") == progress(tmp_path / "cli")
    ours, theirs = weights(tmp_path / "api"), weights(tmp_path / "cli")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert api.load(tmp_path / "cli").config == run.config


@pytest.mark.parametrize(
    ("call", "argv"),
    [
        (lambda: api.train("ppo", "CartPol-v1"), ["--algo", "ppo", "--env", "CartPol-v1"]),
        (lambda: api.train("ppo2", "CartPole-v1"), ["--algo", "ppo2", "--env", "CartPole-v1"]),
        (
            lambda: api.train("ppo", "CartPole-v1", overrides={"learning_rate": -1.0}),
            ["--algo", "ppo", "--env", "CartPole-v1", "--set", "learning_rate=-1.0"],
        ),
        (
            lambda: api.train("ppo", "CartPole-v1", total_steps=-5),
            ["--algo", "ppo", "--env", "CartPole-v1", "--total-steps", "-5"],
        ),
    ],
)
def test_bad_input_raises_the_command_lines_line_before_anything_is_written(call: Any, argv: list[str]) -> None:
    with pytest.raises(BadInput) as raised:
        call()
    assert not Path("runs").exists()
    done = run_testbed("train", *argv)
    assert done.returncode == 2 and done.stderr == f"testbed train: error: {raised.value}\n"


def test_a_factory_that_makes_no_env_is_refused_in_one_line() -> None:
    def make_number() -> int:
        return 3

    with pytest.raises(BadInput, match=r"^the env factory .*make_number returned a int, not a gymnasium Env; ") as r:
        api.train("ppo", make_number)
    assert "\n" not in str(r.value) and not Path("runs").exists()
    with pytest.raises(BadInput, match="returned a vector env"):
        api.train("ppo", lambda: gym.make_vec("CartPole-v1", num_envs=2))


def test_grpo_refuses_an_env_whose_reset_takes_no_seed_and_ppo_trains_it(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as refused:
        api.train("grpo", make_seedless, total_steps=512)
    assert str(refused.value).startswith(f"{custom.factory_id(make_seedless)}'s reset takes no seed")
    assert "\n" not in str(refused.value) and not Path("runs").exists()
    run = api.train("ppo", make_seedless, total_steps=512, run_dir=tmp_path / "run", overrides={"n_steps": 64, **FAST})
    assert run.summary["status"] == "completed"


@pytest.mark.parametrize("algo", ["a2c", "sb3-ppo"])
def test_a_factory_env_trains_with_the_other_algorithms(algo: str, tmp_path: Path) -> None:
    def make_pendulum() -> gym.Env:
        return gym.make("Pendulum-v1")

    overrides = {"n_steps": 64, **FAST} if algo == "sb3-ppo" else FAST
    run = api.train(algo, make_pendulum, total_steps=256, run_dir=tmp_path / algo, overrides=overrides)
    assert run.summary["status"] == "completed" and run.config["env_id"] == "factory/make_pendulum"
    action = run.policy()(np.zeros(3, np.float32))
    assert action.shape == (1,) and -2.0 <= action[0] <= 2.0  # clipped to the action space


# ── callbacks ─────────────────────────────────────────────────────────────────────────────────────────


def test_a_callback_stops_the_run_which_resumes_to_the_same_numbers(tmp_path: Path) -> None:
    seen: list[tuple[int, dict[str, float]]] = []

    def stop_at_512(step: int, metrics: dict[str, float]) -> bool:
        seen.append((step, metrics))
        return step < 512

    stopped = cartpole(tmp_path / "stopped", callback=stop_at_512)
    assert stopped.summary["status"] == "interrupted" and [s for s, _ in seen] == [256, 512]
    assert "losses/policy_loss" in seen[0][1] and "eval/return_mean" in seen[1][1]  # the logged rows
    resumed = api.train("ppo", "CartPole-v1", run_dir=tmp_path / "stopped", resume=True)
    whole = cartpole(tmp_path / "whole")
    assert resumed.summary["status"] == whole.summary["status"] == "completed"
    assert progress(tmp_path / "stopped") == progress(tmp_path / "whole")
    ours, theirs = weights(tmp_path / "stopped"), weights(tmp_path / "whole")
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.parametrize("algo", ["a2c", "grpo", "sb3-ppo"])
def test_every_algorithm_stops_on_request(algo: str, tmp_path: Path) -> None:
    steps: list[int] = []

    def stop_at_once(step: int, metrics: dict[str, float]) -> None:
        steps.append(step)
        api.request_stop()

    run_dir = tmp_path / algo
    run = api.train(algo, "CartPole-v1", total_steps=100_000, run_dir=run_dir, overrides=FAST, callback=stop_at_once)
    assert run.summary["status"] == "interrupted" and len(steps) == 1
    assert (tmp_path / algo / "checkpoint.pt").exists()


# ── factories: by import path, by value, and where neither reaches ───────────────────────────────────


def test_an_importable_factory_is_recorded_by_its_path_and_evaluated_only_when_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests import toy_envs

    monkeypatch.setenv("PYTHONPATH", str(REPO))  # as a trainer of this folder would see the repository
    run = api.train("ppo", toy_envs.make_two_arms, total_steps=256, run_dir=tmp_path / "run", overrides=FAST)
    assert run.config["env_id"] == "tests.toy_envs:make_two_arms"
    refused = run_testbed("eval", str(tmp_path / "run"))
    assert refused.returncode == 2 and "--trust-env-module" in refused.stderr
    trusted = run_testbed("eval", str(tmp_path / "run"), "--episodes", "2", "--trust-env-module")
    assert trusted.returncode == 0, trusted.stderr
    assert api.evaluate(run, episodes=2).returns.shape == (2,)


def test_a_factory_only_this_process_holds_is_refused_elsewhere_in_one_line(tmp_path: Path) -> None:
    def make_local() -> gym.Env:
        return gym.make("CartPole-v1")

    run = api.train("ppo", make_local, total_steps=256, run_dir=tmp_path / "run", overrides=FAST)
    assert run.config["env_id"] == "factory/make_local"
    elsewhere = run_testbed("eval", str(tmp_path / "run"))
    assert elsewhere.returncode == 2 and elsewhere.stderr.count("\n") == 1
    assert "factory/make_local was made by an env factory that no other process can import" in elsewhere.stderr
    policy = api.load(tmp_path / "run", env=make_local).policy()  # here, given the factory again
    assert policy(np.zeros(4, np.float32)) in (0, 1)
    with pytest.raises(BadInput, match="was trained on factory/make_local, not on CartPole-v1"):
        api.load(tmp_path / "run", env="CartPole-v1")


def test_two_factories_of_one_name_are_refused_in_a_bench() -> None:
    envs = [lambda: gym.make("CartPole-v1"), lambda: gym.make("Acrobot-v1")]
    with pytest.raises(BadInput, match=r"^two env factories in envs share the id factory/lambda \(their name\)"):
        api.bench(algos=["ppo"], envs=envs, seeds=1, name="twins")
    assert not Path("runs").exists()


def test_a_result_loads_as_dataframes() -> None:
    result = api.load_result("equal-time-hopper")
    assert len(result.runs) == len(result.summary) and not result.curves.empty
    assert {"algo", "env", "seed", "final_return"} <= set(result.summary.columns)
    assert not result.runs[0].curves.empty  # the kept progress.csv.gz


def test_a_trainer_reads_its_factories_from_standard_input(tmp_path: Path) -> None:
    """The child's side of lab.factories, as a bench's trainer runs it."""
    import cloudpickle

    def make_here() -> gym.Env:
        return gym.make("CartPole-v1")

    payload = cloudpickle.dumps({"factory/make_here": make_here})
    env = {"PYTHONPATH": str(REPO), "TESTBED_ENV_FACTORIES_ON_STDIN": "1", "PATH": "/usr/bin:/bin"}
    argv = ["train", "--algo", "ppo", "--env", "factory/make_here", "--total-steps", "256", "--set", "eval_episodes=1"]
    done = subprocess.run(
        [sys.executable, "-m", "lab", *argv, "--run-dir", str(tmp_path / "run")],
        input=payload,
        capture_output=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert api.load(tmp_path / "run").summary["status"] == "completed"
