"""A bench on the Ray backend under faults, each caused with real processes: a trainer or the Ray worker
running it killed, a cluster joined with ``--ray-address`` left as it was found, and a Ctrl-C of the driver.

Cells train CartPole-v1 with PPO for a few thousand steps and no periodic evaluation. Every process a test
starts (the driver, its local Ray instance or the cluster, their workers and the trainers) inherits a mark in
its environment, so the test finds all of them however they were started, even those Ray starts after a
worker's death, and ends those still alive when it ends. Ray runs on this machine's loopback only.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents import rundir
from tests.conftest import REPO, read_progress, wait_for

MARK = "TESTBED_FAULTS_RAY"


class Marked:
    """The environment of a test's processes, with a mark of its own, and the way to find them by it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp  # short: Ray's sockets live under TMPDIR too
        self.token = secrets.token_hex(8)
        # RAY_AUTH_MODE: a token left in the user's home by another Ray would otherwise be asked of the driver.
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "TMPDIR": str(tmp),
            "RAY_AUTH_MODE": "disabled",
            MARK: self.token,
        }

    def processes(self) -> dict[int, str]:
        """pid → start time of every live process bearing the mark, and of their descendants (Ray's agents
        write their title over their environment, so some no longer show it)."""
        table = process_table()
        needle = f"{MARK}={self.token}".encode()
        roots = set()
        for pid in table:
            try:
                if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    roots.add(pid)
            except OSError:
                continue
        children: dict[int, list[int]] = {}
        for pid, (parent, _) in table.items():
            children.setdefault(parent, []).append(pid)
        found: dict[int, str] = {}
        todo = list(roots)
        while todo:
            pid = todo.pop()
            if pid not in found and pid in table:
                found[pid] = table[pid][1]
                todo += children.get(pid, [])
        return found

    def trainers(self) -> list[int]:
        """The marked ``testbed train`` processes alive now."""
        return [pid for pid in self.processes() if " lab train " in command_of(pid)]

    def end_all(self) -> None:
        """SIGKILL every marked process (by pid), until none is left."""
        for _ in range(50):
            left = self.processes()
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)


@pytest.fixture
def marked() -> Iterator[Marked]:
    """The test's mark and scratch folder; every marked process is ended and the folder removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="ray"))
    found = Marked(tmp)
    try:
        yield found
    finally:
        found.end_all()
        shutil.rmtree(tmp, ignore_errors=True)


def process_table() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, start time) of every live process (zombies left out)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[0] not in "ZX":
                table[int(name)] = (int(fields[1]), fields[19])
    return table


def command_of(pid: int) -> str:
    """Process ``pid``'s command line, its arguments joined by spaces; "" once it has ended."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def still_alive(seen: dict[int, str]) -> dict[int, str]:
    """Those of ``seen`` (pid → start time) still alive, the same processes and not new ones of a reused pid."""
    table = process_table()
    return {pid: command_of(pid)[:80] for pid, start in seen.items() if table.get(pid, (0, ""))[1] == start}


def checkpointed(trainer: int) -> bool:
    """Whether the trainer's run directory (on the worker: a scratch folder) holds a checkpoint; False once the
    trainer has ended."""
    argv = command_of(trainer).split()
    return "--run-dir" in argv and (Path(argv[argv.index("--run-dir") + 1]) / rundir.CHECKPOINT).exists()


def bench_argv(name: str, total_steps: int, *extra: str) -> list[str]:
    """A bench of one PPO cell on CartPole-v1 on the Ray backend, one CPU, a checkpoint every iteration."""
    return [
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
        str(total_steps),
        "--backend",
        "ray",
        "--workers",
        "1",
        "--name",
        name,
        "--set",
        "eval_interval=0",
        "--set",
        "eval_episodes=2",
        "--set",
        "checkpoint_interval=256",
        *extra,
    ]


def start_driver(argv: list[str], cwd: Path, marked: Marked) -> subprocess.Popen[str]:
    """The bench's driver in its own session, as a terminal's foreground job; its output is read at its end."""
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=marked.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def next_trainer(marked: Marked, driver: subprocess.Popen[str], old: set[int], timeout_s: float = 60) -> int:
    """A trainer other than ``old`` once it has written a checkpoint (it is in its training loop)."""
    found: list[int] = []

    def ready() -> bool:
        found[:] = [pid for pid in marked.trainers() if pid not in old and checkpointed(pid)]
        return bool(found) or driver.poll() is not None

    wait_for(ready, timeout_s=timeout_s, poll_s=0.05)
    assert found, driver.communicate()[0][-2000:] if driver.poll() is not None else f"no new trainer in {timeout_s} s"
    return found[0]


def seed0(bench_dir: Path) -> Path:
    """The one cell's run directory on the driver's side."""
    return bench_dir / "CartPole-v1" / "ppo" / "seed0"


def assert_completed_once(run_dir: Path, total_steps: int) -> None:
    """The run completed its budget, with every iteration once in progress.csv."""
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    steps = [int(row["global_step"]) for row in read_progress(run_dir)]
    assert steps == sorted(set(steps)) and steps[-1] >= total_steps


def held_locks(folder: Path) -> list[str]:
    """The lock files under ``folder`` that a live process still holds, with their holders."""
    return [
        f"{path.parent}: {holder}" for path in folder.rglob(rundir.LOCK) if (holder := rundir.lock_holder(path.parent))
    ]


