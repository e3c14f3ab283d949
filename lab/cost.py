"""What a bench's runs cost and where they ran, read from their meta files: the seeds each process trained
side by side (stacking), each run's core time, the core-hours, the wall-clock of the bench's invocations, and
the machines and package versions.

A trainer process computes on one thread, and may train several seeds side by side (``train --seeds``): each
then progresses at a fraction of a lone run's speed while the process as a whole goes faster. Wall-clock
figures of a stacked run and a lone one are comparable only as each run's share of its process, its core time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from agents.config import read_yaml
from agents.rundir import TIME_FORMAT
from envs.errors import BadInput
from lab.document import counted, fmt_steps
from lab.plan import parse_seeds
from lab.results import Run


def read_meta(path: Path) -> dict[str, Any]:
    """A meta file a start of a run wrote (``meta.json``, ``meta.resume*.json``); {} if it is missing or
    unreadable."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def run_meta(run: Run) -> dict[str, Any]:
    """The run's meta.json: its first start's (a resume writes its own file beside it)."""
    return read_meta(run.run_dir / "meta.json")


def machine_text(runs: Sequence[Run]) -> str | None:
    """The CPU model, python and package versions the runs trained under, from each start's meta file
    (``meta.json``, and ``meta.resume*.json`` for each resume); one that not every run used says how many did.
    Meta files older than the CPU's record say "cpu not recorded". None when no run has a readable meta file."""
    versions: dict[str, dict[str, set[Path]]] = {}  # package → version → the runs that trained under it
    for run in runs:
        for meta in filter(None, map(read_meta, sorted(run.run_dir.glob("meta*.json")))):  # unreadable: {}
            packages = meta.get("packages") if isinstance(meta.get("packages"), dict) else {}
            cpu = meta.get("cpu") or "not recorded"
            for name, version in {"cpu": cpu, "python": meta.get("python"), **packages}.items():
                if version:
                    versions.setdefault(str(name), {}).setdefault(str(version), set()).add(run.run_dir)
    if not versions:
        return None
    with_meta = len(set().union(*(dirs for by_version in versions.values() for dirs in by_version.values())))
    if versions.get("cpu", {}).keys() == {"not recorded"}:
        del versions["cpu"]  # a bench from before the CPU was recorded: nothing to say
    parts = []
    for name, by_version in versions.items():
        if len(by_version) == 1 and len(next(iter(by_version.values()))) == with_meta:
            parts.append(f"{name} {next(iter(by_version))}")
        else:
            parts.append(
                f"{name} "
                + ", ".join(f"{version} ({counted(len(dirs), 'run')})" for version, dirs in sorted(by_version.items()))
            )
    text = "Machine and software: " + "; ".join(parts)
    if any(len(by_version) > 1 for by_version in versions.values()):
        text += (
            " (a run resumed under another counts under both; where the CPU model or the physics engine's version "
            "differs, runs of the same seed and settings differ too)"
        )
    return text


def stacked_with(run: Run) -> tuple[int, ...]:
    """The seeds that trained in one process with ``run`` when it started: the ``--seeds`` of the command in
    its meta.json (a resume writes its own meta file beside it), read as ``testbed train`` reads it; its own
    seed alone when it trained by itself, or the file is missing or unreadable."""
    try:
        command = [str(arg) for arg in run_meta(run).get("command", [])]
        if "--seeds" not in command[:-1]:
            return (run.seed,)
        first = int(command[command.index("--seed") + 1]) if "--seed" in command[:-1] else None
        return tuple(parse_seeds(command[command.index("--seeds") + 1], first))
    except (OSError, ValueError, BadInput):
        return (run.seed,)


def core_time(run: Run) -> np.ndarray:
    """(E,) the run's share of its trainer process's wall-clock at each evaluation: the wall-clock divided by
    the seeds the process trained side by side (:func:`stacked_with`). A process computes on one thread, so a
    stacked run and a lone one compare at equal compute only in this time: three stacked seeds each take a
    third of the process, where a lone run takes all of its own."""
    return run.wall_time_s / len(stacked_with(run))


def core_sps(run: Run) -> float | None:
    """summary.json's steps/s in core time: its own steps per second of its share of the process."""
    sps = run.summary.get("sps")
    return None if sps is None else float(sps) * len(stacked_with(run))


