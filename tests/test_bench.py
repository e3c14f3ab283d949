"""Benchmark grids: a tiny grid end to end, idempotence, failures, interruption, Ray, bad input."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agents import rundir
from agents.runlog import Progress
from envs.errors import BadInput
from lab import bench, normalized, published, report
from lab.board import Board
from lab.cells import Cell, Outcome, Stop, live_progress
from lab.cli import main
from tests.conftest import REPO, read_csv, wait_for

# Small budgets: PPO's CartPole preset does 256 steps an iteration; GRPO with B = G = 2 at most 4·500 steps.
TINY = [
    "ppo.eval_episodes=2",
    "grpo.eval_episodes=2",
    "grpo.num_groups=2",
    "grpo.group_size=2",
    "grpo.num_minibatches=2",
]


@pytest.fixture(autouse=True)
def _importable_project(monkeypatch: pytest.MonkeyPatch) -> None:
    # The cells are `python -m lab` processes started from the test's scratch directory.
    monkeypatch.setenv("PYTHONPATH", str(REPO))


HEARTBEAT = re.compile(
    r"^\[\S+\] (?P<where>processes \d+/\d+|Ray tasks \d+) · runs (?P<running>\d+) running, "
    r"(?P<done>\d+)/(?P<total>\d+) done(?: \(\d+ failed\))? · (?P<rate>[\d,]+ steps/s|steps/s n/a) · "
    r"ETA (?P<eta>\S+)$",
    re.MULTILINE,
)
"""A heartbeat line of a bench's board, as printed where stdout is not a terminal."""


def tiny_grid(
    name: str, envs: list[str] | None = None, algos: list[str] | None = None, seeds: int = 2, total_steps: int = 2048
) -> bench.Grid:
    sets = [s for s in TINY if s.split(".")[0] in (algos or ["ppo", "grpo"])]
    return bench.plan_grid(None, algos or ["ppo", "grpo"], envs or ["CartPole-v1"], seeds, total_steps, sets, name)


def test_tiny_grid_reports_and_a_second_invocation_trains_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = tiny_grid("tiny")
    bench_dir, outcomes = bench.run_grid(grid, workers=2, backend="local", ray_address=None, root=tmp_path)
    assert sorted((o.cell.algo, o.cell.seed, o.status) for o in outcomes) == [
        ("grpo", 0, "completed"),
        ("grpo", 1, "completed"),
        ("ppo", 0, "completed"),
        ("ppo", 1, "completed"),
    ]
    rows = read_csv(bench_dir / "summary.csv")
    assert sorted((r["algo"], r["seed"], r["status"]) for r in rows) == [
        ("grpo", "0", "completed"),
        ("grpo", "1", "completed"),
        ("ppo", "0", "completed"),
        ("ppo", "1", "completed"),
    ]
    report = (bench_dir / "report.md").read_text()
    assert "CartPole-v1" in report and "ppo" in report and "grpo" in report
    assert (bench_dir / "report.html").exists()
    assert list((bench_dir / "plots").glob("*.png")) and not list((bench_dir / "plots").glob("*.svg"))
    checkpoint = bench_dir / "CartPole-v1" / "ppo" / "seed0" / "checkpoint.pt"
    before = checkpoint.stat().st_mtime_ns

    built = (bench_dir / "report.md").stat().st_mtime_ns

    started = time.monotonic()
    capsys.readouterr()
    _, again = bench.run_grid(grid, workers=2, backend="local", ray_address=None, root=tmp_path)
    assert all(o.attempts == 0 for o in again) and len(again) == 4
    out = capsys.readouterr().out
    assert out.count("skipped (done)") == 4 and "started " not in out  # no process starts for a done stack
    assert checkpoint.stat().st_mtime_ns == before
    # Nothing trained and the report's inputs are unchanged: it is kept as it was, and the rerun takes seconds.
    assert "the report is up to date" in out and "building the report" not in out
    assert (bench_dir / "report.md").stat().st_mtime_ns == built
    assert time.monotonic() - started < 10
    # The invocation that trained nothing is not recorded: bench.yaml keeps the invocations the report counts.
    invocations = yaml.safe_load((bench_dir / "bench.yaml").read_text())["invocations"]
    assert len(invocations) == 1 and "in 1 invocation of `testbed bench`" in (bench_dir / "report.md").read_text()

    # A third seed trains a run per algo: the report is built again and sums both invocations.
    bench.run_grid(tiny_grid("tiny", seeds=3), workers=2, backend="local", ray_address=None, root=tmp_path)
    assert "building the report" in capsys.readouterr().out
    invocations = yaml.safe_load((bench_dir / "bench.yaml").read_text())["invocations"]
    assert len(invocations) == 2 and all(i["end"] >= i["start"] and i["workers"] == 2 for i in invocations)
    assert "Wall-clock: " in (report_text := (bench_dir / "report.md").read_text())
    assert "in 2 invocations of `testbed bench`" in report_text and "Runs: 6 (6 completed)" in report_text


