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

Run as ``python -I lab/raywatch.py DRIVER_PID TOKEN``: the watchdog itself (standard library only).
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import time
from typing import Any

MARK = "TESTBED_RAY_INSTANCE"
POLL_S = 1.0  # a process missed by the last look still bears the mark, or descends from one that does
_watchdogs: list[subprocess.Popen[bytes]] = []  # their stdin pipes stay open as long as this process lives


def init_local(ray: Any, **init_kwargs: Any) -> None:
    """``ray.init(**init_kwargs)`` for a new local instance whose every process ends with this one."""
    _watchdogs[:] = [w for w in _watchdogs if w.poll() is None]  # those of instances shut down earlier
    token = secrets.token_hex(8)
    watchdog = None
    if os.path.isdir("/proc"):  # Linux; elsewhere Ray's own fate-sharing is all there is
        # Started first, so that a driver killed during ray.init() leaves nothing behind either.
        watchdog = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), str(os.getpid()), token],
                                    stdin=subprocess.PIPE, start_new_session=True)  # fmt: skip
        _watchdogs.append(watchdog)
    previous = os.environ.get(MARK)
    os.environ[MARK] = token  # inherited by what ray.init() starts, and by what those start
    try:
        # "local": a new instance, even where RAY_ADDRESS or a `ray start` on this machine names a running one.
        ray.init(address="local", **init_kwargs)
    finally:
        if previous is None:
            os.environ.pop(MARK, None)
        else:
            os.environ[MARK] = previous
    if watchdog is not None and watchdog.stdin is not None:
        try:
            watchdog.stdin.write(b"up\n")  # the instance is up: once its processes are gone, so is the need to watch
            watchdog.stdin.flush()
        except OSError:
            pass


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
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the end of the driver ends the watch
    watch(int(sys.argv[1]), sys.argv[2])
