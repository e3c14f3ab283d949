"""What a committed result keeps of its runs, and how a rerun gets them back.

A run is bit-identical given its config, seed and code (on the CPU), so its checkpoint is a cache and not
a record. The record is small: for each run that ended (``summary.json`` says ``completed`` or ``failed``),
a result keeps

- ``config.yaml``, the resolved config;
- ``meta.json`` (and a resumed run's ``meta.resume*.json``): command, commit, machine, versions;
- ``summary.json``, its status and final evaluation;
- ``progress.csv.gz``: its curves, every evaluation row and the last row kept, and of the training rows the
  first in each of :data:`SPANS` equal spans of env steps, each row byte for byte.

Each run is kept at its path under the command's output, so a result's folder reads as the bench or study
that made it: ``testbed report``, ``testbed plot``, ``--reuse-from`` and ``lab.committed`` take it as it is.
No checkpoint, optimizer state, TensorBoard event file or console log is kept; nor is a run a bench adopted
from another result with ``--reuse-from``, which that result already holds.

Before a result's command runs again, :func:`restore_runs` copies its kept runs back into the output, where
the command recognises them as finished (``summary.json``) and trains only what is missing. A run trained
with ``keep_checkpoints`` (an audit's policies) is kept for its numbers but not restored: what reads it
needs its checkpoints, so its command trains it again, to the same numbers.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from agents.config import load_yaml
from agents.rundir import other_code_version, read_summary
from envs.errors import BadInput
from lab.results import EVAL_COLUMN, KEPT_PROGRESS

SPANS = 100
"""The training rows kept: the first in each of this many equal spans of env steps."""
ENDED = ("completed", "failed")


def thin_progress(text: str, spans: int = SPANS) -> str:
    """A progress.csv's rows as a committed result keeps them, byte for byte: the header, every row with an
    evaluation, the last row, and of the other rows the first in each of ``spans`` equal spans of
    ``[0, last global_step]``. Rows whose ``global_step`` does not parse are dropped.

    Thinning its own output changes nothing: the first row of a span is still the first of its span, and the
    last row and the evaluations stay."""
    lines = text.splitlines(keepends=True)
    if not lines:
        return ""
    header = next(csv.reader([lines[0]]))
    eval_at = header.index(EVAL_COLUMN) if EVAL_COLUMN in header else None
    rows: list[tuple[int, bool, str]] = []  # (global_step, has an evaluation, the line as written)
    for line in lines[1:]:
        cells = next(csv.reader([line]), [])
        try:
            step = int(cells[0])
        except (IndexError, ValueError):
            continue
        value = cells[eval_at] if eval_at is not None and eval_at < len(cells) else ""
        rows.append((step, _finite(value), line))
    if not rows:
        return lines[0]
    last = max(rows[-1][0], 1)
    seen: set[int] = set()
    kept = []
    for i, (step, evaluated, line) in enumerate(rows):
        span = min(spans - 1, max(step, 0) * spans // last)
        first_of_span = span not in seen
        seen.add(span)
        if evaluated or first_of_span or i == len(rows) - 1:
            kept.append(line if line.endswith("\n") else line + "\n")
    return lines[0] + "".join(kept)


def _finite(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def ended(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run that ended: a config and a summary that says completed or failed."""
    if not (run_dir / "config.yaml").is_file():
        return False
    try:
        summary = read_summary(run_dir)
    except BadInput:
        return False
    return summary is not None and summary.get("status") in ENDED


def run_dirs(folder: Path) -> Iterator[Path]:
    """The run directories at or below ``folder`` (each holds a config.yaml), hidden folders and a run's own
    subfolders not searched."""
    if (folder / "config.yaml").is_file():
        yield folder
        return
    if folder.is_dir():
        for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
            yield from run_dirs(child)