def test_a_report_is_built_again_only_when_its_runs_outputs_or_code_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lab import fingerprint
    from tests.test_report import linear_evals, make_run

    bench_dir = tmp_path / "b"
    for seed in (0, 1):
        make_run(bench_dir / "CartPole-v1" / "ppo" / f"seed{seed}", "CartPole-v1", "ppo", seed, linear_evals(3))
    first = bench.build_reports(bench_dir)
    assert "building the report" in capsys.readouterr().out and (bench_dir / fingerprint.FINGERPRINT).exists()
    assert bench.build_reports(bench_dir) == first and "up to date" in capsys.readouterr().out
    summary = bench_dir / "CartPole-v1" / "ppo" / "seed1" / "summary.json"
    summary.write_text(summary.read_text().replace('"sps": 1000.0', '"sps": 900.0'))  # a run's record changed
    bench.build_reports(bench_dir)
    assert "building the report" in capsys.readouterr().out and "| 950 |" in (bench_dir / "report.md").read_text()
    (bench_dir / "plots" / "CartPole-v1-time.png").unlink()  # an output went missing
    bench.build_reports(bench_dir)
    assert "building the report" in capsys.readouterr().out and (bench_dir / "plots" / "CartPole-v1-time.png").exists()
    # The report's code: the modules of lab that report.py and credit.py import, not the command line's.
    code = {path.name for path in fingerprint.report_code()}
    assert {"report.py", "cost.py", "plot.py", "stats.py", "credit.py", "reference_scores.yaml"} <= code
    assert "cli.py" not in code and "tune.py" not in code


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
    assert (
        rows["CartPole-v1"]["status"] == "completed"
        and rows["tests.toy_envs:testbed-toy/Crash-v0"]["status"] == "failed"
    )


def test_a_diverging_run_is_kept_and_neither_retried_nor_trained_again(tmp_path: Path) -> None:
    # On the CPU the same config and seed diverge at the same step again: a retry from scratch would only
    # spend the run's whole budget to fail once more.
    grid = tiny_grid("diverge", envs=["tests.toy_envs:testbed-toy/Diverge-v0"], algos=["ppo"], seeds=1)
    bench_dir, outcomes = bench.run_grid(grid, workers=1, backend="local", ray_address=None, root=tmp_path)
    [diverged] = outcomes
    assert diverged.status == "failed" and diverged.diverged and diverged.attempts == 1
    assert "non-finite" in diverged.error
    cell_parent = bench_dir / "tests.toy_envs:testbed-toy_Diverge-v0" / "ppo"
    assert json.loads((cell_parent / "seed0" / "summary.json").read_text())["diverged"] is True
    assert not list(cell_parent.glob(".seed0.failed*"))
    _, again = bench.run_grid(grid, workers=1, backend="local", ray_address=None, root=tmp_path)
    assert again[0].attempts == 0 and again[0].status == "failed" and "Not rerun" in again[0].error
    assert not list(cell_parent.glob(".seed0.failed*"))


def test_a_bench_beats_with_runs_and_processes_apart_and_says_when_it_builds_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def slow_report(bench_dir: Path) -> dict[str, Path]:  # the report's heartbeat, without building one
        time.sleep(2.5)
        return {}

    monkeypatch.setattr(report, "build_report", slow_report)
    # Two seeds stacked in one process, with room for two: one process, two runs.
    grid = tiny_grid("beat", algos=["ppo"], seeds=2)
    bench.run_grid(grid, workers=2, backend="local", ray_address=None, root=tmp_path, stack=2, heartbeat_s=1.0)
    out = capsys.readouterr().out
    beats = [m.groupdict() for m in HEARTBEAT.finditer(out)]
    assert len(beats) >= 2, out  # the trainer process alone takes seconds to start
    assert {"where": "processes 1/2", "running": "2", "done": "0", "total": "2"}.items() <= beats[0].items()
    for beat in beats:  # never more processes than slots, nor more runs than the grid has
        assert int(beat["where"].split()[1].split("/")[0]) <= 2 and int(beat["running"]) + int(beat["done"]) <= 2
    end = {"where": "processes 0/2", "running": "0", "done": "2", "total": "2", "eta": "0s"}
    assert end.items() <= beats[-1].items()  # the last heartbeat, as the grid ends
    assert "started  CartPole-v1 ppo seeds 0,1" in out
    assert out.index("building the report …") > out.index(next(HEARTBEAT.finditer(out)).group(0))
    assert "building the report …\nbuilding the report … 1s\nbuilding the report … 2s\n" in out


