"""A wall-clock budget per run (``budget_seconds``, ``--budget-seconds``): a run stops at it, a resumed run
counts its earlier sessions toward it, and PPO, GRPO and sb3-ppo count time the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents import ppo
from envs.errors import BadInput
from lab.cli import main
from tests.conftest import ppo_config, run_training

BUDGET = 1.5  # seconds: far less than the 10⁶ steps asked for take


def summary_of(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.parametrize("algo", ["ppo", "grpo", "sb3-ppo"])
def test_every_algo_stops_at_its_wall_clock_budget_and_is_evaluated(tmp_path: Path, algo: str) -> None:
    run_dir = tmp_path / algo
    assert (
        main(
            [
                "train",
                "--algo",
                algo,
                "--env",
                "CartPole-v1",
                "--total-steps",
                "1000000",
                "--budget-seconds",
                str(BUDGET),
                "--set",
                "eval_episodes=2",
                "--run-dir",
                str(run_dir),
            ]
        )
        == 0
    )
    s = summary_of(run_dir)
    assert s["status"] == "completed" and s["budget_seconds"] == BUDGET
    assert 0 < s["total_steps"] < 1_000_000  # it stopped at the budget, not at total_steps
    assert s["wall_time_s"] >= BUDGET  # the same clock for every algo: the run's own wall time
    assert s["final_eval_episodes"] == 2 and s["final_eval_return_mean"] is not None
    # Asked again, the finished run has nothing left to do: its budget is spent.
    assert main(["train", "--algo", algo, "--env", "CartPole-v1", "--run-dir", str(run_dir), "--resume"]) == 0
    assert summary_of(run_dir)["total_steps"] == s["total_steps"]


def test_a_resumed_run_counts_its_earlier_sessions_toward_the_budget(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = run_training(ppo, ppo_config("CartPole-v1", total_steps=512, eval_episodes=2), run_dir)
    assert first["status"] == "completed"
    earlier = first["wall_time_s"]
    # The same run continued with a budget 1 s beyond the time it has already used: it trains about 1 s more,
    # not the whole budget again.
    cfg = ppo_config("CartPole-v1", total_steps=1_000_000, eval_episodes=2, budget_seconds=earlier + 1.0)
    resumed = run_training(ppo, cfg, run_dir, resume=True)
    assert resumed["status"] == "completed" and 512 < resumed["total_steps"] < 1_000_000
    assert earlier + 1.0 <= resumed["wall_time_s"] < earlier + 1.0 + 30.0


def test_a_budget_must_be_positive() -> None:
    with pytest.raises(BadInput, match="budget_seconds must be positive"):
        ppo_config("CartPole-v1", budget_seconds=0.0)


def test_a_bench_gives_every_run_the_same_budget() -> None:
    from lab import bench
    from lab.cli import grid_sets
    from lab.parser import build_parser

    args = build_parser().parse_args(["bench", "--suite", "quick", "--budget-seconds", "60"])
    grid = bench.plan_grid(args.suite, args.algos, args.envs, args.seeds, args.total_steps, grid_sets(args), None)
    assert all("budget_seconds=60.0" in cell.overrides for cell in grid.cells())
