"""A run directory: config, metadata, TensorBoard, progress.csv, checkpoints and summary.json.

Layout (see ``runs/README.md``)::

    RUN_DIR/config.yaml     resolved config          RUN_DIR/progress.csv   one row per iteration
    RUN_DIR/meta.json       command, git, versions   RUN_DIR/checkpoint.pt  latest good checkpoint
    RUN_DIR/events.out...   TensorBoard              RUN_DIR/summary.json   final status and eval

Checkpoints are written atomically (temporary file, fsync, rename) and loaded with
``torch.load(weights_only=True)``: tensors and plain data only, never arbitrary pickled code.
"""

from __future__ import annotations

import csv
import dataclasses
import fcntl
import io
import json
import math
import os
import pickle
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from agents.config import build_config, load_yaml
from envs.errors import BadInput, brief

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_FORMAT = 1
PACKAGES = ("torch", "gymnasium", "numpy", "stable-baselines3", "mujoco", "box2d", "tensorboard")


# ── run directory ────────────────────────────────────────────────────────────────────────────────


LOCK = ".lock"
# What a start writes before its first checkpoint: a directory holding only these can be started again.
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
            file = open(path, "a+")
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.seek(0)
                holder = file.read().strip() or "another process"
                file.close()
                self.created = []
                raise BadInput(f"{self.directory} is being written by {holder}. Wait for it to finish, or stop it "
                               "(its checkpoint lets you rerun or --resume), then try again.") from None  # fmt: skip
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
        raise BadInput(f"--resume: {run_dir} holds no {CHECKPOINT}, so there is nothing to continue. "
                       "Run the same command without --resume to start it again.")  # fmt: skip
    lock = DirLock(run_dir).acquire()
    try:
        if resume:
            return lock
        entries = [p for p in run_dir.iterdir() if p.name != LOCK]
        stale = [p for p in entries if p.is_file() and (p.name in RESTARTABLE or p.name.startswith(("events.out",
                 "meta.resume", ".")))]  # fmt: skip
        if (run_dir / CHECKPOINT).exists():
            raise BadInput(f"run directory {run_dir} already exists and holds a checkpoint. Pass --resume to continue "
                           "it, or choose another --run-dir.")  # fmt: skip
        if len(stale) != len(entries):
            others = sorted(p.name for p in entries if p not in stale)
            raise BadInput(f"run directory {run_dir} holds files that are not a run's ({brief(others)}); move them "
                           "away, or choose another --run-dir.")  # fmt: skip
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


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_meta(run_dir: Path, extra: dict[str, Any] | None = None) -> None:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    meta = {
        "command": sys.argv,
        "git_commit": _git_commit(),
        "python": platform.python_version(),
        "packages": versions,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **(extra or {}),
    }
    name = "meta.json" if not (run_dir / "meta.json").exists() else f"meta.resume{int(time.time())}.json"
    atomic_write_text(run_dir / name, json.dumps(meta, indent=2))


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
    atomic_write_text(run_dir / "summary.json", json.dumps(clean, indent=2))


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


# ── checkpoints ──────────────────────────────────────────────────────────────────────────────────


def _to_safe(value: Any) -> Any:
    """numpy arrays become tagged tensors, so weights-only loading accepts them."""
    if isinstance(value, np.ndarray):
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(value))}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _to_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_safe(v) for v in value]
    return value


def _from_safe(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__ndarray__"}:
            return value["__ndarray__"].numpy()
        return {k: _from_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_safe(v) for v in value]
    return value


def save_checkpoint(run_dir: Path, payload: dict[str, Any]) -> None:
    """Write ``checkpoint.pt`` atomically: a crash mid-write leaves the previous checkpoint intact."""
    path = run_dir / CHECKPOINT
    tmp = run_dir / f".{CHECKPOINT}.tmp"
    # Serialized in memory, then written by Python: a full disk is then an OSError naming its cause, where
    # torch's own writer reports it as a RuntimeError ("unexpected pos …") that reads like a crash.
    buffer = io.BytesIO()
    torch.save({"format": CHECKPOINT_FORMAT, **_to_safe(payload)}, buffer)
    try:
        with open(tmp, "wb") as f:
            f.write(buffer.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(run_dir: Path, expected: dict[str, Any]) -> dict[str, Any]:
    """Load ``checkpoint.pt`` with weights-only unpickling; check it belongs to this kind of run.

    ``expected`` maps keys (e.g. ``algo``, ``env_id``) to the values the checkpoint must hold.
    """
    path = run_dir / CHECKPOINT
    if not path.exists():
        raise BadInput(f"{run_dir} holds no {CHECKPOINT}, so there is nothing to continue or evaluate. A run stopped "
                       "before its first checkpoint starts again with the same command, without --resume.")  # fmt: skip
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001  any unpickling failure means the same thing to the user
        # torch's own message suggests weights_only=False, i.e. running the file's code: never here.
        first_line = (str(error).splitlines() or ["no detail"])[0]
        why = ("it holds objects other than tensors and plain data, which this testbed never unpickles"
               if isinstance(error, pickle.UnpicklingError) else f"{type(error).__name__}: {first_line}")
        raise BadInput(
            f"{path} is corrupted or not a checkpoint of this testbed ({why}). "
            "Start a new run in another directory, or restore the file from a backup."
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise BadInput(f"{path} has an incompatible checkpoint format; start a new run.")
    for key, value in expected.items():
        if payload.get(key) != value:
            raise BadInput(f"{path} was written for {key}={payload.get(key)!r}, not {value!r}; it cannot be used here.")
    return _from_safe(payload)


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(legacy=False)}


def load_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])


