"""The bench's faults of issue #10, each reproduced: Ray data loss, two drivers of one bench, trainers
outliving their driver, corrupt summary.json files, bench names outside runs/bench, and the import cycle
between the report modules.

Cells train CartPole-v1 with PPO for a few thousand steps and no periodic evaluation.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from agents import rundir
from envs.errors import BadInput
from lab import bench, cells, credit, executor
from lab.results import find_runs
from tests.conftest import REPO, alive, hold_lock, read_csv, read_progress, wait_for

SETS = ["eval_interval=0", "eval_episodes=2"]


@pytest.fixture(autouse=True)
def _importable_project(monkeypatch: pytest.MonkeyPatch) -> None:
    # The cells and lock holders are `python` processes started from the test's scratch directory.
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def ppo_grid(name: str, seeds: int = 1, total_steps: int = 2048) -> bench.Grid:
    """A grid of PPO on CartPole-v1: ``seeds`` cells of ``total_steps`` env steps."""
    return bench.plan_grid(None, ["ppo"], ["CartPole-v1"], seeds, total_steps, SETS, name)


def status_of(run_dir: Path) -> str:
    """The status in ``run_dir``'s summary.json."""
    return json.loads((run_dir / "summary.json").read_text())["status"]


def steps_of(run_dir: Path) -> list[int]:
    """The global_step of every progress.csv row in ``run_dir``."""
    return [int(row["global_step"]) for row in read_progress(run_dir)]


# ── 1. Ray: a task returns only its own run directory ─────────────────────────────────────────────


def test_a_ray_rerun_returns_each_cell_alone_and_keeps_every_seed(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    grid = ppo_grid("ray", seeds=2)
    run_dirs = [grid.cells()[seed].run_dir(tmp_path / "ray") for seed in (0, 1)]
    for run_dir in run_dirs:  # both seeds failed in an earlier run of the bench
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({"status": "failed", "error": "out of memory"}))
    try:
        _, outcomes = bench.run_grid(grid, workers=2, backend="ray", ray_address=None, root=tmp_path)
    finally:
        ray.shutdown()
    assert sorted((o.cell.seed, o.status) for o in outcomes) == [(0, "completed"), (1, "completed")]
    # Each task's archive held its own seed only, so no stale copy of the other seed came back.
    assert [status_of(run_dir) for run_dir in run_dirs] == ["completed", "completed"]
    for run_dir in run_dirs:
        assert (run_dir / "checkpoint.pt").exists()
        assert status_of(run_dir.with_name(f".{run_dir.name}.failed1")) == "failed"  # set aside, as locally
        assert "--total-steps 2048" in run_dir.with_name(f"{run_dir.name}.log").read_text()
        assert not (run_dir / rundir.LOCK).exists()  # the worker's lock stayed on the worker
    assert sorted(p.name for p in run_dirs[0].parent.iterdir() if not p.name.startswith(".")) == [
        "seed0",
        "seed0.log",
        "seed1",
        "seed1.log",
    ]


