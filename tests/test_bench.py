"""Benchmark grids: a tiny grid end to end, idempotence, failures, interruption, Ray, bad input."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs.errors import BadInput
from lab import bench
from lab.cli import main
from tests.conftest import REPO, read_csv, wait_for

# Small budgets: PPO's CartPole preset does 256 steps an iteration; GRPO with B = G = 2 at most 4·500 steps.
TINY = ["ppo.eval_episodes=2", "grpo.eval_episodes=2", "grpo.num_groups=2", "grpo.group_size=2",
        "grpo.num_minibatches=2"]


@pytest.fixture(autouse=True)
def _importable_project(monkeypatch: pytest.MonkeyPatch) -> None:
    # The cells are `python -m lab` processes started from the test's scratch directory.
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def tiny_grid(name: str, envs: list[str] | None = None, algos: list[str] | None = None, seeds: int = 2,
              total_steps: int = 2048) -> bench.Grid:  # fmt: skip
    sets = [s for s in TINY if s.split(".")[0] in (algos or ["ppo", "grpo"])]
    return bench.plan_grid(None, algos or ["ppo", "grpo"], envs or ["CartPole-v1"], seeds, total_steps, sets, name)


def test_tiny_grid_reports_and_a_second_invocation_trains_nothing(tmp_path: Path) -> None:
    grid = tiny_grid("tiny")
    bench_dir, outcomes = bench.run_grid(grid, workers=2, backend="local", ray_address=None, root=tmp_path)
    assert sorted((o.cell.algo, o.cell.seed, o.status) for o in outcomes) == [
        ("grpo", 0, "completed"), ("grpo", 1, "completed"), ("ppo", 0, "completed"), ("ppo", 1, "completed")]  # fmt: skip
    rows = read_csv(bench_dir / "summary.csv")
    assert sorted((r["algo"], r["seed"], r["status"]) for r in rows) == [
        ("grpo", "0", "completed"), ("grpo", "1", "completed"), ("ppo", "0", "completed"), ("ppo", "1", "completed")]  # fmt: skip
    report = (bench_dir / "report.md").read_text()
    assert "CartPole-v1" in report and "ppo" in report and "grpo" in report
    assert (bench_dir / "report.html").exists()
    assert list((bench_dir / "plots").glob("*.png")) and list((bench_dir / "plots").glob("*.svg"))
    checkpoint = bench_dir / "CartPole-v1" / "ppo" / "seed0" / "checkpoint.pt"
    before = checkpoint.stat().st_mtime_ns

    started = time.monotonic()
    _, again = bench.run_grid(grid, workers=2, backend="local", ray_address=None, root=tmp_path)
    assert all(o.attempts == 0 for o in again) and len(again) == 4
    assert checkpoint.stat().st_mtime_ns == before
    assert time.monotonic() - started < 30  # only the report is rebuilt


def test_a_crashing_run_is_recorded_retried_once_and_the_others_finish(tmp_path: Path) -> None:
    grid = tiny_grid("crash", envs=["CartPole-v1", "tests.toy_envs:testbed-toy/Crash-v0"], algos=["ppo"], seeds=1)
    bench_dir, outcomes = bench.run_grid(grid, workers=2, backend="local", ray_address=None, root=tmp_path)
    by_env = {o.cell.env_id: o for o in outcomes}
    assert by_env["CartPole-v1"].status == "completed"
    crashed = by_env["tests.toy_envs:testbed-toy/Crash-v0"]
    assert crashed.status == "failed" and crashed.attempts == 2 and "crashed on purpose" in crashed.error
    cell_parent = bench_dir / "tests.toy_envs:testbed-toy_Crash-v0" / "ppo"
    assert (cell_parent / ".seed0.failed1" / "summary.json").exists()  # the first attempt is kept aside
    rows = {r["env_id"]: r for r in read_csv(bench_dir / "summary.csv")}
    assert rows["CartPole-v1"]["status"] == "completed" and rows["tests.toy_envs:testbed-toy/Crash-v0"]["status"] == "failed"


def test_an_interrupted_grid_resumes(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "lab", "bench", "--algos", "ppo", "--envs", "CartPole-v1", "--seeds", "1",
            "--total-steps", "30000", "--set", "ppo.eval_episodes=2", "--workers", "1", "--name", "stop"]  # fmt: skip
    process = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)  # fmt: skip
    progress = tmp_path / "runs" / "bench" / "stop" / "CartPole-v1" / "ppo" / "seed0" / "progress.csv"
    wait_for(progress.exists, timeout_s=90, poll_s=0.2)
    time.sleep(1.0)
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C on a terminal reaches the whole foreground group
    _, err = process.communicate(timeout=90)
    assert process.returncode == 130, err
    run_dir = progress.parent
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and (run_dir / "checkpoint.pt").exists()
    stopped_at = summary["total_steps"]
    assert 0 < stopped_at < 30_000

    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["total_steps"] >= 30_000
    log = (run_dir.parent / "seed0.log").read_text()
    assert "--resume" in log
    with open(run_dir / "progress.csv", newline="") as f:
        steps = [int(r["global_step"]) for r in csv.DictReader(f)]
    assert steps == sorted(set(steps)) and steps[0] == 256


def test_the_same_grid_on_a_local_ray_instance(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    grid = tiny_grid("ray", algos=["ppo"], seeds=2)
    try:
        # Both seeds in one Ray task, one `train --seeds` process; a stack of one is the same task with one cell.
        bench_dir, outcomes = bench.run_grid(grid, workers=2, backend="ray", ray_address=None, root=tmp_path, stack=2)
    finally:
        ray.shutdown()
    assert sorted((o.cell.seed, o.status) for o in outcomes) == [(0, "completed"), (1, "completed")]
    for seed in (0, 1):
        run_dir = bench_dir / "CartPole-v1" / "ppo" / f"seed{seed}"
        assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
        assert (run_dir / "checkpoint.pt").exists() and (run_dir.parent / f"seed{seed}.log").exists()
        assert "--seeds 0,1" in (run_dir.parent / f"seed{seed}.log").read_text()
    assert len(read_csv(bench_dir / "summary.csv")) == 2


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--algos", "ppo", "trpo", "--envs", "CartPole-v1"], "unknown algo trpo"),
        (["--algos", "ppo", "--envs", "CartPol-v1"], "Closest registered ids: CartPole-v1"),
        (["--suite", "everything"], "unknown suite 'everything'"),
        (["--suite", "quick", "--seeds", "0"], "--seeds must be at least 1"),
        (["--suite", "quick", "--first-seed", "-1"], "--first-seed must leave every seed in [0, 2**32 - 1]"),
        (["--suite", "quick", "--set", "ppo.gamma=2"], "gamma must be in [0, 1]"),
        (["--suite", "quick", "--set", "trpo.gamma=0.9"], "ALGO.key=value (ALGO one of"),
        (["--suite", "quick", "--set", "gamma=2"], "gamma must be in [0, 1]"),  # key=value: every algo
        (["--suite", "quick", "--backend", "ray", "--ray-address", "127.0.0.1:1"], "cannot reach a Ray cluster"),
    ],
)
def test_bad_input_is_refused_before_any_run(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_bench_keeps_its_settings(tmp_path: Path) -> None:
    grid = tiny_grid("fixed", algos=["ppo"], seeds=1)
    bench.write_bench_yaml(tmp_path / "fixed", grid)
    with pytest.raises(BadInput, match="another --name"):
        bench.check_bench_dir(tmp_path / "fixed", tiny_grid("fixed", algos=["ppo"], seeds=1, total_steps=4096))


def test_suites_are_defined_as_documented() -> None:
    assert bench.SUITES["quick"].envs == ("CartPole-v1",) and bench.SUITES["quick"].seeds == 3
    assert set(bench.SUITES["quick"].algos) == {"ppo", "grpo", "sb3-ppo"}
    assert {"HalfCheetah-v5", "Hopper-v5", "Walker2d-v5"} <= set(bench.SUITES["mujoco"].envs)
