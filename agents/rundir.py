"""A run directory's files other than its logs and checkpoint: the writer's lock, config.yaml, meta.json,
summary.json, and what a start may leave and a restart clear. Light to import (no torch), so that the command
line and a bench's driver check run directories before any algorithm is imported.

Layout (see ``runs/README.md``)::

    RUN_DIR/config.yaml     resolved config          RUN_DIR/progress.csv   one row per iteration
    RUN_DIR/meta.json       command, git, versions   RUN_DIR/checkpoint.pt  latest good checkpoint
    RUN_DIR/events.out...   TensorBoard              RUN_DIR/summary.json   final status and eval
    RUN_DIR/.lock           the writer's lock
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from agents.config import build_config, load_yaml
from envs.errors import BadInput, brief

CHECKPOINT = "checkpoint.pt"
CODE_VERSION = 3
"""What the algorithms compute, as a number: raise it with any change that alters a run's numbers (seeds,
streams, an update's math). Every run records it in meta.json, so a bench never takes a run of older code for
one of today's, and ``benchmarks/manifest.yaml``'s ``code_version`` is the same number (a test holds them
equal)."""


def kept_checkpoint(step: int) -> str:
    """The file name of the checkpoint kept for ``keep_checkpoints`` step s: ``checkpoint-at-<s>.pt``."""
    return f"checkpoint-at-{step}.pt"


PACKAGES = ("torch", "gymnasium", "numpy", "stable-baselines3", "mujoco", "box2d", "tensorboard")
PARENT_PID = "TESTBED_PARENT_PID"
"""The environment variable naming the driver that started a trainer: the trainer stops when it dies."""

LOCK = ".lock"
# What a start writes before its first checkpoint: a directory holding only these can be started again.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S%z"
"""How meta.json and bench.yaml write a moment: to the second, with its UTC offset."""
RESTARTABLE = ("config.yaml", "meta.json", "progress.csv", "summary.json", LOCK)


class DirLock:
    """One writer per directory: an exclusive ``flock`` on ``DIR/.lock``, which names its holder.

    The kernel releases the lock when the holder's process ends, however it ends (SIGKILL included), so a
    stale lock never blocks a rerun. A second writer gets :class:`BadInput` naming the holder. A lock
    released on a directory that holds nothing else (a command refused after taking it) takes its file
    and the folders it created with it, so a refused command leaves nothing behind.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.file: Any = None
        self.created: list[Path] = []  # what acquire() made: the lock file, then the folders, deepest first

    def acquire(self) -> DirLock:
        path = self.directory / LOCK
        self.created = [d for d in [path, self.directory, *self.directory.parents] if not d.exists()]
        self.directory.mkdir(parents=True, exist_ok=True)
        while True:
            file = open(path, "a+")  # noqa: SIM115  held open: the lock lasts as long as the file is open
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.seek(0)
                holder = file.read().strip() or "another process"
                file.close()
                self.created = []
                raise BadInput(
                    f"{self.directory} is being written by {holder}. Wait for it to finish, or stop it "
                    "(its checkpoint lets you rerun or --resume), then try again."
                ) from None
            # A releasing holder may have removed the file between our open and our lock: lock the file that
            # is at the path now, or two processes would each hold a lock of their own.
            if path.exists() and os.path.samestat(os.fstat(file.fileno()), path.stat()):
                break
            file.close()
        file.seek(0)
        file.truncate()
        command = " ".join(["testbed", *sys.argv[1:]]) if sys.argv else "python"
        file.write(f"pid {os.getpid()} on {socket.gethostname()} ({command}, since {time.strftime('%H:%M:%S')})")
        file.flush()
        self.file = file
        return self

    def release(self, undo: bool = False) -> None:
        """Release the lock. ``undo`` (the command failed), or a directory left holding nothing but the lock:
        remove what :meth:`acquire` created, the lock file and the folders, where they are empty."""
        if self.file is None:
            return
        try:
            if undo or [p.name for p in self.directory.iterdir()] == [LOCK]:
                for made in self.created:  # the lock file first, while still held: see acquire()
                    made.unlink() if made.name == LOCK else made.rmdir()
        except OSError:
            pass  # a folder someone has written into stays, as does anything that cannot be removed
        self.file.close()  # closing the descriptor releases the flock
        self.file = None

    def __enter__(self) -> DirLock:
        return self if self.file is not None else self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.release(undo=exc_type is not None and not issubclass(exc_type, KeyboardInterrupt))


def lock_holder(directory: Path) -> str | None:
    """Who holds ``directory``'s lock, or None when nobody does."""
    path = directory / LOCK
    if not path.exists():
        return None
    with open(path) as file:
        try:
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return file.read().strip() or "another process"
    return None


