"""What a committed result keeps of its runs, and how a rerun gets them back.

A run is bit-identical given its config, seed and code (on the CPU), so its checkpoint is a cache and not
a record. For each run that ended (``summary.json`` says ``completed`` or ``failed``), a result keeps its
``config.yaml``, ``meta*.json``, ``summary.json`` and its curves thinned (:func:`thin_progress`) as
``progress.csv.gz`` (and a bsuite run's ``episodes.csv`` as bsuite's own log of them, ``bsuite_log.csv.gz``), at
its path under the command's output, so that a result's folder reads as the bench or study that made it
(``testbed report``, ``--reuse-from`` and ``lab.committed`` take it as it is).

Before a result's command runs again, :func:`restore_runs` copies its kept runs back into the output, where
the command recognises them as finished and trains only what is missing. A run trained with
``keep_checkpoints`` (an audit's policies) is not restored: what reads it needs its checkpoints, so its
command trains it again, to the same numbers.
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
from lab.bsuite_study import kept_log
from lab.results import EVAL_COLUMN, KEPT_BSUITE_LOG, KEPT_PROGRESS

SPANS = 100
"""The training rows kept: the first in each of this many equal spans of env steps."""
BSUITE_SPANS = 20
"""The training rows kept of a bsuite run, whose record of learning is bsuite's log of its episodes: its score
reads that log and its curves the evaluation rows, kept whole, so a fifth of other runs' training rows is kept
(a study of bsuite's sweeps holds hundreds of runs)."""
RECORD = ("config.yaml", "summary.json")
"""The files that make a folder a run that ended, and that tell two runs apart."""


def thin_progress(text: str, spans: int = SPANS) -> str:
    """A progress.csv's rows as a committed result keeps them, byte for byte: the header, every row with an
    evaluation, the last row, and of the other rows the first in each of ``spans`` equal spans of
    ``[0, last global_step]``. Rows whose ``global_step`` does not parse are dropped.

    Thinning its own output changes nothing: the first row of a span is still the first of its span, and the
    last row and the evaluations stay. Nor does thinning it again to a divisor of ``spans``: span ``j`` of
    ``spans / k`` begins where span ``j·k`` of ``spans`` does, whose first row was kept."""
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
        evaluated = eval_at is not None and eval_at < len(cells) and _finite(cells[eval_at])
        rows.append((step, evaluated, line.rstrip("\n") + "\n"))
    last = max(rows[-1][0], 1) if rows else 1
    seen: set[int] = set()
    kept = []
    for i, (step, evaluated, line) in enumerate(rows):
        span = min(spans - 1, max(step, 0) * spans // last)
        if evaluated or span not in seen or i == len(rows) - 1:
            kept.append(line)
        seen.add(span)
    return lines[0] + "".join(kept)


def _finite(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def ended(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run that ended: a config and a summary that says completed or failed."""
    try:
        summary = read_summary(run_dir) if (run_dir / "config.yaml").is_file() else None
    except BadInput:
        return False
    return summary is not None and summary.get("status") in ("completed", "failed")


def run_dirs(folder: Path) -> Iterator[Path]:
    """The run directories at or below ``folder`` (each holds a config.yaml), hidden folders and a run's own
    subfolders not searched."""
    if (folder / "config.yaml").is_file():
        yield folder
    elif folder.is_dir():
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
    return json.dumps({**record, "command": ["testbed", *command[1:]]}, indent=2).encode()


def _compressed(data: bytes) -> bytes:
    """``data`` gzipped with no name or time in the header: the same rows give the same bytes."""
    return gzip.compress(data, compresslevel=9, mtime=0)


def keep_run(run_dir: Path, target: Path) -> None:
    """Write what a result keeps of ``run_dir`` (a run, or a run already kept) into ``target`` (made or
    replaced): staged beside it and renamed into place, so that a stop leaves the old copy or the new."""
    staging = target.with_name(f".{target.name}.keeping")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in RECORD:
        shutil.copy2(run_dir / name, staging / name)
    for meta in sorted(run_dir.glob("meta*.json")):
        (staging / meta.name).write_bytes(without_machine_paths(meta.read_bytes()))
    progress, kept = run_dir / "progress.csv", run_dir / KEPT_PROGRESS
    if progress.exists():
        text = progress.read_text(encoding="utf-8", errors="surrogateescape")
    else:
        text = gzip.decompress(kept.read_bytes()).decode() if kept.exists() else ""
    # A bsuite run's log of its episodes: made from its episodes, or as a kept run already holds it.
    if (run_dir / "episodes.csv").exists():
        bsuite_log: bytes | None = _compressed(kept_log(run_dir))
    else:
        bsuite_log = (run_dir / KEPT_BSUITE_LOG).read_bytes() if (run_dir / KEPT_BSUITE_LOG).exists() else None
    spans = SPANS if bsuite_log is None else BSUITE_SPANS
    if data := thin_progress(text, spans).encode("utf-8", errors="surrogateescape"):
        (staging / KEPT_PROGRESS).write_bytes(_compressed(data))
    if bsuite_log is not None:
        (staging / KEPT_BSUITE_LOG).write_bytes(bsuite_log)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def keep_runs(output: Path, folder: Path, adopted_from: Sequence[Path] = ()) -> list[Path]:
    """Keep every run that ended under ``output`` at its path under ``folder``; the paths kept (relative).

    A run the same as one in ``adopted_from`` (the folders a bench's ``--reuse-from`` names: the same config
    and summary, byte for byte) is not kept twice: the result it came from holds it. A staging folder that a
    stopped keep left in ``folder`` (``.NAME.keeping``, see :func:`keep_run`) is removed first: the kept copy
    beside it is whole, old or new, and the run is kept again here."""
    for staging in sorted(folder.rglob(".*.keeping")) if folder.is_dir() else []:
        shutil.rmtree(staging, ignore_errors=True)
    kept = []
    for run_dir in run_dirs(output):
        relative = run_dir.relative_to(output)
        copies = [source / relative for source in adopted_from]
        if ended(run_dir) and not any(all(_same(run_dir, copy, name) for name in RECORD) for copy in copies):
            keep_run(run_dir, folder / relative)
            kept.append(relative)
    return kept


def _same(a: Path, b: Path, name: str) -> bool:
    return (b / name).is_file() and (a / name).read_bytes() == (b / name).read_bytes()


def restore_runs(folder: Path, output: Path) -> list[Path]:
    """Copy the runs kept under ``folder`` to their paths under ``output`` where the output holds no files of
    its own there (a run of this checkout is newer than, or the same as, the kept one); the paths restored.
    Not restored: a run older code trained (its meta.json's code version), which the command trains again as
    today's code computes it, and one trained with ``keep_checkpoints``, whose readers need the checkpoints."""
    restored = []
    for kept in run_dirs(folder):
        relative = kept.relative_to(folder)
        if not ended(kept):
            continue
        config = load_yaml((kept / "config.yaml").read_bytes(), str(kept / "config.yaml"))
        if (isinstance(config, dict) and config.get("keep_checkpoints")) or other_code_version(kept) is not None:
            continue
        if not ((output / relative).is_dir() and any((output / relative).iterdir())):
            copy_run_into(kept, output / relative, "restoring")
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
