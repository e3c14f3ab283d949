"""Smoke tests for benchmarks/speed.py, learning.py, sweeps.py and ablation.py: tiny budgets, real subprocesses."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from agents import rundir
from tests.conftest import REPO, read_csv


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


@functools.cache
def _speed_module() -> ModuleType:
    """benchmarks/speed.py, a script outside any package, imported by its path."""
    spec = importlib.util.spec_from_file_location("benchmarks_speed", REPO / "benchmarks" / "speed.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_describe_reports_the_sb3_arguments_of_our_preset() -> None:
    speed = _speed_module()  # the mapping itself is tested in tests/test_sb3.py
    line = speed.describe(*speed.resolve(speed.Case("cartpole", "CartPole-v1", 100_000)))
    assert "n_envs=8" in line and "batch_size=256" in line and "learning_rate=linear from 0.001" in line
    assert "activation_fn=Tanh" in line and "no VecNormalize" in line and "log_std_init" not in line
    line = speed.describe(*speed.resolve(speed.Case("halfcheetah", "HalfCheetah-v5", 50_000)))
    assert "learning_rate=6.626235648340379e-05" in line and "log_std_init=-0.9666898400402343" in line
    assert "n_steps=1024" in line and "batch_size=256" in line and "gamma=0.99)" in line
    assert "n_epochs=20 (train() of one epoch each, advantages recomputed between)" in line  # SB3's argument is 1


def test_public_command_hides_absolute_paths(tmp_path: Path) -> None:
    speed = _speed_module()  # the autouse fixture runs each test in tmp_path: inside it, paths become relative
    outside = tmp_path.parent / "elsewhere"
    command = speed.public_command("benchmarks/speed.py", ["--out", str(outside / "out"), f"--root={tmp_path / 'r'}"])
    assert command == "python benchmarks/speed.py --out …/out --root=r"


def test_speed_smoke(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = _run(
        [
            "benchmarks/speed.py",
            "--cases",
            "cartpole",
            "--repeats",
            "1",
            "--cartpole-steps",
            "2048",
            "--ceiling-seconds",
            "0.2",
            "--out",
            str(out),
        ],
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_csv(out / "speed.csv")
    by_impl = {r["impl"]: r for r in rows}
    assert {"ours", "sb3", "ours_profiled"} == set(by_impl)
    for impl in ("ours", "sb3"):
        assert by_impl[impl]["returncode"] == "0" and int(by_impl[impl]["total_steps"]) >= 2048
        assert float(by_impl[impl]["sps"]) > 0 and float(by_impl[impl]["wall_s"]) > 0
    # The same work on both sides (tests/test_benchmark_work.py counts it on every config): 8 iterations of 20 epochs.
    assert by_impl["ours"]["gradient_steps"] == by_impl["sb3"]["gradient_steps"] == "160"
    md = (out / "speed.md").read_text()
    ratio = re.search(r"SB3 / ours, median process times: ([0-9.]+)", md)
    assert ratio is not None and float(ratio.group(1)) > 0
    assert "Ceiling" in md and "Where our time goes" in md and "Machine:" in md and "A bound on the ratio" in md
    assert "| 160 |" in md and "Unequal work" not in md
    assert str(tmp_path) not in md and str(REPO) not in md


def test_learning_runs_then_skips(tmp_path: Path) -> None:
    out = tmp_path / "results" / "ppo_learning.csv"
    args = [
        "benchmarks/learning.py",
        "--env",
        "CartPole-v1",
        "--seeds",
        "0",
        "1",
        "--total-steps",
        "1024",
        "--workers",
        "2",
        "--root",
        str(tmp_path / "runs"),
        "--out",
        str(out),
    ]
    proc = _run(args, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_csv(out)
    assert [(r["algo"], r["env_id"], r["seed"], r["status"]) for r in rows] == [
        ("ppo", "CartPole-v1", "0", "completed"),
        ("ppo", "CartPole-v1", "1", "completed"),
    ]
    assert all(float(r["final_eval_return_mean"]) > 0 and r["final_eval_episodes"] == "10" for r in rows)
    md = out.with_suffix(".md").read_text()
    assert "## CartPole-v1 · ppo" in md and "Over seeds" in md and "1000000+i" in md
    assert str(tmp_path) not in md

    run_dirs = tmp_path / "runs" / "CartPole-v1" / "ppo"
    before = {p: p.stat().st_mtime_ns for p in run_dirs.rglob("*")}
    start = time.perf_counter()
    proc = _run(args, timeout=60)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("skipped") == 2
    assert {p: p.stat().st_mtime_ns for p in run_dirs.rglob("*")} == before  # nothing rerun or rewritten
    assert elapsed < 10  # a training process alone takes a few seconds; skipping takes well under one
    assert len(read_csv(out)) == 2


def test_learning_records_a_failed_run(tmp_path: Path) -> None:
    out = tmp_path / "learning.csv"
    proc = _run(
        [
            "benchmarks/learning.py",
            "--env",
            "NoSuchEnv-v0",
            "--seeds",
            "0",
            "--total-steps",
            "1024",
            "--root",
            str(tmp_path / "runs"),
            "--out",
            str(out),
        ],
        timeout=60,
    )
    assert proc.returncode == 1
    assert [(r["env_id"], r["status"]) for r in read_csv(out)] == [("NoSuchEnv-v0", "failed")]
    assert "failed" in out.with_suffix(".md").read_text()


def test_a_sweep_on_its_own_seeds_is_tabulated(tmp_path: Path) -> None:
    bench_dir = tmp_path / "runs" / "bench" / "sweep-a"
    argv = [
        "-m",
        "lab",
        "bench",
        "--algos",
        "ppo",
        "--envs",
        "CartPole-v1",
        "--seeds",
        "1",
        "--first-seed",
        "7",
        "--total-steps",
        "1024",
        "--set",
        "eval_interval=512",
        "--set",
        "ent_coef=0.01",
        "--workers",
        "1",
        "--name",
        "sweep-a",
    ]
    proc = subprocess.run(
        [sys.executable, *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (bench_dir / "CartPole-v1" / "ppo" / "seed7" / "summary.json").exists()
    out = tmp_path / "sweeps.md"
    proc = _run(
        [
            "benchmarks/sweeps.py",
            "--benches",
            str(bench_dir),
            "--title",
            "A sweep",
            "--threshold",
            "5",
            "--out",
            str(out),
        ],
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = out.read_text()
    assert "# A sweep" in md and "## CartPole-v1" in md and "first eval ≥ 5" in md
    row = next(line for line in md.splitlines() if line.startswith("| `sweep-a`"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "`eval_interval=512`<br>`ent_coef=0.01`" and cells[2] == "7" and cells[4].startswith("1/1")
    assert "--first-seed 7" in md and str(tmp_path) not in md


def test_an_ablation_tables_its_rows_in_order_after_each_and_a_ctrl_c_stops_the_last_with_a_checkpoint(
    tmp_path: Path,
) -> None:
    tiny = ["total_steps=1024", "eval_interval=512"]
    argv = [
        sys.executable,
        str(REPO / "benchmarks" / "ablation.py"),
        "--algo",
        "ppo",
        "--env",
        "CartPole-v1",
        "--seeds",
        "1",
        "--first-seed",
        "3",
        "--title",
        "An ablation",
        "--out",
        "page.md",
        "--row",
        "abl-b",
        *tiny,
        "ent_coef=0.01",
        "--row",
        "abl-a",
        *tiny,
        "--row",
        "abl-stop",
        "total_steps=5000000",
    ]
    with open(tmp_path / "out.log", "w") as log, open(tmp_path / "err.log", "w") as errors:  # no pipe to fill meanwhile
        ablation = subprocess.Popen(
            argv,
            cwd=tmp_path,
            stdout=log,
            stderr=errors,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            start_new_session=True,
        )
        run_dir = tmp_path / "runs/bench/abl-stop/CartPole-v1/ppo/seed3"  # --first-seed 3
        deadline = time.monotonic() + 150
        while not (run_dir / "progress.csv").exists() and time.monotonic() < deadline and ablation.poll() is None:
            time.sleep(0.2)
        os.killpg(ablation.pid, signal.SIGINT)  # a terminal's Ctrl-C: the script and its bench alike
        ablation.wait(timeout=120)
    out, err = (tmp_path / "out.log").read_text(), (tmp_path / "err.log").read_text()
    assert ablation.returncode != 0 and "interrupted: running cells saved checkpoints" in err, out[-2000:] + err[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())  # the bench stopped its run, not killed
    assert summary["status"] == "interrupted" and (run_dir / "checkpoint.pt").exists()
    assert rundir.lock_holder(run_dir) is None  # its trainer has ended: a rerun resumes it
    md = (tmp_path / "page.md").read_text()
    table = md.split("## Each row against")[0]
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| `abl-")]
    assert rows == ["`abl-b`", "`abl-a`"]  # the order given, not the names' order; the stopped row not yet
    assert md.startswith("# An ablation (2 of 3 rows so far)\n") and out.count("wrote page.md") == 2
    assert "`ent_coef=0.01`" in md and "--first-seed 3 --workers 1 --name abl-b --set total_steps=1024" in md
    # The second row against the first: one seed each, so Δ is the difference of their finals, with no spread.
    finals = [
        json.loads((tmp_path / f"runs/bench/{b}/CartPole-v1/ppo/seed3/summary.json").read_text())[
            "final_eval_return_mean"
        ]
        for b in ("abl-b", "abl-a")
    ]
    delta = f"{finals[1] - finals[0]:+.1f}"
    assert "## Each row against `abl-b`" in md and f"| `abl-a` | 1 | {delta} | [{delta}, {delta}] |" in md
    assert "](plots/page-seeds.png)" in md  # each row's seeds as curves, beside the page
    assert (tmp_path / "plots/page-seeds.png").stat().st_size > 0


def test_an_ablation_with_a_bad_row_fails_before_any_bench_runs(tmp_path: Path) -> None:
    for rows, message in [
        (["--row", "a", "--row", "a"], "--row names must differ"),
        (["--row", "a", "--row", "b", "gama=0.9"], "--row b:"),
        (["--row", "a", "gamma"], "settings are KEY=VALUE"),
    ]:
        proc = subprocess.run(
            [
                sys.executable,
                str(REPO / "benchmarks" / "ablation.py"),
                "--algo",
                "ppo",
                "--env",
                "CartPole-v1",
                "--title",
                "T",
                *rows,
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


@functools.cache
def _fault_probe_module() -> ModuleType:
    """benchmarks/fault_probe.py, imported by its path (its dataclasses look their module up in sys.modules)."""
    spec = importlib.util.spec_from_file_location("benchmarks_fault_probe", REPO / "benchmarks" / "fault_probe.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_fault_probe_in_ci_kills_trainers_alone_and_moves_folders_in_every_scenario_it_names() -> None:
    """CI runs a dozen kill points of the probe (.ci/run); its plan, drawn from its seed alone, must still reach
    every fault the probe exists for, or a change of the draws would quietly drop one from CI."""
    probe = _fault_probe_module()
    ci = (REPO / ".ci" / "run").read_text()
    found = re.search(r"fault_probe\.py --kills (\d+) --seed (\d+) --scenarios (\S+)", ci)
    assert found, ".ci/run no longer runs the fault probe"
    kills, seed, scenarios = int(found[1]), int(found[2]), found[3].split(",")
    points = probe.plan(kills, scenarios, seed)
    assert points == probe.plan(kills, scenarios, seed)  # the same arguments make the same probe
    assert {p.variant.scenario for p in points} == {"train", "stack", "bench", "tune"}
    alone = [p for p in points if p.target == "trainer"]
    assert {p.variant.scenario for p in alone} == {"bench", "tune"}
    assert all(p.signal == signal.SIGKILL for p in alone)
    assert {p.variant.scenario for p in points if p.moved} == {"train", "stack", "bench", "tune"}
    assert any(p.target == "group" for p in points) and any(p.target == "command" for p in points)
    assert all(p.target == "command" for p in probe.plan(100, ["train", "stack"], 0))  # no trainers of their own