def test_the_heartbeat_reads_each_seeds_latest_progress_line_and_estimates_the_time_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "seed0.log"
    log.write_text("[ppo CartPole-v1 seed 0] step 9000/10000  999 steps/s  recent return 1.0\n")  # an earlier session
    start = log.stat().st_size
    lines = io.StringIO()
    with contextlib.redirect_stdout(lines):  # the progress lines a trainer prints when its output is a file
        seed0 = Progress(10000, 0, "ppo CartPole-v1 seed 0", every_s=0.0)
        seed1 = Progress(10000, 0, "ppo CartPole-v1 seed 1", every_s=0.0)
        seed0.update(1024, 500.0, None)
        seed1.update(1024, 498.0, None)
        seed0.update(2048, 512.4, 20.5)
    with open(log, "a") as f:
        f.write("$ train --seeds 0,1\n" + lines.getvalue() + "[ppo CartPole-v1 seed 1] step 20")  # still being written
    stop = Stop()
    stop.logs[object()] = (log, start)  # type: ignore[index]  # a running trainer's log
    assert sorted(live_progress(stop)) == [(1024, 498.0), (2048, 512.0)]

    cells = [Cell("ppo", "CartPole-v1", seed, 10000, ()) for seed in (0, 1)]
    board = Board(cells, slots=2, probe=lambda: live_progress(stop))
    board.launched(cells)
    # 1,010 steps/s; 20,000 − 3,072 steps left → 16.8 s.
    assert board.status() == "processes 1/2 · runs 2 running, 0/2 done · 1,010 steps/s · ETA 17s"
    board.finished(Outcome(cells[0], "failed", "boom"))  # its stack still trains seed 1
    # Seed 0's 10,000 are no longer left; the trainer still reports its 3,072 steps: 6,928 / 1,010 → 6.9 s.
    assert board.status() == "processes 1/2 · runs 1 running, 1/2 done (1 failed) · 1,010 steps/s · ETA 7s"
    board.exited([Outcome(cells[1], "completed")])
    stop.logs.clear()  # the trainer has ended: the last rate measured stays
    board.close()  # a last heartbeat, as a line: stdout is not a terminal here
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.endswith("] processes 0/2 · runs 0 running, 2/2 done (1 failed) · 1,010 steps/s · ETA 0s")


def test_a_stop_leaves_interrupted_runs_counted_apart_from_the_done_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cells = [Cell("ppo", "CartPole-v1", seed, 10000, ()) for seed in (0, 1)]
    board = Board(cells, slots=1, probe=list)
    board.launched(cells)
    board.exited([Outcome(cells[0], "completed"), Outcome(cells[1], "interrupted")])  # Ctrl-C during seed 1
    assert "runs 0 running, 1/2 done, 1 interrupted · " in board.status()
    assert "[1/2 done, 0 running in 0 processes, 0 failed, 1 interrupted] interrupted" in capsys.readouterr().out


def test_the_eta_of_runs_with_a_time_budget_is_at_most_what_their_budgets_leave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("lab.board.time", type("Clock", (), {"monotonic": staticmethod(lambda: clock[0])}))
    cells = [Cell("ppo", "CartPole-v1", seed, 10_000_000, ("budget_seconds=100",)) for seed in (0, 1, 2)]
    board = Board(cells, slots=1, probe=lambda: [(1000, 10.0), (1000, 10.0)], stack=2)  # stacks: seeds 0,2 and 1
    board.launched([cells[0], cells[2]])
    clock[0] += 40.0
    # By steps: 3e7 − 2,000 steps at 20 steps/s, 17 days. By time: the stack's 60 s left, then seed 1's 100 s.
    assert board.status().endswith("· 20 steps/s · ETA 2m40s")
    board.exited([Outcome(cells[0], "completed"), Outcome(cells[2], "completed")])
    board.launched([cells[1]])
    clock[0] += 30.0
    assert board.status().endswith("ETA 1m10s")
    mixed = Board([*cells, Cell("ppo", "CartPole-v1", 3, 2000, ())], slots=1, probe=lambda: [(1000, 10.0)])
    assert mixed.status().endswith("ETA 833h21m")  # a run without a time budget: the steps decide


