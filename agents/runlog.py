"""What a run writes as it trains: TensorBoard and progress.csv, checkpoints, the progress line, and how stop
signals and non-finite values end it. The rest of its directory (lock, config.yaml, meta.json, summary.json)
is :mod:`agents.rundir`'s.

Checkpoints are written atomically (temporary file, fsync, rename) and loaded with
``torch.load(weights_only=True)``: tensors and plain data only, never arbitrary pickled code.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import pickle
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.rundir import CHECKPOINT, PARENT_PID, atomic_write_text, lock_holder, write_summary
from envs.errors import BadInput

CHECKPOINT_FORMAT = 1


# ── checkpoints ──────────────────────────────────────────────────────────────────────────────────


def _to_safe(value: Any) -> Any:
    """numpy arrays become tagged tensors, so weights-only loading accepts them; a tensor that views part of a
    larger one becomes a copy of its own."""
    if isinstance(value, torch.Tensor) and value.untyped_storage().nbytes() > value.nbytes:
        # torch.save writes a view's whole storage: a stacked seed's weights are views of one (S, P) tensor,
        # so each seed's checkpoint would hold every seed's weights.
        return value.clone()
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


def keep_checkpoint(run_dir: Path, name: str) -> None:
    """Copy ``checkpoint.pt`` to ``name`` atomically: a kept policy is never half written."""
    tmp = run_dir / f".{name}.tmp"
    try:
        shutil.copyfile(run_dir / CHECKPOINT, tmp)
        os.replace(tmp, run_dir / name)
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(run_dir: Path, expected: dict[str, Any], name: str = CHECKPOINT) -> dict[str, Any]:
    """Load ``checkpoint.pt`` (or a kept ``name``) with weights-only unpickling; check it belongs to this kind
    of run.

    ``expected`` maps keys (e.g. ``algo``, ``env_id``) to the values the checkpoint must hold.
    """
    path = run_dir / name
    if not path.exists():
        raise BadInput(
            f"{run_dir} holds no {name}, so there is nothing to continue or evaluate. A run stopped "
            "before its first checkpoint starts again with the same command, without --resume."
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001  any unpickling failure means the same thing to the user
        # torch's own message suggests weights_only=False, i.e. running the file's code: never here.
        first_line = (str(error).splitlines() or ["no detail"])[0]
        why = (
            "it holds objects other than tensors and plain data, which this testbed never unpickles"
            if isinstance(error, pickle.UnpicklingError)
            else f"{type(error).__name__}: {first_line}"
        )
        raise BadInput(
            f"{path} is corrupted or not a checkpoint of this testbed ({why}). "
            "Start a new run in another directory, or restore the file from a backup."
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise BadInput(f"{path} has an incompatible checkpoint format; start a new run.")
    for key, value in expected.items():
        if payload.get(key) != value:
            raise BadInput(f"{path} was written for {key}={payload.get(key)!r}, not {value!r}; it cannot be used here.")
    bad = non_finite_entries(payload)
    if bad:
        # A policy of NaN weights acts by tracebacks (torch.multinomial) and evaluates to any number at all.
        where = ", ".join(bad[:3]) + (" …" if len(bad) > 3 else "")
        raise NonFiniteCheckpoint(
            f"{path} holds NaN or inf values (in {where}), so neither a resume nor an evaluation can use it: the run "
            "diverged before this checkpoint was written. Start the run again in a new folder (a lower learning rate "
            "or gradient clipping keeps it finite), or restore the file from a backup.",
            int(payload.get("global_step") or 0),
        )
    return _from_safe(payload)


UNCHECKED_ENTRIES = ("rng", "env_state", "rollout")
"""Checkpoint entries that hold the envs' and generators' state, not what was learned: left to their owners."""


def non_finite_entries(payload: dict[str, Any]) -> list[str]:
    """The dotted names of a checkpoint's floating tensors and arrays that hold a NaN or an inf: the model, the
    optimizer state, the normalizer statistics and whatever else an agent learned."""
    bad: list[str] = []

    def visit(value: Any, name: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if not (name == "" and key in UNCHECKED_ENTRIES):
                    visit(item, f"{name}.{key}" if name else str(key))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(item, f"{name}[{i}]")
        elif isinstance(value, torch.Tensor) and value.is_floating_point() and not torch.isfinite(value).all():
            bad.append(name.removesuffix(".__ndarray__"))

    visit(payload, "")
    return bad


class NonFiniteCheckpoint(BadInput):
    """A checkpoint with NaN or inf values: the run diverged. ``global_step``: the checkpoint's step."""

    def __init__(self, message: str, global_step: int) -> None:
        super().__init__(message)
        self.global_step = global_step


