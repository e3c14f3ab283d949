"""What ``testbed train`` prints at its end: one line a seed (final eval return, steps, wall time, run folder),
and with ``--seeds`` the mean ± std over seeds; the whole summary stays in each run's summary.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lab.cli import main

TRAIN = ["train", "--algo", "ppo", "--env", "CartPole-v1", "--set", "eval_episodes=3"]


def summary_of(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def expected_seed_line(s: dict[str, Any]) -> str:
    return (
        f"seed {s['seed']}: final eval return {s['final_eval_return_mean']:.2f} ± {s['final_eval_return_std']:.2f} "
        f"(3 episodes), {s['total_steps']:,} steps, {s['wall_time_s']:.1f} s"
    )


def test_seeds_end_with_a_line_each_and_the_mean_over_seeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parent = tmp_path / "stack"
    assert main([*TRAIN, "--seeds", "2", "--total-steps", "512", "--run-dir", str(parent)]) == 0
    out = capsys.readouterr().out.splitlines()
    first, second = summary_of(parent / "seed0"), summary_of(parent / "seed1")
    assert (first["seed"], second["seed"], first["total_steps"]) == (0, 1, 512)
    a, b = first["final_eval_return_mean"], second["final_eval_return_mean"]
    # By hand: the mean of two numbers and their population std, half their distance.
    mean, std = (a + b) / 2, abs(a - b) / 2
    assert out[-4:] == [
        f"{expected_seed_line(first)}, {parent / 'seed0'}",
        f"{expected_seed_line(second)}, {parent / 'seed1'}",
        f"mean ± std over 2 seeds: {mean:.2f} ± {std:.2f}",
        f"every seed's summary.json is in its folder; TensorBoard: tensorboard --logdir {parent}",
    ]
    assert not any(line.strip() in ("{", "[", "}", "]") or '"algo":' in line for line in out), "no JSON on the console"


def test_one_seed_ends_with_one_line_and_its_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    assert main([*TRAIN, "--seed", "3", "--total-steps", "256", "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    summary = summary_of(run_dir)
    assert summary["seed"] == 3 and summary["status"] == "completed"
    assert out[-2:] == [
        expected_seed_line(summary),
        f"run folder: {run_dir} (summary.json, progress.csv, checkpoint; TensorBoard: tensorboard --logdir {run_dir})",
    ]