def test_an_interrupted_grid_resumes(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "lab",
        "bench",
        "--algos",
        "ppo",
        "--envs",
        "CartPole-v1",
        "--seeds",
        "1",
        "--total-steps",
        "30000",
        "--set",
        "ppo.eval_episodes=2",
        "--workers",
        "1",
        "--name",
        "stop",
    ]
    process = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
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


def test_the_same_grid_on_a_local_ray_instance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ray = pytest.importorskip("ray")
    grid = tiny_grid("ray", algos=["ppo"], seeds=2)
    try:
        # Both seeds in one Ray task, one `train --seeds` process; a stack of one is the same task with one cell.
        bench_dir, outcomes = bench.run_grid(grid, workers=2, backend="ray", ray_address=None, root=tmp_path, stack=2)
    finally:
        ray.shutdown()
    last = [m.groupdict() for m in HEARTBEAT.finditer(capsys.readouterr().out)][-1]  # the board's last word
    assert {"where": "Ray tasks 0", "running": "0", "done": "2", "total": "2", "eta": "0s"}.items() <= last.items()
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
        (["--suite", "quick", "--reuse-from", "nowhere"], "--reuse-from 'nowhere' is not a folder"),
        (["--suite", "quick", "--backend", "ray", "--ray-address", "127.0.0.1:1"], "cannot reach a Ray cluster"),
    ],
)
def test_bad_input_is_refused_before_any_run(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_bench_reuses_the_completed_runs_of_another_that_it_asks_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, _ = bench.run_grid(
        tiny_grid("source", algos=["ppo"]), workers=1, backend="local", ray_address=None, root=tmp_path, report=False
    )
    # Runs trained with other settings, and runs that did not complete, are left where they are.
    assert bench.adopt_runs(tiny_grid("other", algos=["ppo"], total_steps=4096).cells(), source, tmp_path / "o") == 0
    stopped = tmp_path / "stopped"
    shutil.copytree(source, stopped)
    summary = stopped / "CartPole-v1" / "ppo" / "seed1" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "status": "interrupted"}))
    assert bench.adopt_runs(tiny_grid("some", algos=["ppo"]).cells(), stopped, tmp_path / "some") == 1
    # Runs older code trained (their meta.json's code version) are not adopted, and a bench refuses them.
    older = tmp_path / "older"
    shutil.copytree(source, older)
    meta = older / "CartPole-v1" / "ppo" / "seed0" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "code_version": rundir.CODE_VERSION - 1}))
    assert bench.adopt_runs(tiny_grid("newer", algos=["ppo"]).cells(), older, tmp_path / "newer") == 1
    with pytest.raises(BadInput, match=f"trained by code version {rundir.CODE_VERSION - 1}, today's is"):
        bench.run_grid(tiny_grid("older", algos=["ppo"]), 1, "local", None, root=tmp_path, report=False)

    grid = tiny_grid("target", algos=["ppo"], seeds=3)
    # A copy stopped halfway, in its hidden staging folder, is thrown away and made again.
    stale = tmp_path / "target" / "CartPole-v1" / "ppo" / ".seed0.adopting"
    stale.mkdir(parents=True)
    (stale / "checkpoint.pt").write_bytes(b"part of a checkpoint")
    target, outcomes = bench.run_grid(
        grid, workers=1, backend="local", ray_address=None, root=tmp_path, report=False, reuse_from=[source]
    )
    assert not stale.exists()
    assert "reused 2 completed runs of" in capsys.readouterr().out
    assert sorted((o.cell.seed, o.status, o.attempts) for o in outcomes) == [
        (0, "completed", 0),
        (1, "completed", 0),
        (2, "completed", 1),
    ]
    for seed in (0, 1):
        copied, original = (d / "CartPole-v1" / "ppo" / f"seed{seed}" for d in (target, source))
        assert (copied / "progress.csv").read_text() == (original / "progress.csv").read_text()
        assert (copied.parent / f"seed{seed}.log").exists()

    # From several benches, in their order: seeds 0-1 from the first, seed 2 from the second; nothing trains.
    _, outcomes = bench.run_grid(
        tiny_grid("both", algos=["ppo"], seeds=3),
        1,
        "local",
        None,
        root=tmp_path,
        report=False,
        reuse_from=[source, target],
    )
    out = capsys.readouterr().out
    assert f"reused 2 completed runs of {source}" in out and f"reused 1 completed run of {target}" in out
    assert [o.attempts for o in outcomes] == [0, 0, 0]