# ── 1. a trainer killed, then the Ray worker running it ──────────────────────────────────────────


def test_a_ray_bench_completes_after_its_trainer_and_then_its_worker_are_killed(tmp_path: Path, marked: Marked) -> None:
    pytest.importorskip("ray")
    driver = start_driver(bench_argv("k", 6144), tmp_path, marked)
    # The trainer killed on its own: the task's retry continues the run from its checkpoint, on the same worker.
    first = next_trainer(marked, driver, set())
    os.kill(first, signal.SIGKILL)
    second = next_trainer(marked, driver, {first})
    assert "--resume" in command_of(second)
    # The worker killed: Ray runs the task again on a new worker, which starts the cell from what the driver sent.
    worker = process_table()[second][0]
    assert command_of(worker).startswith("ray::run_cells_remote")
    seen = marked.processes()
    os.kill(worker, signal.SIGKILL)
    third = next_trainer(marked, driver, {first, second})
    assert "--resume" not in command_of(third)

    output = driver.communicate(timeout=120)[0]
    assert driver.returncode == 0, output[-2000:]
    assert_completed_once(seed0(tmp_path / "runs" / "bench" / "k"), 6144)
    wait_for(lambda: not marked.processes() and not still_alive(seen), timeout_s=10, poll_s=0.1)
    assert not still_alive(seen) and not marked.processes()  # the dead worker's trainer included
    assert not list(marked.tmp.glob("testbed-ray-*"))  # nor the instance's scratch folder


# ── 2. a joined cluster is never touched ─────────────────────────────────────────────────────────


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now, for the cluster's head."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_joined_cluster_outlives_a_bench_and_its_ctrl_c_with_nothing_of_it_left(
    tmp_path: Path, marked: Marked
) -> None:
    pytest.importorskip("ray")
    port = free_port()
    ray_cli = str(Path(sys.executable).with_name("ray"))
    head = subprocess.run(
        [
            ray_cli,
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=1",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        check=False,
        env=marked.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert head.returncode == 0, head.stderr[-2000:]
    cluster = marked.processes()  # the cluster's own processes: GCS, raylet, its agents
    assert len(cluster) >= 3 and any("raylet" in command_of(pid) for pid in cluster)
    address = ["--ray-address", f"127.0.0.1:{port}"]

    done = subprocess.run(
        bench_argv("done", 1024, *address),
        check=False,
        cwd=tmp_path,
        env=marked.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert_completed_once(seed0(tmp_path / "runs" / "bench" / "done"), 1024)
    wait_for(lambda: marked.processes().keys() == cluster.keys(), timeout_s=10, poll_s=0.1)
    assert still_alive(cluster).keys() == cluster.keys(), "the bench's end took processes of the cluster with it"
    left = {pid: command_of(pid)[:80] for pid in marked.processes().keys() - cluster.keys()}
    assert not left, f"left on the cluster after the bench: {left}"

    driver = start_driver(bench_argv("stopped", 100_000, *address), tmp_path, marked)
    next_trainer(marked, driver, set())
    driver.send_signal(signal.SIGINT)
    output = driver.communicate(timeout=60)[0]
    assert driver.returncode == 130, output[-2000:]
    wait_for(lambda: marked.processes().keys() == cluster.keys(), timeout_s=10, poll_s=0.1)
    assert still_alive(cluster).keys() == cluster.keys(), "the Ctrl-C took processes of the cluster with it"
    left = {pid: command_of(pid)[:80] for pid in marked.processes().keys() - cluster.keys()}
    assert not left, f"left on the cluster after the Ctrl-C: {left}"
    assert not held_locks(tmp_path / "runs")


# ── 3. Ctrl-C of a bench on a local Ray instance ─────────────────────────────────────────────────


def test_a_ctrl_c_of_a_ray_bench_leaves_no_process_or_lock_and_the_rerun_completes(
    tmp_path: Path, marked: Marked
) -> None:
    pytest.importorskip("ray")
    argv = bench_argv("c", 2048)
    driver = start_driver(argv, tmp_path, marked)
    next_trainer(marked, driver, set())
    seen = marked.processes()  # the driver, its Ray instance, the worker and the trainer
    assert len(seen) >= 5
    driver.send_signal(signal.SIGINT)  # once, as Ctrl-C on a terminal
    output = driver.communicate(timeout=60)[0]
    assert driver.returncode == 130, output[-2000:]
    # A cancelled Ray task's checkpoints stay on its worker: the message must not promise them.
    assert "running ones were cancelled and start again" in output and "saved checkpoints" not in output
    # Wait for both: a process of the instance may have lost its mark (reparented, its title over its environment).
    wait_for(lambda: not marked.processes() and not still_alive(seen), timeout_s=10, poll_s=0.1)
    assert not still_alive(seen) and not marked.processes(), "processes of the command outlived its Ctrl-C by 10 s"
    assert not held_locks(tmp_path / "runs")
    assert not list(marked.tmp.glob("testbed-ray-*"))

    rerun = subprocess.run(argv, check=False, cwd=tmp_path, env=marked.env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert_completed_once(seed0(tmp_path / "runs" / "bench" / "c"), 2048)