def without_machine_paths(meta: bytes) -> bytes:
    """A meta.json as a result keeps it: its command starting ``testbed``, not the path of the script that ran on
    some machine (runs made before meta.json wrote it so); otherwise as written."""
    try:
        record = json.loads(meta)
        command = record["command"]
    except (ValueError, KeyError, TypeError):
        return meta
    if not command or command[0] == "testbed":
        return meta
    return (json.dumps({**record, "command": ["testbed", *command[1:]]}, indent=2)).encode()


def keep_run(run_dir: Path, target: Path) -> None:
    """Write what a result keeps of ``run_dir`` into ``target`` (made or replaced): staged beside it and
    renamed into place, so that a stop leaves the old copy or the new, never half of one."""
    staging = target.with_name(f".{target.name}.keeping")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in ("config.yaml", "summary.json"):
        shutil.copy2(run_dir / name, staging / name)
    for meta in sorted(run_dir.glob("meta*.json")):
        (staging / meta.name).write_bytes(without_machine_paths(meta.read_bytes()))
    progress = run_dir / "progress.csv"
    if progress.exists():
        text = thin_progress(progress.read_text(encoding="utf-8", errors="surrogateescape"))
        data = text.encode("utf-8", errors="surrogateescape")
    elif (run_dir / KEPT_PROGRESS).exists():  # already kept: thinning again changes nothing
        data = thin_progress(gzip.decompress((run_dir / KEPT_PROGRESS).read_bytes()).decode()).encode()
    else:
        data = b""
    if data:
        # No name or time in the gzip header: the same rows give the same bytes.
        (staging / KEPT_PROGRESS).write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def _same_run(a: Path, b: Path) -> bool:
    """Whether two run directories hold the same run: the same config and summary, byte for byte."""
    return all(
        (b / name).is_file() and (a / name).read_bytes() == (b / name).read_bytes()
        for name in ("config.yaml", "summary.json")
    )


def keep_runs(output: Path, folder: Path, adopted_from: Sequence[Path] = ()) -> list[Path]:
    """Keep every run that ended under ``output`` at its path under ``folder``; the paths kept (relative).

    A run the same as one in ``adopted_from`` (the folders a bench's ``--reuse-from`` names) is not kept
    twice: the result it came from holds it. A kept run that is no longer under ``output`` stays kept."""
    kept = []
    for run_dir in run_dirs(output):
        relative = run_dir.relative_to(output)
        if not ended(run_dir) or any(_same_run(run_dir, source / relative) for source in adopted_from):
            continue
        keep_run(run_dir, folder / relative)
        kept.append(relative)
    return kept


def restores(run_dir: Path) -> bool:
    """Whether a kept run is restored before its command runs again: not one trained with ``keep_checkpoints``,
    whose readers (an audit) need the checkpoints the command trains again."""
    config = load_yaml((run_dir / "config.yaml").read_bytes(), str(run_dir / "config.yaml"))
    return not (isinstance(config, dict) and config.get("keep_checkpoints"))


def restore_runs(folder: Path, output: Path) -> list[Path]:
    """Copy the runs kept under ``folder`` to their paths under ``output`` where the output holds no files of
    its own there (a run of this checkout is newer than, or the same as, the kept one); the paths restored.
    A run older code trained (its meta.json's code version) stays kept but is not restored: the command trains
    it again, as today's code computes it."""
    restored = []
    for kept in run_dirs(folder):
        relative = kept.relative_to(folder)
        target = output / relative
        if not ended(kept) or not restores(kept) or other_code_version(kept) is not None:
            continue
        if target.is_dir() and any(target.iterdir()):
            continue
        copy_run_into(kept, target, "restoring")
        restored.append(relative)
    return restored


def copy_run_into(source: Path, target: Path, doing: str) -> None:
    """Copy the run directory ``source`` to ``target``, absent or empty, through a hidden folder beside it
    (``.NAME.<doing>``) renamed into place: a stop mid-copy leaves ``target`` as it was, never holding part of
    a run (reports do not read hidden folders). Hidden files, a writer's lock, stay behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.{doing}")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, ignore=shutil.ignore_patterns(".*"))
    if target.exists():
        target.rmdir()  # empty: the caller checked
    staging.rename(target)
