"""Reading runs back from disk (their statistics are ``lab.stats``'s).

A run directory is recognised by its ``config.yaml`` holding ``algo`` and ``env_id`` (see
``runs/README.md``). Everything else is optional, because a run may still be running or may have
crashed: without ``summary.json`` its status is ``running`` and its curve is whatever ``progress.csv``
holds so far.

The env id always comes from ``config.yaml``, never from the path: a bench writes ids that contain
``/`` with ``_`` in their place.
"""

from __future__ import annotations

import csv
import gzip
import math
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from agents.config import load_yaml
from agents.rundir import read_summary
from envs.errors import BadInput

RUN_DIR_CONTENTS = (
    "a run directory holds config.yaml (with keys algo and env_id), and, once it has started, progress.csv and, once "
    "it has ended, summary.json"
)
EVAL_COLUMN = "eval/return_mean"
KEPT_PROGRESS = "progress.csv.gz"
"""What a committed result keeps of a run's progress.csv: its rows thinned and compressed (``lab.kept``)."""
KEPT_BSUITE_LOG = "bsuite_log.csv.gz"
"""What it keeps of a bsuite run's episodes.csv: bsuite's own log of them, compressed (``lab.bsuite_study``)."""


def open_progress(path: Path) -> IO[str] | None:
    """``path`` (a run's progress.csv) open for reading as text, or the kept ``progress.csv.gz`` beside it
    when the run is a committed result's; None when the run has neither. Undecodable bytes read as U+FFFD."""
    if path.exists():
        return open(path, newline="", encoding="utf-8", errors="replace")
    kept = path.with_name(KEPT_PROGRESS)
    if kept.exists():
        return gzip.open(kept, "rt", newline="", encoding="utf-8", errors="replace")
    return None


@dataclass
class Run:
    """One run as read from disk. Arrays hold only the progress.csv rows that carry an evaluation."""

    run_dir: Path
    algo: str
    env_id: str
    """The env the run trained on: its gymnasium id, plus ``[key=value,…]`` for the env kwargs and reward
    delay that make it another env (see :func:`env_label`); reports group runs by it."""
    seed: int
    status: str
    """``completed``, ``failed`` or ``interrupted`` from summary.json; ``running`` when it is missing."""
    summary: dict[str, Any]
    """summary.json as written; ``{}`` when it is missing."""
    steps: np.ndarray
    """(E,) global_step of each evaluation."""
    wall_time_s: np.ndarray
    """(E,) wall-clock seconds since the run started, at each evaluation."""
    eval_return: np.ndarray
    """(E,) mean deterministic evaluation return at each evaluation."""
    final_return: float | None
    """summary.json's final_eval_return_mean: None unless the run completed."""
    config: dict[str, Any] = field(default_factory=dict)
    """config.yaml as written (the resolved config, with ``algo``)."""
    last_step: int = 0
    """global_step of the last progress.csv row: how far the run got, evaluated or not."""
    last_wall_time_s: float = 0.0
    """wall_time_s of the last progress.csv row."""
    problem: str | None = None
    """What is wrong with its progress.csv, if anything (bytes that are not text, a cut-short end), in words."""


def _float(text: str | None) -> float:
    """A CSV cell as a float; empty or unparsable cells (no evaluation on that row) are NaN."""
    try:
        return float(text) if text else math.nan
    except ValueError:
        return math.nan


def read_progress(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, float]:
    """``(steps, wall_time_s, eval_return)`` of the rows with an evaluation, then the last row's step and time.

    A running run may be caught mid-write: a row whose ``global_step`` does not parse is skipped.
    """
    steps: list[int] = []
    times: list[float] = []
    returns: list[float] = []
    last_step, last_time = 0, 0.0
    if (f := open_progress(path)) is not None:
        with f:
            for row in csv.DictReader(f):
                try:
                    step = int(row["global_step"])
                except (TypeError, ValueError, KeyError):
                    continue
                time_s = _float(row.get("wall_time_s"))
                last_step, last_time = step, (time_s if math.isfinite(time_s) else last_time)
                value = _float(row.get(EVAL_COLUMN))
                if math.isfinite(value):
                    steps.append(step)
                    times.append(time_s)
                    returns.append(value)
    return (
        np.asarray(steps, dtype=np.int64),
        np.asarray(times, dtype=np.float64),
        np.asarray(returns, dtype=np.float64),
        last_step,
        last_time,
    )


def read_series(path: Path, column: str) -> tuple[np.ndarray, np.ndarray]:
    """``(global_step, value)`` of the progress.csv rows where ``column`` holds a number (a diagnostic such
    as ``losses/explained_variance``); empty arrays when the file or the column is missing."""
    steps: list[int] = []
    values: list[float] = []
    if (f := open_progress(path)) is not None:
        with f:
            for row in csv.DictReader(f):
                value = _float(row.get(column))
                if math.isfinite(value) and (row.get("global_step") or "").isdigit():
                    steps.append(int(row["global_step"]))
                    values.append(value)
    return np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64)