# ── metrics: TensorBoard and progress.csv ────────────────────────────────────────────────────────


class MetricLog:
    """TensorBoard scalars (CleanRL's tags, env steps on the x-axis) and a CSV row per iteration.

    On resume it appends to the same event directory and CSV, dropping anything logged after the
    checkpoint's step, so the curves have neither gaps nor duplicates: the CSV is cut back to the size
    it had when the checkpoint was written (``csv_bytes``; older checkpoints: to the rows up to its
    step), and TensorBoard drops the events after that step.
    """

    def __init__(
        self, run_dir: Path, columns: list[str], resume_step: int | None, csv_bytes: int | None = None
    ) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.columns = ["global_step", "wall_time_s", *columns]
        # purge_step hides every event at or after it: the checkpoint's own step was logged and stays.
        self.writer = SummaryWriter(str(run_dir), purge_step=None if resume_step is None else resume_step + 1)
        self.csv_path = run_dir / "progress.csv"
        if resume_step is not None and self.csv_path.exists():
            if csv_bytes is not None:
                with open(self.csv_path, "r+b") as f:
                    f.truncate(csv_bytes)
            else:
                with open(self.csv_path, newline="") as f:
                    rows = [row for row in csv.DictReader(f) if int(row["global_step"]) <= resume_step]
                atomic_write_text(self.csv_path, self._csv_text(rows))
        else:
            atomic_write_text(self.csv_path, self._csv_text([]))
        self.csv_file = open(self.csv_path, "a", newline="")
        self.csv_writer = csv.DictWriter(self.csv_file, fieldnames=self.columns, extrasaction="ignore")

    def _csv_text(self, rows: list[dict[str, str]]) -> str:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=self.columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        return text.getvalue()

    def csv_bytes(self) -> int:
        """The size of progress.csv as written so far (call after :meth:`flush`)."""
        return self.csv_file.tell()

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        for tag, value in values.items():
            if value is not None and math.isfinite(value):
                self.writer.add_scalar(tag, value, step)

    def row(self, step: int, wall_time_s: float, values: dict[str, float | None]) -> None:
        """One progress.csv row; TensorBoard tags (``charts/SPS``) become columns (``charts/SPS``)."""
        row = {"global_step": step, "wall_time_s": round(wall_time_s, 3)}
        row.update({k: ("" if v is None or not math.isfinite(v) else v) for k, v in values.items()})
        self.csv_writer.writerow(row)

    def hparams(self, config: dict[str, Any], metrics: dict[str, float]) -> None:
        flat = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in config.items()}
        self.writer.add_hparams(flat, {f"hparam/{k}": v for k, v in metrics.items()}, run_name=".")

    def flush(self) -> None:
        self.writer.flush()
        self.csv_file.flush()
        os.fsync(self.csv_file.fileno())

    def close(self) -> None:
        self.flush()
        self.writer.close()
        self.csv_file.close()


# ── progress on the terminal ─────────────────────────────────────────────────────────────────────


class Progress:
    """A tqdm bar on a terminal; plain lines every ``every_s`` seconds elsewhere (CI, files)."""

    def __init__(self, total: int, initial: int, label: str, every_s: float = 10.0) -> None:
        self.interactive = sys.stderr.isatty()
        self.total, self.label, self.every_s = total, label, every_s
        self.last_print = 0.0
        if self.interactive:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", unit_scale=True, desc=label, dynamic_ncols=True)

    def update(self, step: int, sps: float, recent_return: float | None) -> None:
        ret = "n/a" if recent_return is None else f"{recent_return:.1f}"
        if self.interactive:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix_str(f"return={ret}", refresh=False)
        elif time.monotonic() - self.last_print >= self.every_s or step >= self.total:
            self.last_print = time.monotonic()
            print(f"[{self.label}] step {step}/{self.total}  {sps:.0f} steps/s  recent return {ret}", flush=True)

    def close(self) -> None:
        if self.interactive:
            self.bar.close()


# ── signals ──────────────────────────────────────────────────────────────────────────────────────


PARENT_PID = "TESTBED_PARENT_PID"


class StopFlag:
    """Turns SIGINT and SIGTERM into a flag the training loop checks between iterations.

    The loop then checkpoints, writes ``summary.json`` with status ``interrupted``, flushes and exits.
    A second signal stops at once. A trainer started by a bench driver (``TESTBED_PARENT_PID`` in its
    environment) also stops this way when that driver dies: it runs in its own process session, so
    nothing else would stop it, and it would keep writing beside a rerun.
    """

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}
        self._watching = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signum

    def _watch_parent(self, parent: int) -> None:
        while self._watching:
            if os.getppid() != parent:  # re-parented: the driver is gone
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.1)

    def __enter__(self) -> StopFlag:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals to the caller
                pass
        parent = os.environ.get(PARENT_PID, "")
        if parent.isdigit() and self._previous:
            self._watching = True
            threading.Thread(target=self._watch_parent, args=(int(parent),), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._watching = False
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def raised(self) -> bool:
        return self.signal is not None


class NonFiniteError(RuntimeError):
    """A loss or a parameter became NaN or inf."""


def check_finite(losses: dict[str, float], model: torch.nn.Module) -> None:
    bad = [k for k, v in losses.items() if not math.isfinite(v)]
    bad += [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise NonFiniteError(
            f"non-finite values in {', '.join(bad)}; training stopped and the last good checkpoint is kept. "
            "Lower the learning rate or enable gradient clipping and normalization."
        )