def record_diverged(run_dir: Path, error: NonFiniteCheckpoint, run: dict[str, Any]) -> None:
    """Record in ``run_dir``'s summary.json that a resume found its checkpoint non-finite: failed and diverged,
    so that a bench keeps it as it is rather than retrying it (the same config and seed diverge again).
    ``run``: what the summary says the run is (algo, env_id, seed). Left alone while another process writes
    the run directory."""
    holder = lock_holder(run_dir)
    if holder is not None and not holder.startswith(f"pid {os.getpid()} "):
        return
    write_summary(
        run_dir, {**run, "status": "failed", "total_steps": error.global_step, "error": str(error), "diverged": True}
    )


def check_progress(run_dir: Path, csv_bytes: int | None) -> None:
    """BadInput, before a resume writes anything, if progress.csv is missing or shorter than the checkpoint
    recorded (``csv_bytes``; None for older checkpoints, which recorded no size): cut back to that size it would
    be padded with NUL bytes, and started afresh it would lose every row before the checkpoint."""
    path = run_dir / "progress.csv"
    fix = f"Restore {path.name} from a backup, or start the run again in a new folder."
    if not path.exists():
        raise BadInput(
            f"{path} is missing, but the run has a checkpoint ({CHECKPOINT}): a resume would lose every "
            f"row before it. {fix}"
        )
    size = path.stat().st_size
    if csv_bytes is not None and size < csv_bytes:
        raise BadInput(
            f"{path} holds {size:,} bytes, fewer than the {csv_bytes:,} that {run_dir / CHECKPOINT} "
            f"recorded: rows were deleted, and a resume would leave a gap in the curve. {fix}"
        )


def recorded_csv_bytes(run_dir: Path) -> int | None:
    """How far progress.csv went when ``run_dir``'s checkpoint was written; None without a readable
    checkpoint, or for an older one that did not record it. For readers that warn about a shortened file."""
    try:
        payload = torch.load(run_dir / CHECKPOINT, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001  absent, corrupt or foreign: refused where a resume or eval loads it
        return None
    size = payload.get("csv_bytes") if isinstance(payload, dict) else None
    return size if isinstance(size, int) else None


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
        self,
        run_dir: Path,
        columns: list[str],
        resume_step: int | None,
        csv_bytes: int | None = None,
        episodes: bool = False,
    ) -> None:
        """``episodes``: also write every training episode to ``episodes.csv`` (:class:`EpisodeLog`)."""
        from torch.utils.tensorboard import SummaryWriter  # here: TensorBoard takes a second; `eval` needs none

        self.columns = ["global_step", "wall_time_s", *columns]
        if resume_step is not None:  # before the event file below is made: a refused resume writes nothing
            check_progress(run_dir, csv_bytes)
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
        self.csv_file = open(self.csv_path, "a", newline="")  # noqa: SIM115  open for the run: closed by close()
        self.csv_writer = csv.DictWriter(self.csv_file, fieldnames=self.columns, extrasaction="ignore")
        self.episodes = EpisodeLog(run_dir, resume_step) if episodes else None

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
        # Readers follow the file as it grows (a study's pruner, `testbed board`): a buffer would hold back some
        # 25 rows, and a pruned trial would train on until it filled. One write per iteration costs nothing.
        self.csv_file.flush()

    def fill_last_row(self, step: int, values: dict[str, float]) -> None:
        """Put ``values`` into the last row of progress.csv, the one of ``step`` (a final evaluation that a stop
        kept out of it, made when the run was resumed), so that the file reads as if it had never stopped."""
        self.csv_file.flush()
        with open(self.csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows or rows[-1].get("global_step") != str(step):
            raise RuntimeError(f"{self.csv_path} does not end with the row of step {step}")
        rows[-1].update({k: v for k, v in values.items() if math.isfinite(v)})
        self.csv_file.close()
        atomic_write_text(self.csv_path, self._csv_text(rows))
        self.csv_file = open(self.csv_path, "a", newline="")  # noqa: SIM115  open for the run: closed by close()
        self.csv_writer = csv.DictWriter(self.csv_file, fieldnames=self.columns, extrasaction="ignore")

    def hparams(self, config: dict[str, Any], metrics: dict[str, float]) -> None:
        flat = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in config.items()}
        self.writer.add_hparams(flat, {f"hparam/{k}": v for k, v in metrics.items()}, run_name=".")

    def flush(self) -> None:
        self.writer.flush()
        self.csv_file.flush()
        os.fsync(self.csv_file.fileno())
        if self.episodes is not None:
            self.episodes.flush()

    def close(self) -> None:
        self.flush()
        self.writer.close()
        self.csv_file.close()
        if self.episodes is not None:
            self.episodes.close()