def test_a_bench_keeps_its_settings(tmp_path: Path) -> None:
    grid = tiny_grid("fixed", algos=["ppo"], seeds=1)
    bench.write_bench_yaml(tmp_path / "fixed", grid, workers=1)
    with pytest.raises(BadInput, match="another --name"):
        bench.check_bench_dir(tmp_path / "fixed", tiny_grid("fixed", algos=["ppo"], seeds=1, total_steps=4096))


def test_suites_are_defined_as_documented() -> None:
    assert bench.SUITES["quick"].envs == ("CartPole-v1",) and bench.SUITES["quick"].seeds == 3
    assert set(bench.SUITES["quick"].algos) == {"ppo", "grpo", "sb3-ppo"}
    assert {"HalfCheetah-v5", "Hopper-v5", "Walker2d-v5"} <= set(bench.SUITES["mujoco"].envs)


def test_the_mujoco_suite_runs_every_v5_task_with_five_seeds_of_each_algo() -> None:
    # Every cell's config is built and validated by plan_grid, as `testbed train` would, before any run.
    grid = bench.plan_grid("mujoco", None, None, None, None, [], None)
    assert len(grid.envs) == 11 and all(env.endswith("-v5") for env in grid.envs)
    cells = grid.cells()
    per_algo = {algo: sorted({c.seed for c in cells if c.algo == algo}) for algo in grid.algos}
    assert per_algo == {"ppo": [0, 1, 2, 3, 4], "grpo": [0, 1, 2, 3, 4], "sb3-ppo": [0, 1, 2, 3, 4]}
    assert len(cells) == 11 * 3 * 5 and grid.total_steps == 1_000_000
    assert {c.seed for c in bench.plan_grid("mujoco", None, None, 2, None, [], None).cells()} == {0, 1}  # --seeds 2


def test_every_mujoco_task_has_normalization_anchors_and_a_cited_ppo_figure() -> None:
    # The suite's aggregates normalize every task, and each PPO entry names the figure it is measured against.
    refs = normalized.load_reference_scores()
    figures = published.load_published()
    entries = re.split(r"\n  (?=\S)", (REPO / "agents/presets/ppo.yaml").read_text())
    for env_id in bench.SUITES["mujoco"].envs:
        assert refs[env_id].target > refs[env_id].random, env_id
        entry = next(e for e in entries if e.startswith(f"{env_id}:"))
        assert "# published:" in entry, env_id
        # The report's comparison reads lab/published.yaml: its first figure is the one the preset names, and the
        # preset's comment cites every other.
        best, *others = figures[env_id]
        assert (f"# published: {best.score}" if best.score is not None else "# published: none") in entry, env_id
        assert all(f"{figure.score}" in entry for figure in others), env_id


def test_every_task_of_the_mujoco_suite_trains_a_few_steps_with_ppo_and_grpo(tmp_path: Path) -> None:
    # A smoke run: one iteration of 64 steps per task for PPO, one group of 2 members cut at 16 steps for GRPO,
    # one evaluation episode. The presets load, the envs build, both agents step and evaluate every task.
    sets = [
        "ppo.n_steps=64",
        "ppo.minibatch_size=32",
        "ppo.n_epochs=1",
        "grpo.group_size=2",
        "grpo.num_groups=1",
        "grpo.max_episode_steps=16",
        "grpo.n_epochs=1",
        "grpo.num_minibatches=1",
        "grpo.vine_branches=2",
        "eval_episodes=1",
        "eval_interval=0",
        "checkpoint_interval=0",
    ]
    grid = bench.plan_grid("mujoco", ["ppo", "grpo"], None, 1, 64, sets, "smoke")
    _, outcomes = bench.run_grid(grid, workers=2, backend="local", ray_address=None, root=tmp_path, report=False)
    assert len(outcomes) == 22 and [o for o in outcomes if o.status != "completed"] == []