def prepare_run_dir(run_dir: Path, resume: bool) -> DirLock:
    """Lock ``run_dir`` for this process and check its state; returns the held lock.

    A new run needs a directory that is absent, empty, or left by a start that never reached its first
    checkpoint (only the files of :data:`RESTARTABLE` and TensorBoard events): those files are removed,
    since without a checkpoint nothing in them can be continued. A resumed run needs ``checkpoint.pt``.
    """
    if resume and not (run_dir / CHECKPOINT).exists():
        raise BadInput(
            f"--resume: {run_dir} holds no {CHECKPOINT}, so there is nothing to continue. "
            "Run the same command without --resume to start it again."
        )
    lock = DirLock(run_dir).acquire()
    try:
        if resume:
            return lock
        # plots/ is `testbed plot`'s, of the attempt that stopped: kept, and redrawn by the next plot
        entries = [p for p in run_dir.iterdir() if p.name != LOCK and not (p.name == "plots" and p.is_dir())]
        stale = [
            p
            for p in entries
            if p.is_file() and (p.name in RESTARTABLE or p.name.startswith(("events.out", "meta.resume", ".")))
        ]
        if (run_dir / CHECKPOINT).exists():
            raise BadInput(
                f"run directory {run_dir} already exists and holds a checkpoint. Pass --resume to continue "
                "it, or choose another --run-dir."
            )
        if len(stale) != len(entries):
            others = sorted(p.name for p in entries if p not in stale)
            raise BadInput(
                f"run directory {run_dir} holds files that are not a run's ({brief(others)}); move them "
                "away, or choose another --run-dir."
            )
        for path in stale:
            path.unlink()
        return lock
    except BaseException:
        lock.release(undo=True)
        raise


def config_to_dict(config: Any) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}


def write_config(run_dir: Path, algo: str, config: Any) -> None:
    text = yaml.safe_dump({"algo": algo, **config_to_dict(config)}, sort_keys=False)
    atomic_write_text(run_dir / "config.yaml", text)


def read_config(run_dir: Path) -> dict[str, Any]:
    """The run's ``config.yaml`` as a mapping; a missing, unreadable or malformed file is bad input."""
    path = run_dir / "config.yaml"
    if not path.exists():
        raise BadInput(f"{run_dir} has no config.yaml: it is not a run directory")
    try:
        values = load_yaml(path.read_bytes(), "it")
    except BadInput as error:
        raise BadInput(f"{path} cannot be read ({error}). Restore it: the run's settings are in it.") from None
    if not isinstance(values, dict) or not isinstance(values.get("algo"), str):
        raise BadInput(f"{path} is not a run's config (a mapping with algo and env_id). Restore it.")
    return values


def config_differences(run_dir: Path, algo: str, cfg: Any) -> list[str]:
    """The settings in which the run in ``run_dir`` (its config.yaml) differs from ``cfg``, a config of
    ``algo``: empty when it is the run ``cfg`` asks for. Compared as typed values, so ``3e-4`` and
    ``0.0003`` agree; a key config.yaml lacks takes its default, as a resume would read it."""
    saved = read_config(run_dir)
    if saved.pop("algo") != algo:
        return ["algo"]
    asked = config_to_dict(cfg)
    try:
        had = config_to_dict(build_config(type(cfg), saved))
    except BadInput:  # a key this version no longer has, or a value it refuses
        return sorted(set(saved) - set(asked)) or ["values this version refuses"]
    return sorted(key for key in asked if asked[key] != had[key])


def other_code_version(run_dir: Path) -> int | None:
    """The code version, other than today's :data:`CODE_VERSION`, that trained (part of) the run in ``run_dir``:
    one its meta.json or a resume's meta.resume*.json records; None when none does. A start made before runs
    recorded their code version counts as today's, so that runs trained earlier still resume."""
    for path in sorted(run_dir.glob("meta*.json")):
        try:
            version = json.loads(path.read_bytes()).get("code_version")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(version, int) and version != CODE_VERSION:
            return version
    return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_model() -> str:
    """The CPU's model name, from /proc/cpuinfo where there is one. A run's numbers on the CPU repeat on the
    same model: another one can round floats differently in places (its vector kernels), and chaotic envs
    (Walker2d, Humanoid) turn that into other episodes."""
    cpuinfo = Path("/proc/cpuinfo")
    try:
        for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def write_meta(run_dir: Path, extra: dict[str, Any] | None = None) -> None:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    meta = {
        "command": ["testbed", *sys.argv[1:]],  # not the script's path: a record names no machine's folders
        "git_commit": _git_commit(),
        "code_version": CODE_VERSION,
        "python": platform.python_version(),
        "packages": versions,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "start_time": time.strftime(TIME_FORMAT),
        **(extra or {}),
    }
    name = "meta.json" if not (run_dir / "meta.json").exists() else f"meta.resume{int(time.time())}.json"
    atomic_write_text(run_dir / name, json.dumps(meta, indent=2))


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
    atomic_write_text(run_dir / "summary.json", json.dumps(clean, indent=2))


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """summary.json as written, or None when the run has not written one (yet).

    A file that is not a JSON object (cut short by a full disk, edited by hand, not UTF-8) is BadInput
    naming it, never a traceback: every reader of run directories goes through here.
    """
    path = run_dir / "summary.json"
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as error:
        problem = f"cannot be read ({error.strerror})"
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        problem = f"is not valid JSON ({error})"
    else:
        if isinstance(summary, dict):
            return summary
        problem = "holds JSON that is not an object ({...})"
    raise BadInput(
        f"{path} {problem}. Delete it: rerunning the bench then resumes that run from its checkpoint, "
        "or starts it again if it has none."
    )


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a temporary file, fsync, rename; no temporary file is left behind."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
