"""Every registered algorithm through the guarantees the lifecycle gives (``agents/registry.py``,
``agents/training.py``).

The algorithms come from the registry, so one added later is covered without a line here:

- (a) seed k alone equals seed k in a stack of two: bit-identical progress.csv (but its wall-clock columns) and
  parameters, for every algo that trains seeds side by side;
- (b) a run interrupted and resumed from its checkpoint equals a straight run, for every algo but the SB3
  references, whose resume is not exact by design (``agents/sb3.py``);
- (c) ``testbed eval`` loads a run's checkpoint and plays it;
- (d) a bad config value is refused in one line, before anything is written;
- (e) a seed gives the same numbers whichever command trains it: ``testbed train``, a bench (beside another
  seed), a credit study and a tuning trial at the preset's values.

A reference implementation takes the presets of the algo it mirrors (``sb3-ppo``: ``ppo``), which is how the
registry tells one. Runs are CartPole-v1 at each preset with a budget of about a thousand env steps, no periodic
evaluation, each through the command line in this process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agents import registry, runlog
from lab.cli import main
from tests.conftest import REPO, interrupt_after, read_progress

DECLARED = [name for name, entry in registry.entries().items() if entry.base == name]  # variants left out
REFERENCES = [name for name in DECLARED if registry.preset_of(name) != name]
STACKED = [name for name in DECLARED if registry.get(name).train_stack is not None]
# A budget and settings that keep each run to a few seconds; an algo without an entry trains at its preset.
SMALL: dict[str, list[str]] = {
    "grpo": ["group_size=4", "num_groups=2", "num_minibatches=2", "n_epochs=2", "max_episode_steps=60"],
}
TOTAL_STEPS = 1024


def small(algo: str) -> list[str]:
    """The ``--set`` arguments that keep a run of ``algo`` to a few seconds: no periodic evaluation."""
    settings = ["eval_interval=0", "eval_episodes=2", *SMALL.get(registry.preset_of(algo), [])]
    return [arg for setting in settings for arg in ("--set", setting)]


def train_argv(algo: str, run_dir: Path, *more: str, env: str = "CartPole-v1") -> list[str]:
    """``testbed train`` of ``algo`` on ``env`` at its preset, small, into ``run_dir``."""
    steps = ["--total-steps", str(TOTAL_STEPS)]
    return ["train", "--algo", algo, "--env", env, *steps, *small(algo), "--run-dir", str(run_dir), *more]


def rows_but_wall_clock(run_dir: Path) -> list[dict[str, str]]:
    """progress.csv without what the clock measures (wall time, steps a second, timings)."""
    rows = read_progress(run_dir)
    assert rows, f"{run_dir} has no progress rows"
    return [{k: v for k, v in row.items() if "time" not in k and "SPS" not in k} for row in rows]


def parameters(run_dir: Path) -> dict[str, torch.Tensor]:
    return runlog.load_checkpoint(run_dir, {})["model"]


def assert_same_run(a: Path, b: Path) -> None:
    assert rows_but_wall_clock(a) == rows_but_wall_clock(b)
    first, second = parameters(a), parameters(b)
    assert first.keys() == second.keys() and all(torch.equal(v, second[k]) for k, v in first.items())


def test_the_registry_lists_every_algorithm_and_its_references() -> None:
    assert {"ppo", "grpo", "a2c", "sb3-ppo", "sb3-a2c"} <= set(DECLARED)
    assert set(REFERENCES) == {"sb3-ppo", "sb3-a2c"} and {"ppo", "grpo", "a2c"} <= set(STACKED)


@pytest.mark.parametrize("algo", STACKED)
def test_a_seed_alone_equals_the_same_seed_in_a_stack(tmp_path: Path, algo: str) -> None:
    assert main(train_argv(algo, tmp_path / "stack", "--seeds", "0,1")) == 0
    assert main(train_argv(algo, tmp_path / "alone", "--seed", "1")) == 0
    assert_same_run(tmp_path / "stack" / "seed1", tmp_path / "alone")
    assert rows_but_wall_clock(tmp_path / "stack" / "seed0") != rows_but_wall_clock(tmp_path / "alone")


def test_a_seed_alone_equals_the_same_seed_in_a_stack_with_one_env_per_seed(tmp_path: Path) -> None:
    # One env per seed (PPO's MuJoCo presets) makes every action a matrix-vector product, whose rounding depends on
    # where the matrix lies in memory: seed 1's row of the stack must start as a stack of one's does.
    one_env = ("--set", "n_envs=1", "--set", "n_steps=256")
    assert main(train_argv("ppo", tmp_path / "stack", *one_env, "--seeds", "0,1")) == 0
    assert main(train_argv("ppo", tmp_path / "alone", *one_env, "--seed", "1")) == 0
    assert_same_run(tmp_path / "stack" / "seed1", tmp_path / "alone")


@pytest.mark.parametrize("algo", [name for name in DECLARED if name not in REFERENCES])
def test_a_resumed_run_equals_a_straight_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algo: str) -> None:
    assert main(train_argv(algo, tmp_path / "straight")) == 0
    with monkeypatch.context() as patch:
        # Ctrl-C in the third iteration (the lifecycle checks each iteration's losses once per seed): the run
        # checkpoints after it and stops.
        interrupt_after(patch, runlog, "check_finite", 3)
        assert main(train_argv(algo, tmp_path / "resumed")) == 130  # interrupted
    assert runlog.load_checkpoint(tmp_path / "resumed", {})["global_step"] < TOTAL_STEPS
    assert main(train_argv(algo, tmp_path / "resumed", "--resume")) == 0
    assert_same_run(tmp_path / "straight", tmp_path / "resumed")


@pytest.mark.parametrize("algo", DECLARED)
def test_eval_loads_the_checkpoint_and_plays(tmp_path: Path, capsys: pytest.CaptureFixture[str], algo: str) -> None:
    assert main(train_argv(algo, tmp_path / "run")) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--episodes", "2"]) == 0
    assert "return" in capsys.readouterr().out


@pytest.mark.parametrize("algo", DECLARED)
@pytest.mark.parametrize(
    "setting,message",
    [
        ("gamma=1.5", "gamma must be in [0, 1]"),
        ("learning_rate=-1", "learning_rate must be positive"),
        ("no_such_key=1", "no_such_key"),
    ],
)
def test_a_bad_config_value_is_refused_in_one_line_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], algo: str, setting: str, message: str
) -> None:
    run_dir = tmp_path / "run"
    assert main(train_argv(algo, run_dir, "--set", setting)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("algo", [name for name in DECLARED if name not in REFERENCES])
def test_a_seed_gives_the_same_numbers_whichever_command_trains_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algo: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # a bench's cells are `python -m lab` processes started here
    budget = ["--total-steps", str(TOTAL_STEPS), *small(algo), "--workers", "1"]
    assert main(train_argv(algo, tmp_path / "alone", "--seed", "1")) == 0
    # A bench trains seed 1 beside seed 0, in one process where the algo stacks seeds.
    assert main(["bench", "--algos", algo, "--envs", "CartPole-v1", "--seeds", "2", *budget, "--name", "b"]) == 0
    assert_same_run(tmp_path / "alone", tmp_path / f"runs/bench/b/CartPole-v1/{algo}/seed1")
    # A tuning study's first trial trains at the preset's values of the keys its space searches (one here, that
    # leaves the iteration's size, to which a study rounds its budget, as the preset's).
    (tmp_path / "space.yaml").write_text("gamma: {low: 0.8, high: 0.9999}\n")
    tune = ["tune", "--algo", algo, "--env", "CartPole-v1", "--trials", "1", "--seeds", "1", "--first-seed", "1"]
    assert main([*tune, *budget, "--space", "space.yaml", "--name", "t"]) == 0
    (trial,) = (tmp_path / "runs/tune/t").glob(f"trial*/CartPole-v1/{algo}/seed1")
    assert_same_run(tmp_path / "alone", trial)
    # A credit study's cell is the run `testbed train` makes on the task's env with the horizon's kwargs.
    credit = ["credit", "--task", "chain", "--horizons", "4", "--algos", algo, "--seeds", "1"]
    assert main([*credit, *budget, "--name", "c"]) == 0
    chain = ["--seed", "0", "--set", "env_kwargs=horizon:4"]
    assert main(train_argv(algo, tmp_path / "chain", *chain, env="testbed/Chain-v0")) == 0
    (cell,) = (tmp_path / "runs/bench/c").glob(f"*/horizon4/{algo}/seed0")
    assert_same_run(tmp_path / "chain", cell)
