"""Benchmark grids: algorithms × environments × seeds, and their reports.

A grid (:class:`Grid`) is planned and checked here, every cell's config resolved before the first cell
starts; ``lab.executor`` runs its cells, on this machine or on a Ray cluster, each writing
``runs/bench/NAME/<env_id>/<algo>/seed<k>/`` with its console output beside it (``seed<k>.log``).

A bench is idempotent: a finished cell is skipped, an interrupted one resumes from its checkpoint (as does one
whose trainer alone was killed, in the retry and on a rerun), and a failed one is recorded with its error, set
aside and retried once from scratch, without stopping the others; a finished run is reused only if it was
trained with the settings the grid asks for. Ctrl-C stops every cell at its next iteration, with a checkpoint,
so rerunning the same command continues. One writer at a time: the driver locks the bench directory for the
whole grid, and each trainer its run directory.
The report (``lab.report``) is rebuilt from disk at the end.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from agents import registry, rundir
from agents.config import SEED_LIMIT, parse_overrides, read_yaml
from envs.errors import BadInput, brief
from lab.board import HEARTBEAT_S, Heartbeat
from lab.cells import Cell, Outcome, log_path, read_status, reused_elsewhere
from lab.document import counted, fmt_duration
from lab.executor import connect_ray, execute
from lab.kept import copy_run_into
from lab.plan import resolve_run
from lab.suites import SUITES, Suite

BENCH_ROOT = Path("runs") / "bench"
BENCH_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
"""One folder name under runs/bench: no path separators, and not hidden (nor ``.``/``..``)."""


@dataclass
class Grid:
    name: str
    algos: list[str]
    envs: list[str]
    seeds: list[int]
    total_steps: int | None
    overrides: dict[str, list[str]] = field(default_factory=dict)  # algo → ["key=value", ...]
    variants: dict[str, list[str]] = field(default_factory=lambda: {"": []})  # label → pairs for every algo

    def cells(self) -> list[Cell]:
        return [
            Cell(a, e, s, self.total_steps, tuple(self.overrides.get(a, []) + pairs), v)
            for e in self.envs
            for v, pairs in self.variants.items()
            for a in self.algos
            for s in self.seeds
        ]

    def definition(self) -> dict[str, Any]:
        """What makes two runs of a bench the same grid: a rerun with another definition is refused."""
        plain = {"total_steps": self.total_steps, "overrides": self.overrides}
        return plain if self.variants == {"": []} else {**plain, "variants": self.variants}


# ── planning and validation: everything is checked before the first cell starts ───────────────────


def plan_grid(
    suite: str | None,
    algos: list[str] | None,
    envs: list[str] | None,
    seeds: int | None,
    total_steps: int | None,
    sets: list[str],
    name: str | None,
    variants: dict[str, list[str]] | None = None,
    first_seed: int = 0,
) -> Grid:
    """Resolve a suite and explicit options into a validated grid.

    ``sets`` are ``ALGO.key=value`` (one algo) or ``key=value`` (every algo). ``variants`` (label →
    key=value pairs for every algo) multiply the grid: a study's horizons or reward delays. ``name`` (by
    default the suite's, else ``custom``) is the bench's folder under runs/bench. Seeds run from
    ``first_seed``: a sweep on seeds 100 … leaves 0 … unseen for the results it chooses between."""
    name = name if name is not None else suite or "custom"
    if not BENCH_NAME.fullmatch(name):
        raise BadInput(
            f"--name {brief(name, 80)} is not a bench name: give one folder name (it becomes runs/bench/NAME) made of "
            "letters, digits, '.', '_' and '-', not starting with '.'"
        )
    if suite is not None and suite not in SUITES:
        raise BadInput(f"unknown suite {brief(suite, 80)}; choose one of {', '.join(SUITES)}")
    base = SUITES[suite] if suite else Suite(envs=())
    grid = Grid(
        name=name,
        algos=list(algos or base.algos),
        envs=list(envs or base.envs),
        seeds=list(range(first_seed, first_seed + (seeds if seeds is not None else base.seeds))),
        total_steps=total_steps if total_steps is not None else base.total_steps,
        variants=variants or {"": []},
    )
    if not grid.envs:
        raise BadInput(f"no environments: pass --envs ENV_ID ... or --suite {'|'.join(SUITES)}")
    if not grid.seeds:
        raise BadInput("--seeds must be at least 1")
    if not (first_seed >= 0 and grid.seeds[-1] < SEED_LIMIT):
        raise BadInput(f"--first-seed must leave every seed in [0, 2**32 - 1], got {first_seed}")
    if grid.total_steps is not None and grid.total_steps < 1:
        raise BadInput(f"--total-steps must be positive, got {grid.total_steps}")
    unknown = [a for a in grid.algos if a not in registry.entries()]
    if unknown:
        raise BadInput(f"unknown algo {', '.join(unknown)}; choose from {', '.join(registry.NAMES)}")
    for pair in sets:
        key, _, _ = pair.partition("=")
        if "." not in key:  # key=value: every algo
            for algo in grid.algos:
                grid.overrides.setdefault(algo, []).append(pair)
            continue
        algo, _, rest = pair.partition(".")
        if algo not in registry.entries():
            choices = ", ".join(registry.NAMES)
            raise BadInput(
                f"--set in a bench takes ALGO.key=value (ALGO one of {choices}) or key=value; got {brief(pair)}"
            )
        grid.overrides.setdefault(algo, []).append(rest)
    for algo, pairs in grid.overrides.items():
        if "seed" in parse_overrides(pairs):
            raise BadInput(
                f"--set seed would give every seed of {algo} one seed; choose the seeds with --seeds N and "
                "--first-seed K"
            )
    for env_id in grid.envs:
        for algo in grid.algos:
            for pairs in grid.variants.values():
                # Builds and validates every cell's config, as `testbed train` would, before any run.
                steps = [f"total_steps={grid.total_steps}"] if grid.total_steps is not None else []
                resolve_run(registry.get(algo), env_id, grid.overrides.get(algo, []) + pairs + steps, validate=True)
    return grid


def check_bench_dir(bench_dir: Path, grid: Grid) -> None:
    """A bench directory belongs to one grid definition; rerunning it with other settings is refused."""
    path = bench_dir / "bench.yaml"
    definition = grid.definition()
    if path.exists():
        saved = read_yaml(path) or {}
        if {k: saved.get(k) for k in definition} != definition:
            raise BadInput(
                f"{bench_dir} was run with total_steps={saved.get('total_steps')}, overrides={saved.get('overrides')} "
                f"and variants={saved.get('variants')}; use another --name for different settings"
            )


def write_bench_yaml(bench_dir: Path, grid: Grid, workers: int) -> str:
    """Merge this invocation into ``bench.yaml``: the grid's algos, envs and seeds, its command, and its start
    among ``invocations`` (the end is written by :func:`end_invocation`); returns the start's time stamp."""
    path = bench_dir / "bench.yaml"
    saved = read_yaml(path) if path.exists() else {}
    start = time_stamp()
    merged = {
        "name": grid.name,
        **grid.definition(),
        "algos": sorted(set(saved.get("algos", [])) | set(grid.algos)),
        "envs": sorted(set(saved.get("envs", [])) | set(grid.envs)),
        "seeds": sorted(set(saved.get("seeds", [])) | {cell.seed for cell in grid.cells()}),
        "commands": [*saved.get("commands", []), " ".join(["testbed", *sys.argv[1:]])],
        "invocations": [*saved.get("invocations", []), {"start": start, "end": None, "workers": workers}],
    }
    bench_dir.mkdir(parents=True, exist_ok=True)
    rundir.atomic_write_text(path, yaml.safe_dump(merged, sort_keys=False))
    return start