def progress_problem(path: Path, summary: dict[str, Any], last_step: int) -> str | None:
    """What is wrong with a run's progress.csv, in a few words, or None. Only an ended run (one with a
    summary) is judged by its end: a running one may be caught mid-row. A run with a checkpoint is also
    judged by it: its progress.csv reached the size the checkpoint recorded, and only grows from there."""
    checkpoint = path.with_name("checkpoint.pt")
    if not path.exists():
        if checkpoint.exists() and not path.with_name(KEPT_PROGRESS).exists():
            return "is missing, though the run has a checkpoint: its curve is lost (restore the file from a backup)"
        return None
    data = path.read_bytes()
    problems = []
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        problems.append("holds bytes that are not UTF-8 text (the values there are skipped)")
    if b"\x00" in data:  # valid UTF-8, but no row: what a resume of a shortened file once padded it with
        problems.append("holds NUL bytes where rows were (the rows there are skipped)")
    if summary and data and not data.endswith(b"\n"):
        problems.append("ends in a row cut short")
    trained = summary.get("total_steps")
    # A run that completed or was interrupted wrote the row of its last step; a failed one may have failed before.
    if summary.get("status") in ("completed", "interrupted") and isinstance(trained, int) and last_step < trained:
        problems.append(f"ends at step {last_step:,}, before the run's last step {trained:,}: rows are missing")
    if checkpoint.exists():
        from agents.runlog import recorded_csv_bytes  # here: checkpoints need torch, which runs without one never do

        recorded = recorded_csv_bytes(path.parent)
        if recorded is not None and len(data) < recorded:
            problems.append(
                f"holds {len(data):,} bytes, fewer than the {recorded:,} its checkpoint recorded: rows were deleted"
            )
    return "; ".join(problems) or None


def _run_config(run_dir: Path) -> dict[str, Any] | None:
    """config.yaml's contents if ``run_dir`` is a run directory, else None."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    try:
        config = load_yaml(path.read_bytes(), str(path))
    except BadInput:
        return None
    if not isinstance(config, dict) or "algo" not in config or "env_id" not in config:
        return None
    return config


def env_label(config: dict[str, Any]) -> str:
    """``HalfCheetah-v5``, ``HalfCheetah-v5[reward_delay=20]``, ``testbed/Chain-v0[horizon=300]``: the id,
    with the settings that change the env, so runs on different horizons or delays are never pooled."""
    extras = [f"{key}={value}" for key, value in sorted((config.get("env_kwargs") or {}).items())]
    if config.get("reward_delay") is not None:
        extras.append(f"reward_delay={config['reward_delay']}")
    return f"{config['env_id']}[{','.join(extras)}]" if extras else str(config["env_id"])


def natural_key(label: str) -> list[tuple[int, int | str]]:
    """Sort key that orders numbers by value: ``horizon=30`` before ``horizon=100``, numbers before ``end``."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", label) if part]


def base_env_id(label: str) -> str:
    """The gymnasium id inside an :func:`env_label`."""
    return label.partition("[")[0]


def read_run(run_dir: Path, config: dict[str, Any] | None = None) -> Run:
    """Read one run directory; BadInput if it is not one or its summary.json is unreadable."""
    config = config if config is not None else _run_config(run_dir)
    if config is None:
        raise BadInput(f"{run_dir} is not a run directory: {RUN_DIR_CONTENTS}.")
    summary = read_summary(run_dir) or {}
    steps, times, returns, last_step, last_time = read_progress(run_dir / "progress.csv")
    final = summary.get("final_eval_return_mean")
    return Run(
        run_dir=run_dir,
        algo=str(config["algo"]),
        env_id=env_label(config),
        seed=int(config.get("seed", summary.get("seed", 0))),
        status=str(summary.get("status", "running")),
        summary=summary,
        steps=steps,
        wall_time_s=times,
        eval_return=returns,
        final_return=None if final is None else float(final),
        config=config,
        last_step=int(summary.get("total_steps") or last_step),
        last_wall_time_s=float(summary.get("wall_time_s") or last_time),
        problem=progress_problem(run_dir / "progress.csv", summary, last_step),
    )


def _walk(path: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Run directories at or below ``path``; a run directory's own subfolders are not searched."""
    config = _run_config(path)
    if config is not None:
        yield path, config
        return
    for child in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
        yield from _walk(child)


def find_runs(paths: Sequence[Path]) -> list[Run]:
    """Every run in ``paths`` (each a run directory or any directory holding some), sorted by env, algo, seed.

    A run named twice (a bench and one of its cells) is read once.
    """
    seen: dict[Path, Run] = {}
    for path in map(Path, paths):
        if not path.exists():
            raise BadInput(f"{path} does not exist; give a run directory or a directory holding run directories.")
        if not path.is_dir():
            raise BadInput(f"{path} is not a directory; give a run directory or a directory holding run directories.")
        found = False
        for run_dir, config in _walk(path):
            found = True
            key = run_dir.resolve()
            if key not in seen:
                seen[key] = read_run(run_dir, config)
                if seen[key].problem:
                    print(f"warning: {run_dir / 'progress.csv'} {seen[key].problem}", file=sys.stderr)
        if not found:
            raise BadInput(f"no run found under {path}: {RUN_DIR_CONTENTS}.")
    return sorted(seen.values(), key=lambda r: (natural_key(r.env_id), r.algo, r.seed, str(r.run_dir)))
