"""A local Ray instance ends with the driver that started it, however the driver ends (SIGKILL included).

``ray.init()`` ties the processes it starts itself (GCS, raylet, monitor, log monitor, dashboard) to the driver
with ``PR_SET_PDEATHSIG``, but not those the raylet starts. After a SIGKILL of the driver its workers linger
for about 2 s (killing their trainers), and its dashboard and runtime-env agents for 60 s: they spend that long
reporting the raylet's death to the GCS, which is dead too (a timeout fixed in Ray's
``publish_error_to_driver``).

:func:`init_local` starts the instance with a mark in the environment, which every process it starts inherits,
and a watchdog beside it. While the driver lives, the watchdog notes every descendant of the driver that bears
the mark or descends from one that does (the agents rewrite their title over their environment, so some no
longer show it); when the driver's end of a pipe closes, it kills those still alive, their descendants, and
any other process bearing the mark. A cluster joined with ``--ray-address`` was started by others and bears no
mark: nothing of it is touched.

The instance's tasks train in scratch folders (:func:`scratch_folder`) inside one folder of the instance's,
``testbed-ray-*`` in the temporary directory, which the watchdog removes once the instance's processes are
gone: a worker killed with its driver cannot remove its own. The watchdog holds a lock on it while it watches;
should the watchdog itself be killed, the next local instance removes the folder (:func:`_sweep`).

Run as ``python -I lab/raywatch.py DRIVER_PID TOKEN SCRATCH``: the watchdog itself (standard library only).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

MARK = "TESTBED_RAY_INSTANCE"
SCRATCH = "TESTBED_RAY_SCRATCH"
"""Names the instance's scratch folder to its tasks, which inherit it as they inherit the mark."""
SCRATCH_PREFIX = "testbed-ray-"
LOCK = ".lock"  # in the scratch folder: held by the watchdog while it watches
POLL_S = 1.0  # a process missed by the last look still bears the mark, or descends from one that does
_watchdogs: list[subprocess.Popen[bytes]] = []  # their stdin pipes stay open as long as this process lives


def init_local(ray: Any, **init_kwargs: Any) -> None:
    """``ray.init(**init_kwargs)`` for a new local instance whose every process ends with this one."""
    _watchdogs[:] = [w for w in _watchdogs if w.poll() is None]  # those of instances shut down earlier
    token = secrets.token_hex(8)
    watchdog = None
    marks = {MARK: token}
    if os.path.isdir("/proc"):  # Linux; elsewhere Ray's own fate-sharing is all there is
        _sweep()
        scratch = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
        # Locked under another name, then renamed: a sweep never finds the lock file unheld while the watchdog lives.
        with open(os.path.join(scratch, f"{LOCK}.new"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            os.rename(os.path.join(scratch, f"{LOCK}.new"), os.path.join(scratch, LOCK))
            # Started first, so that a driver killed during ray.init() leaves nothing behind either. The lock's
            # descriptor passes to it: the lock is held as long as the watchdog lives.
            watchdog = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid()), token, scratch],
                stdin=subprocess.PIPE,
                start_new_session=True,
                pass_fds=(lock.fileno(),),
            )
        _watchdogs.append(watchdog)
        marks[SCRATCH] = scratch
    previous = {name: os.environ.get(name) for name in marks}
    os.environ.update(marks)  # inherited by what ray.init() starts, and by what those start
    try:
        # "local": a new instance, even where RAY_ADDRESS or a `ray start` on this machine names a running one.
        ray.init(address="local", **init_kwargs)
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    if watchdog is not None and watchdog.stdin is not None:
        try:
            watchdog.stdin.write(b"up\n")  # the instance is up: once its processes are gone, so is the need to watch
            watchdog.stdin.flush()
        except OSError:
            pass


def scratch_folder(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A Ray task's scratch folder, removed when the task ends. In a local instance it lies in the instance's
    folder, which goes with the instance even when the task is killed; on a cluster joined by address, in the
    node's temporary directory."""
    parent = os.environ.get(SCRATCH)
    return tempfile.TemporaryDirectory(prefix=prefix, dir=parent if parent and os.path.isdir(parent) else None)


def _sweep() -> None:
    """Remove the scratch folders of local instances whose watchdog is gone (killed itself), found by their lock
    being free."""
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), f"{SCRATCH_PREFIX}*")):
        try:
            with open(os.path.join(folder, LOCK)) as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # held (BlockingIOError), not ours or already gone: left as it is
            continue


def _table() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, start time) of every live process (zombies left out)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as file:
                    fields = file.read().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[0] not in "ZX":
                table[int(name)] = (int(fields[1]), fields[19])
    return table


def _bears(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            return needle in file.read().split(b"\0")
    except OSError:
        return False


def _below(table: dict[int, tuple[int, str]], roots: set[int]) -> set[int]:
    """``roots`` and all their descendants in ``table``."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def watch(driver: int, token: str) -> None:
    needle = f"{MARK}={token}".encode()
    ours: dict[int, str] = {}  # pid → start time: the instance's processes seen so far
    up = False
    while True:
        if select.select([sys.stdin], [], [], POLL_S)[0]:
            if not os.read(sys.stdin.fileno(), 1024):
                break  # the pipe's end: the driver has exited, however it ended
            up = True  # ray.init() has returned
        table = _table()
        children: dict[int, list[int]] = {}
        for pid, (parent, _) in table.items():
            children.setdefault(parent, []).append(pid)
        todo = [(pid, False) for pid in children.get(driver, []) if pid != os.getpid()]
        while todo:  # the driver's descendants: ours when marked, or below one of ours
            pid, inherited = todo.pop()
            mine = inherited or ours.get(pid) == table[pid][1] or _bears(pid, needle)
            if mine:
                ours[pid] = table[pid][1]
            todo += [(child, mine) for child in children.get(pid, [])]
        if up and ours and not any(table.get(pid, (0, None))[1] == start for pid, start in ours.items()):
            return  # ray.shutdown() ended the instance while the driver lives on: nothing left to watch
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:  # the driver is gone: so is its instance
        table = _table()
        roots = {pid for pid, start in ours.items() if table.get(pid, (0, None))[1] == start}
        roots |= {pid for pid in table if _bears(pid, needle)}
        targets = _below(table, roots) - {os.getpid()}
        if not targets:
            return
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the end of the driver ends the watch
    watch(int(sys.argv[1]), sys.argv[2])
    shutil.rmtree(sys.argv[3], ignore_errors=True)  # the instance's tasks are gone, and their scratch folders with it