def end_invocation(bench_dir: Path, start: str) -> None:
    """Write the end of the invocation that started at ``start`` into ``bench.yaml``: the report sums the
    invocations' wall-clock time. One killed outright keeps no end, and the report says so."""
    path = bench_dir / "bench.yaml"
    saved = read_yaml(path) or {}
    for invocation in saved.get("invocations", []):
        if invocation.get("start") == start:
            invocation["end"] = time_stamp()
    rundir.atomic_write_text(path, yaml.safe_dump(saved, sort_keys=False))


def forget_invocation(bench_dir: Path, start: str) -> None:
    """Drop the invocation that started at ``start`` from ``bench.yaml``: one that trained nothing and left the
    report as it was, which therefore does not count it."""
    path = bench_dir / "bench.yaml"
    saved = read_yaml(path) or {}
    saved["invocations"] = [i for i in saved.get("invocations", []) if i.get("start") != start]
    rundir.atomic_write_text(path, yaml.safe_dump(saved, sort_keys=False))


def time_stamp() -> str:
    """Now, in UTC, as ``bench.yaml`` and the runs' meta.json write times (``rundir.TIME_FORMAT``)."""
    return datetime.now(timezone.utc).strftime(rundir.TIME_FORMAT)


def adopt_runs(cells: list[Cell], source: Path, bench_dir: Path) -> int:
    """Copy into ``bench_dir`` each completed run of the bench ``source`` that a cell asks for: same algo, env,
    variant and seed, trained with the settings the cell asks for (its config.yaml) by today's code (its
    meta.json's code version), where the cell has no run yet. Its console log comes along. A run still going or
    stopped in ``source`` stays there, so that no run is trained twice. Returns how many runs were copied.

    Each copy keeps its wall time, so a bench that reuses PPO's runs can give GRPO PPO's time as a budget
    and compare the two at equal time (a stacked run's time is its stack's: stack both alike).

    A copy is made in a hidden folder beside the cell's and renamed into place, so a stop mid-copy leaves the
    cell empty, to be adopted again, never holding part of a run (reports do not read hidden folders)."""
    adopted = 0
    for cell in cells:
        here, there = cell.run_dir(bench_dir), cell.run_dir(source)
        if (here.exists() and any(here.iterdir())) or read_status(there) != "completed":
            continue
        if rundir.other_code_version(there) is not None or rundir.config_differences(there, cell.algo, cell.config()):
            continue
        copy_run_into(there, here, "adopting")
        if log_path(there).exists():
            shutil.copy2(log_path(there), log_path(here))
        adopted += 1
    return adopted