def stacking_text(runs: Sequence[Run]) -> str:
    """What "core time" means in the report, and which algos trained several seeds in one process."""
    widths: dict[str, set[int]] = {}
    for run in runs:
        widths.setdefault(run.algo, set()).add(len(stacked_with(run)))
    stacked = [f"{algo} {'/'.join(map(str, sorted(w)))} seeds" for algo, w in sorted(widths.items()) if w != {1}]
    return (
        "Core time: a run's share of its trainer process's wall-clock (one thread), the wall-clock divided by the "
        "seeds the process trained side by side (`train --seeds`); a run alone in its process has all of it. Steps per "
        "core-second, time to threshold, equal time and the time plots use it, so a stacked run and a lone one compare "
        "at equal compute. "
        + (f"Seeds per process: {', '.join(stacked)}; the others one." if stacked else "Every run had its own process.")
    )


def compute_text(runs: Sequence[Run]) -> str:
    """What the runs cost: env steps, and the core-hours of the processes that trained them.

    core-hours = Σ over trainer processes of the process's wall time, where a process that trained seeds
    side by side lasted as long as its longest run, and each process computes on one thread. Wall times
    add up over resumes; a run still going counts up to its last progress row."""
    processes: dict[tuple[str, str, tuple[int, ...]], float] = {}
    for run in runs:
        seconds = float(run.summary.get("wall_time_s") or run.last_wall_time_s)
        key = (run.env_id, run.algo, stacked_with(run))
        processes[key] = max(processes.get(key, 0.0), seconds)
    steps = sum(int(run.summary.get("total_steps") or run.last_step) for run in runs)
    widest = max((len(seeds) for _, _, seeds in processes), default=1)
    return (
        f"Compute: {fmt_steps(steps)} env steps in {sum(processes.values()) / 3600:.3g} core-hours: the wall time of "
        f"{counted(len(processes), 'trainer process', 'trainer processes')} of one thread each, up to "
        f"{counted(widest, 'seed')} side by side in one (a process lasts as long as its longest run)"
    )


def _started(text: str) -> datetime:
    return datetime.strptime(text, TIME_FORMAT)


def wall_clock_text(bench_dir: Path, runs: Sequence[Run]) -> str | None:
    """How long the bench's invocations lasted, start to end (``bench.yaml``'s ``invocations``): its wall-clock
    time, whatever ran in parallel in it; None for a bench that recorded none."""
    path = bench_dir / "bench.yaml"
    recorded = (read_yaml(path) or {}).get("invocations", []) if path.exists() else []
    invocations = [i for i in recorded if isinstance(i, dict) and i.get("start")]
    if not invocations:
        return None
    spans = [(_started(i["start"]), _started(i["end"])) for i in invocations if i.get("end")]
    killed = [_started(i["start"]) for i in invocations if not i.get("end")]
    hours = sum((end - start).total_seconds() for start, end in spans) / 3600
    text = f"Wall-clock: {hours:.3g} h in {counted(len(spans), 'invocation')} of `testbed bench`"
    if killed:
        text += f", and {counted(len(killed), 'invocation')} killed outright (no end), not counted"
    opened = sorted([start for start, _ in spans] + killed)
    first = opened[0]
    starts = []
    for run in runs:
        try:
            starts.append(_started(run_meta(run)["start_time"]))
        except (KeyError, TypeError, ValueError):
            continue  # a run without a readable start time cannot be placed
    earlier = sum(start < first for start in starts)
    if earlier:
        text += (
            f"; {counted(earlier, 'run')} started before the first invocation recorded here ({first:%Y-%m-%d %H:%M} "
            f"UTC): adopted from another bench, or trained before invocations were recorded, not counted"
        )
    # A killed invocation has no end: a run it started is placed in it up to the next invocation's start.
    windows = spans + [(s, next((t for t in opened if t > s), datetime.max.replace(tzinfo=s.tzinfo))) for s in killed]
    outside = sum(start >= first and not any(s <= start <= e for s, e in windows) for start in starts)
    if outside:
        text += (
            f"; {counted(outside, 'run')} trained outside every invocation, by a cell's own `testbed train` command: "
            "in the core-hours, not in this wall-clock"
        )
    return text