class EpisodeLog:
    """``episodes.csv``: one row per training episode, in the order they ended: ``global_step`` (of the iteration
    that logged it), ``episode`` (1, 2, …), ``return``, ``length`` and ``last_reward`` (the raw reward of its last
    step). Runs of bsuite envs write it: bsuite scores a run by its episodes (``lab.bsuite_scores``).

    On resume the rows after the checkpoint's step are dropped and the count goes on from the rows kept, so a
    resumed run's file reads as if it had never stopped."""

    COLUMNS = ("global_step", "episode", "return", "length", "last_reward")

    def __init__(self, run_dir: Path, resume_step: int | None) -> None:
        self.path = run_dir / "episodes.csv"
        rows: list[dict[str, str]] = []
        if resume_step is not None and self.path.exists():
            with open(self.path, newline="") as f:
                rows = [row for row in csv.DictReader(f) if int(row["global_step"]) <= resume_step]
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=self.COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(self.path, text.getvalue())
        self.episodes = len(rows)
        self.file = open(self.path, "a", newline="")  # noqa: SIM115  open for the run: closed by close()
        self.writer = csv.writer(self.file)

    def write(self, step: int, returns: list[float], lengths: list[float], last_rewards: list[float]) -> None:
        for ret, length, last in zip(returns, lengths, last_rewards, strict=True):
            self.episodes += 1
            self.writer.writerow([step, self.episodes, float(ret), int(length), float(last)])

    def flush(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.flush()
        self.file.close()


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


class StopFlag:
    """Turns SIGINT and SIGTERM into a flag the training loop checks between iterations.

    The loop then checkpoints, writes ``summary.json`` with status ``interrupted``, flushes and exits.
    A second signal stops at once. A trainer started by a bench driver (``TESTBED_PARENT_PID`` in its
    environment) also stops this way when that driver dies: it runs in its own process session, so
    nothing else would stop it, and it would keep writing beside a rerun.
    """

    active: StopFlag | None = None
    """The flag of the run training in this process, for :func:`request_stop`."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}
        self._watching = False

    def request(self) -> None:
        """Stop as a first signal would: at the end of this iteration, with a checkpoint (a callback's stop)."""
        if self.signal is None:
            self.signal = signal.SIGINT

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
            with contextlib.suppress(ValueError):  # not the main thread: leave signals to the caller
                self._previous[sig] = signal.signal(sig, self._handle)
        parent = os.environ.get(PARENT_PID, "")
        if parent.isdigit() and self._previous:
            self._watching = True
            threading.Thread(target=self._watch_parent, args=(int(parent),), daemon=True).start()
        StopFlag.active = self
        return self

    def __exit__(self, *exc: object) -> None:
        StopFlag.active = None
        self._watching = False
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def raised(self) -> bool:
        return self.signal is not None


def request_stop() -> bool:
    """Stop the run training in this process at the end of its iteration, with a checkpoint, as Ctrl-C does;
    False when none is training."""
    flag = StopFlag.active
    if flag is not None:
        flag.request()
    return flag is not None


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