def build_reports(bench_dir: Path, heartbeat_s: float = HEARTBEAT_S, started: str | None = None) -> dict[str, Path]:
    """Write the bench report (``lab.report``) and, for a credit study (``credit.yaml``), the study's report,
    saying so first and every ``heartbeat_s`` seconds until done (bootstraps and plots take a while).

    Returns every written path, the study's under keys ``credit …``. BadInput if the bench holds no run.
    Both reports are built here, above them, so that ``lab.report`` need not know about credit studies.

    A report whose inputs have not changed since it was built (``lab.fingerprint``: the runs, the bench's
    settings, the code) is not built again: a rerun of a finished bench answers in seconds. The invocation that
    ``started`` then trained nothing, and is dropped from ``bench.yaml``, whose invocations are those the report
    counts.
    """
    from lab.fingerprint import fingerprint, record, up_to_date

    inputs = fingerprint(bench_dir)
    if (kept := up_to_date(bench_dir, inputs)) is not None:
        if started is not None:
            forget_invocation(bench_dir, started)
        print("the report is up to date: its runs, settings and code are unchanged since it was built", flush=True)
        return kept
    print("building the report …", flush=True)
    with Heartbeat(lambda elapsed: print(f"building the report … {fmt_duration(elapsed)}", flush=True), heartbeat_s):
        # Imported here: reports load matplotlib, which planning and running a grid never need.
        from lab.credit import STUDY_FILE, build_credit_report
        from lab.report import build_report

        written = build_report(bench_dir)
        if (bench_dir / STUDY_FILE).exists():
            written.update({f"credit {k}": v for k, v in build_credit_report(bench_dir).items()})
    record(bench_dir, inputs, written)
    return written


def run_grid(
    grid: Grid,
    workers: int,
    backend: str,
    ray_address: str | None,
    retries: int = 1,
    root: Path = BENCH_ROOT,
    prepare: Callable[[Path], None] | None = None,
    report: bool = True,
    stack: int = 1,
    heartbeat_s: float = HEARTBEAT_S,
    reuse_from: Sequence[Path] = (),
) -> tuple[Path, list[Outcome]]:
    """Run every cell; rebuild the reports from disk (unless ``report`` is False). Returns the bench
    directory and the outcomes. A heartbeat (runs done, processes, steps/s, ETA) is printed every
    ``heartbeat_s`` seconds while the cells run and the report is built.

    The bench directory stays locked while the grid runs, so a second driver of the same bench is refused
    (BadInput naming this one) before it writes anything. Under the lock, after the grid's settings and
    every cell's summary.json are checked, ``prepare(bench_dir)`` writes what a caller keeps beside the
    bench (a credit study's ``credit.yaml``). ``stack``: the most seeds of one (algo, env) cell trained side
    by side in one process (``train --seeds``), for the algos that support it. ``reuse_from``: other
    benches whose completed runs this one asks for are copied in first, in their order (:func:`adopt_runs`).
    """
    bench_dir = root / grid.name
    if backend == "ray":
        connect_ray(ray_address, workers)
    elif backend != "local":
        raise BadInput(f"unknown --backend {brief(backend, 40)}; choose local or ray")
    cells = grid.cells()
    with rundir.DirLock(bench_dir):
        check_bench_dir(bench_dir, grid)
        for source in reuse_from:
            adopted = adopt_runs(cells, source, bench_dir)
            print(f"reused {counted(adopted, 'completed run')} of {source}", flush=True)
        # Before any cell starts: BadInput naming an unreadable summary.json, or a run trained with other settings.
        others = [why for cell in cells if (why := reused_elsewhere(cell, bench_dir))]
        if others:
            raise BadInput(
                f"{len(others)} run(s) of {bench_dir} were trained with other settings or older code than this "
                f"bench asks for (the presets changed?): {'; '.join(others[:3])}{' …' if len(others) > 3 else ''}. "
                "Use another --name, or move those runs away to train them again."
            )
        if prepare is not None:
            prepare(bench_dir)
        started = write_bench_yaml(bench_dir, grid, workers)
        try:
            outcomes, interrupted = execute(cells, bench_dir, workers, backend, retries, stack, heartbeat_s)
        finally:
            end_invocation(bench_dir, started)
        try:
            if report:
                build_reports(bench_dir, heartbeat_s, started)
        except BadInput:
            pass  # nothing finished yet: nothing to report
    if interrupted:
        raise KeyboardInterrupt
    return bench_dir, outcomes