def archive(files: dict[str, str]) -> bytes:
    """A tar.gz holding ``files`` (path → text), as a Ray task sends its run directory back."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_ray_result_replaces_only_its_own_run_and_never_a_completed_one(tmp_path: Path) -> None:
    done, failed, resumed = (cells.Cell("ppo", "CartPole-v1", seed, 2048, ()) for seed in (0, 1, 2))
    for cell, status in ((done, "completed"), (failed, "failed"), (resumed, "interrupted")):
        cell.run_dir(tmp_path).mkdir(parents=True)
        (cell.run_dir(tmp_path) / "summary.json").write_text(json.dumps({"status": status}))
    from_worker = json.dumps({"status": "completed", "from": "worker"})

    # A run that completed here meanwhile is kept, whatever the task says.
    files = archive({"seed0/summary.json": from_worker})
    outcome = executor.receive_cell(cells.Outcome(done, "failed", "boom"), files, tmp_path)
    assert outcome.status == "completed"
    assert json.loads((done.run_dir(tmp_path) / "summary.json").read_text()) == {"status": "completed"}

    # A task that started over replaces the failed run, which is set aside; other cells' files are ignored.
    files = archive(
        {
            "seed1/summary.json": from_worker,
            "seed1.log": "worker log\n",
            "seed0/summary.json": json.dumps({"status": "interrupted"}),
        }
    )
    assert executor.receive_cell(cells.Outcome(failed, "completed"), files, tmp_path).status == "completed"
    assert json.loads((failed.run_dir(tmp_path) / "summary.json").read_text())["from"] == "worker"
    assert status_of(failed.run_dir(tmp_path).with_name(".seed1.failed1")) == "failed"
    assert failed.run_dir(tmp_path).with_name("seed1.log").read_text() == "worker log\n"
    assert status_of(done.run_dir(tmp_path)) == "completed"

    # A task that resumed the run it was sent returns its continuation, which replaces it.
    (resumed.run_dir(tmp_path) / "stale.txt").write_text("")
    files = archive({"seed2/summary.json": from_worker})
    assert executor.receive_cell(cells.Outcome(resumed, "completed", resumed=True), files, tmp_path).resumed
    assert sorted(p.name for p in resumed.run_dir(tmp_path).iterdir()) == ["summary.json"]
    assert sorted(p.name for p in tmp_path.glob("CartPole-v1/ppo/*")) == [
        ".seed1.failed1",
        "seed0",
        "seed1",
        "seed1.log",
        "seed2",
    ]


# ── 2. one driver per bench directory ────────────────────────────────────────────────────────────


def test_a_second_driver_of_a_bench_is_refused_naming_the_holder_then_runs_once_it_is_free(tmp_path: Path) -> None:
    grid = ppo_grid("one")
    bench_dir = tmp_path / "one"
    holder = hold_lock(bench_dir)
    prepared: list[tuple[Path, str | None, bool]] = []

    def prepare(directory: Path) -> None:
        prepared.append((directory, rundir.lock_holder(directory), (directory / "bench.yaml").exists()))

    try:
        with pytest.raises(BadInput, match=rf"being written by pid {holder.pid} on "):
            bench.run_grid(grid, workers=1, backend="local", ray_address=None, root=tmp_path, prepare=prepare)
    finally:
        holder.kill()
        holder.wait()
    assert prepared == [] and sorted(p.name for p in bench_dir.iterdir()) == [rundir.LOCK]  # nothing written

    _, outcomes = bench.run_grid(grid, workers=1, backend="local", ray_address=None, root=tmp_path, prepare=prepare)
    assert [o.status for o in outcomes] == ["completed"]
    # prepare ran once, with the bench locked by this driver, before bench.yaml was written.
    [(directory, lock_text, had_bench_yaml)] = prepared
    assert directory == bench_dir and lock_text is not None and lock_text.startswith(f"pid {os.getpid()} on ")
    assert not had_bench_yaml and (bench_dir / "bench.yaml").exists()
    assert rundir.lock_holder(bench_dir) is None  # released at the end


# ── 3. trainers stop when their driver dies; a rerun waits for them ──────────────────────────────


def test_a_trainer_stops_when_its_driver_is_killed_and_a_rerun_continues_it(tmp_path: Path) -> None:
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
        "20000",
        "--set",
        "eval_interval=0",
        "--set",
        "eval_episodes=2",
        "--workers",
        "1",
        "--name",
        "b",
    ]
    run_dir = tmp_path / "runs" / "bench" / "b" / "CartPole-v1" / "ppo" / "seed0"
    driver = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (run_dir / "progress.csv").exists() and len(steps_of(run_dir)) > 0, timeout_s=60, poll_s=0.05)
    assert steps_of(run_dir), driver.stderr.read() if driver.poll() is not None else "no progress after 60 s"
    trainer = int((run_dir / rundir.LOCK).read_text().split()[1])  # "pid N on HOST (command, since …)"
    driver.kill()
    driver.communicate()

    wait_for(lambda: not alive(trainer), timeout_s=15, poll_s=0.1)
    assert not alive(trainer), "the trainer kept running after its driver was killed"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 0 < summary["total_steps"] < 20_000

    rerun = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert status_of(run_dir) == "completed"
    steps = steps_of(run_dir)
    assert steps == sorted(set(steps)) and steps[-1] >= 20_000  # continued, nothing written twice


def test_a_cell_waits_for_the_last_writer_of_its_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cell = cells.Cell("ppo", "CartPole-v1", 0, 2048, tuple(SETS))
    run_dir = cell.run_dir(tmp_path)
    log = run_dir.with_name("seed0.log")

    # A writer that finishes within the wait: the cell decides on what it left (here: completed, skip).
    holder = hold_lock(run_dir, seconds=1.5, then_write=json.dumps({"status": "completed"}))
    outcome = cells.run_cells([cell], tmp_path)[0]
    holder.wait()
    assert (outcome.status, outcome.attempts) == ("completed", 0) and not log.exists()

    # A writer that outlasts the wait: the cell fails, naming it, and its directory is left as it is.
    monkeypatch.setattr(cells, "WRITER_WAIT_S", 1.0)
    holder = hold_lock(run_dir)
    try:
        outcome = cells.run_cells([cell], tmp_path)[0]
    finally:
        holder.kill()
        holder.wait()
    assert outcome.status == "failed" and f"pid {holder.pid} on " in str(outcome.error)
    assert outcome.attempts <= 1 and not log.exists()  # nothing trained, nothing retried
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["seed0"] and status_of(run_dir) == "completed"


# ── 4. unreadable summary.json files ─────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "content",
    [b'{"status": "interr', b"\xff\xfe\x00garbage", b'["completed"]'],
    ids=["cut-short", "not-utf8", "not-an-object"],
)
def test_an_unreadable_summary_is_refused_before_any_cell_starts(tmp_path: Path, content: bytes) -> None:
    grid = ppo_grid("corrupt", seeds=2)
    bench_dir = tmp_path / "corrupt"
    run_dir = bench_dir / "CartPole-v1" / "ppo" / "seed1"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"algo": "ppo", "env_id": "CartPole-v1", "seed": 1}))
    (run_dir / "summary.json").write_bytes(content)
    fix = r"Delete it: rerunning the bench then resumes that run from its checkpoint, or starts it again"

    with pytest.raises(BadInput, match=rf"{re.escape(str(run_dir / 'summary.json'))} .*{fix}"):
        bench.run_grid(grid, workers=2, backend="local", ray_address=None, root=tmp_path)
    assert not (bench_dir / "bench.yaml").exists() and not list(bench_dir.rglob("*.log"))  # no cell started
    # Every other reader says the same, without a traceback.
    with pytest.raises(BadInput, match=fix):
        cells.read_status(run_dir)
    with pytest.raises(BadInput, match=fix):
        find_runs([bench_dir])


# ── 5. bench names ───────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", ["../../x", "/tmp/elsewhere", "", ".", "..", "a/b", ".hidden", "a\\b", "x y"])
def test_a_bench_name_outside_runs_bench_is_refused_before_any_work(name: str, tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="is not a bench name: give one folder name"):
        ppo_grid(name)
    assert list(tmp_path.iterdir()) == []


def test_a_bad_env_setting_is_refused_before_the_bench_name_is_bound_to_it(tmp_path: Path) -> None:
    # Before the env was built with the grid's kwargs at planning, bench.yaml kept the bad setting, and a
    # corrected rerun under the same name was refused as "other settings".
    with pytest.raises(BadInput, match="does not accept env_kwargs"):
        bench.plan_grid(None, ["ppo"], ["CartPole-v1"], 1, 2048, [*SETS, "env_kwargs=foo:1"], "kw")
    assert not (tmp_path / bench.BENCH_ROOT).exists()
    _, outcomes = bench.run_grid(ppo_grid("kw", total_steps=512), 1, "local", None)
    assert [o.status for o in outcomes] == ["completed"]


def test_a_plain_bench_name_is_kept() -> None:
    assert ppo_grid("ppo_v2-1.0").name == "ppo_v2-1.0"
    assert bench.plan_grid("quick", ["ppo"], None, 1, 2048, SETS, None).name == "quick"
    assert bench.plan_grid(None, ["ppo"], ["CartPole-v1"], 1, 2048, SETS, None).name == "custom"


# ── 6. the algo registry, and 7. reports without an import cycle ─────────────────────────────────


def test_plan_grid_reads_the_algo_registry() -> None:
    grid = bench.plan_grid(None, ["ppo-lambda0", "grpo-vine"], ["CartPole-v1"], 1, None, [], "registry")
    assert grid.algos == ["ppo-lambda0", "grpo-vine"]
    with pytest.raises(BadInput, match="unknown algo trpo; choose from ppo, grpo"):
        bench.plan_grid(None, ["trpo"], ["CartPole-v1"], 1, None, [], "registry")


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside functions."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def test_the_report_modules_import_no_circle_and_build_reports_writes_both(tmp_path: Path) -> None:
    assert "lab.credit" not in imported_modules(REPO / "lab" / "report.py")
    assert "lab.credit" not in imported_modules(REPO / "lab" / "normalized.py")
    assert "lab.normalized" in imported_modules(REPO / "lab" / "credit.py")
    bench_dir = tmp_path / "study"
    run_dir = bench_dir / "CartPole-v1" / "delay1" / "ppo" / "seed0"
    run_dir.mkdir(parents=True)
    config = {"algo": "ppo", "env_id": "CartPole-v1", "seed": 0, "total_steps": 2000, "reward_delay": "1"}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "progress.csv").write_text("global_step,wall_time_s,eval/return_mean\n1000,1.0,50.0\n2000,2.0,200.0\n")
    (run_dir / "summary.json").write_text(
        json.dumps({"status": "completed", "total_steps": 2000, "final_eval_return_mean": 200.0})
    )
    credit.write_study(bench_dir, credit.plan_study("delayed:CartPole-v1", ["1"]))

    written = bench.build_reports(bench_dir)
    assert written["markdown"] == bench_dir / "report.md" and written["credit markdown"] == bench_dir / "credit.md"
    assert all(path.is_file() for path in written.values())
    assert [row["status"] for row in read_csv(bench_dir / "summary.csv")] == ["completed"]
    assert "| 1 | ppo | 1/1 |" in (bench_dir / "credit.md").read_text()


def test_report_refuses_a_bench_that_a_driver_is_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lab.cli import main

    bench_dir = tmp_path / "runs" / "bench" / "b"
    holder = hold_lock(bench_dir)
    try:
        assert main(["report", str(bench_dir)]) == 2
        assert f"is being written by pid {holder.pid}" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert main(["report", str(tmp_path / "absent")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_a_local_ray_instance_ends_with_its_driver_even_by_sigkill(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    # A driver that starts a local instance, runs one task, then waits; its task leaves a child behind, as a trainer.
    code = (
        "import subprocess, sys, time\nimport ray\nfrom lab import executor\nexecutor.connect_ray(None, 1)\n"
        "child = ray.remote(lambda: subprocess.Popen(['sleep', '600'], start_new_session=True).pid)\n"
        "print(ray.get(child.remote()), flush=True)\ntime.sleep(600)\n"
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert driver.stdout is not None
    started = [int(driver.stdout.readline())]  # the task's child
    stack = [driver.pid]
    while stack:  # the driver's descendants: GCS, raylet, agents, workers
        parent = stack.pop()
        for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
            started.append(int(child))
            stack.append(int(child))
    assert len(started) >= 5
    driver.kill()
    driver.wait()
    wait_for(lambda: not any(alive(pid) for pid in started), timeout_s=10.0, poll_s=0.1)
    left = [pid for pid in started if alive(pid)]
    for pid in left:  # nothing outlives the test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} of the {len(started)} processes outlived the driver's SIGKILL by 10 s"
