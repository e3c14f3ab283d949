"""Benchmark grids: algorithms × environments × seeds, on this machine or on a Ray cluster.

Each cell writes ``runs/bench/NAME/<env_id>/<algo>/seed<k>/`` (its console output beside it,
``seed<k>.log``). The cells that differ in the seed only train side by side, up to ``--stack`` of them in
one ``testbed train --seeds`` process with one torch thread (:func:`pack_stacks`); other cells, one per
process. Both backends run the same :func:`run_cells`:
- ``local`` (default): a pool of ``--workers`` processes on this machine;
- ``ray``: every stack is a Ray task asking for one CPU. The task trains in a scratch folder on whichever
  node runs it and sends its own run directories and logs back to the driver as tar archives, so no shared
  filesystem is needed; a cell to resume travels to the worker the same way. Nothing else travels: a
  task can never replace another cell's files, and a run that completed on the driver is never replaced.

A bench is idempotent: a finished cell is skipped, an interrupted one resumes from its checkpoint, and a
failed one is recorded with its error, set aside and retried once from scratch, without stopping the
others. Ctrl-C stops every cell at its next iteration, with a checkpoint, so rerunning the same command
continues. The report (``lab.report``) is rebuilt from disk at the end.

One writer at a time: the driver locks the bench directory for the whole grid, and each trainer its run
directory. Trainers run in their own process sessions (so that a Ctrl-C reaches them once, through the
driver) and stop with a checkpoint when the driver that started them dies, even by SIGKILL. A local Ray
instance ends with its driver too (``lab/raywatch.py``); its workers kill their trainers without a
checkpoint, whose scratch folder never returns, so those cells start again.
"""

from __future__ import annotations

import functools
import io
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import yaml

from agents import registry, runlog
from agents.config import SEED_LIMIT, RunConfig, parse_overrides, read_yaml, resolve_config
from envs import action_space_of
from envs.errors import BadInput
from lab.results import read_summary

BENCH_ROOT = Path("runs") / "bench"
BENCH_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
"""One folder name under runs/bench: no path separators, and not hidden (nor ``.``/``..``)."""
WRITER_WAIT_S = 30.0
"""How long a cell waits for another process still writing its run directory (the trainer of a driver
that was just killed, finishing its last iteration) before it gives up on the cell."""


@dataclass(frozen=True)
class Suite:
    envs: tuple[str, ...]
    algos: tuple[str, ...] = ("ppo", "grpo", "sb3-ppo")
    seeds: int = 3
    total_steps: int | None = None  # None: each algo's preset budget for the env


SUITES: dict[str, Suite] = {
    # A few minutes on 2 cores: the presets' budgets on CartPole.
    "quick": Suite(envs=("CartPole-v1",)),
    "classic": Suite(envs=("CartPole-v1", "Acrobot-v1", "LunarLander-v3")),
    "mujoco": Suite(envs=("CartPole-v1", "LunarLander-v3", "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")),
}


@dataclass(frozen=True)
class Cell:
    algo: str
    env_id: str
    seed: int
    total_steps: int | None
    overrides: tuple[str, ...]  # key=value for this algo (and this variant)
    variant: str = ""  # a study's setting of the env, e.g. horizon300; "" in a plain grid

    @property
    def label(self) -> str:
        return f"{self.env_id}[{self.variant}]" if self.variant else self.env_id

    def run_dir(self, bench_dir: Path) -> Path:
        env_dir = bench_dir / self.env_id.replace("/", "_")
        return (env_dir / self.variant if self.variant else env_dir) / self.algo / f"seed{self.seed}"

    def command(self, run_dir: Path, resume: bool) -> list[str]:
        argv = [sys.executable, "-m", "lab", "train", "--algo", self.algo, "--env", self.env_id, "--seed",
                str(self.seed), "--run-dir", str(run_dir)]  # fmt: skip
        if self.total_steps is not None:
            argv += ["--total-steps", str(self.total_steps)]
        for pair in self.overrides:
            argv += ["--set", pair]
        return argv + (["--resume"] if resume else [])

    @property
    def stack_key(self) -> tuple[Any, ...]:
        """Cells with the same key differ in the seed only, so they can train side by side in one process."""
        return self.algo, self.env_id, self.variant, self.total_steps, self.overrides

    def config(self) -> RunConfig:
        """The resolved config this cell asks for, as its ``testbed train`` resolves it."""
        return resolve_cell(self.algo, self.env_id, list(self.overrides), self.total_steps, self.seed)


@functools.cache
def _continuous(env_id: str) -> bool:
    return isinstance(action_space_of(env_id), gym.spaces.Box)


def resolve_cell(algo: str, env_id: str, pairs: list[str], total_steps: int | None, seed: int | None = None) -> RunConfig:
    """A cell's config: the algo's preset for the env, its variant's fixed values, then ``key=value`` pairs,
    the budget and the seed (None: the preset's); BadInput for a bad key or value."""
    spec = registry.get(algo)
    values: dict[str, Any] = parse_overrides(pairs)
    if total_steps is not None:
        values["total_steps"] = total_steps
    if seed is not None:
        values["seed"] = seed
    cfg, _ = resolve_config(spec.config, spec.preset or algo, env_id, _continuous(env_id), {**spec.fixed, **values})
    return cfg


def reused_elsewhere(cell: Cell, bench_dir: Path) -> str | None:
    """Why the cell's run directory, if it holds a run to reuse (completed, or with a checkpoint to resume),
    is not the run the cell asks for: the settings in which its config.yaml differs; None if it is, or holds
    nothing to reuse."""
    run_dir = cell.run_dir(bench_dir)
    if not (run_dir / "config.yaml").exists() or not (
        (run_dir / runlog.CHECKPOINT).exists() or read_status(run_dir) == "completed"
    ):
        return None
    differing = runlog.config_differences(run_dir, cell.algo, cell.config())
    return f"{run_dir} ({', '.join(differing)})" if differing else None


def stack_command(cells: list[Cell], bench_dir: Path, resume: bool) -> list[str]:
    """One ``testbed train --seeds`` process for cells that differ in the seed only (one cell: its own command)."""
    first = cells[0]
    if len(cells) == 1:
        return first.command(first.run_dir(bench_dir), resume)
    argv = first.command(first.run_dir(bench_dir).parent, resume)
    at = argv.index("--seed")
    argv[at : at + 2] = ["--seeds", ",".join(str(cell.seed) for cell in cells)]
    return argv


def pack_stacks(cells: list[Cell], stack: int) -> list[list[Cell]]:
    """Group the cells into stacks of at most ``stack`` seeds of one (algo, env, variant), for the algos that
    train seeds side by side; every other cell is a stack of one. Stacks of a group are near-equal in size."""
    groups: dict[tuple[Any, ...], list[Cell]] = {}
    for cell in cells:
        stackable = registry.get(cell.algo).train_stack is not None
        groups.setdefault(cell.stack_key if stackable else (id(cell),), []).append(cell)
    stacks = []
    for group in groups.values():
        count = math.ceil(len(group) / max(stack, 1))
        stacks += [part for part in (group[i::count] for i in range(count)) if part]
    return [sorted(part, key=lambda c: c.seed) for part in stacks]


@dataclass
class Outcome:
    cell: Cell
    status: str  # completed, failed, interrupted
    error: str | None = None
    attempts: int = 1
    resumed: bool = False


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
        return [Cell(a, e, s, self.total_steps, tuple(self.overrides.get(a, []) + pairs), v)
                for e in self.envs for v, pairs in self.variants.items() for a in self.algos
                for s in self.seeds]  # fmt: skip

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
    from agents.registry import ALGOS

    name = name if name is not None else suite or "custom"
    if not BENCH_NAME.fullmatch(name):
        raise BadInput(f"--name {name!r} is not a bench name: give one folder name (it becomes runs/bench/NAME) made "
                       "of letters, digits, '.', '_' and '-', not starting with '.'")  # fmt: skip
    if suite is not None and suite not in SUITES:
        raise BadInput(f"unknown suite {suite!r}; choose one of {', '.join(SUITES)}")
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
        raise BadInput("no environments: pass --envs ENV_ID ... or --suite quick|classic|mujoco")
    if not grid.seeds:
        raise BadInput("--seeds must be at least 1")
    if not (0 <= first_seed and grid.seeds[-1] < SEED_LIMIT):
        raise BadInput(f"--first-seed must leave every seed in [0, 2**32 - 1], got {first_seed}")
    if grid.total_steps is not None and grid.total_steps < 1:
        raise BadInput(f"--total-steps must be positive, got {grid.total_steps}")
    unknown = [a for a in grid.algos if a not in ALGOS]
    if unknown:
        raise BadInput(f"unknown algo {', '.join(unknown)}; choose from {', '.join(ALGOS)}")
    for pair in sets:
        key, _, _ = pair.partition("=")
        if "." not in key:  # key=value: every algo
            for algo in grid.algos:
                grid.overrides.setdefault(algo, []).append(pair)
            continue
        algo, _, rest = pair.partition(".")
        if algo not in ALGOS:
            choices = ", ".join(ALGOS)
            raise BadInput(f"--set in a bench takes ALGO.key=value (ALGO one of {choices}) or key=value; "
                           f"got {pair!r}")  # fmt: skip
        grid.overrides.setdefault(algo, []).append(rest)
    for algo, pairs in grid.overrides.items():
        if "seed" in parse_overrides(pairs):
            raise BadInput(f"--set seed would give every seed of {algo} one seed; choose the seeds with --seeds N and "
                           "--first-seed K")  # fmt: skip
    for env_id in grid.envs:
        for algo in grid.algos:
            for pairs in grid.variants.values():
                # Builds and validates every cell's config, as `testbed train` would, before any run.
                ALGOS[algo].validate(resolve_cell(algo, env_id, grid.overrides.get(algo, []) + pairs, grid.total_steps))
    return grid


def check_bench_dir(bench_dir: Path, grid: Grid) -> None:
    """A bench directory belongs to one grid definition; rerunning it with other settings is refused."""
    path = bench_dir / "bench.yaml"
    definition = grid.definition()
    if path.exists():
        saved = read_yaml(path) or {}
        if {k: saved.get(k) for k in definition} != definition:
            raise BadInput(
                f"{bench_dir} was run with total_steps={saved.get('total_steps')}, overrides="
                f"{saved.get('overrides')} and variants={saved.get('variants')}; use another --name for different "
                "settings"
            )


def write_bench_yaml(bench_dir: Path, grid: Grid) -> None:
    path = bench_dir / "bench.yaml"
    saved = read_yaml(path) if path.exists() else {}
    merged = {
        "name": grid.name,
        **grid.definition(),
        "algos": sorted(set(saved.get("algos", [])) | set(grid.algos)),
        "envs": sorted(set(saved.get("envs", [])) | set(grid.envs)),
        "seeds": sorted(set(saved.get("seeds", [])) | set(grid.seeds)),
        "commands": [*saved.get("commands", []), " ".join(["testbed", *sys.argv[1:]])],
    }
    bench_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(merged, sort_keys=False))


# ── one cell ───────────────────────────────────────────────────────────────────────────────────────


def read_status(run_dir: Path) -> str | None:
    """The run's status from its summary.json; None before it has one. BadInput if the file is unreadable."""
    summary = read_summary(run_dir)
    return None if summary is None else summary.get("status")


def log_path(run_dir: Path) -> Path:
    """A cell's console output, beside its run directory (``seed<k>.log``), so a set-aside attempt keeps it."""
    return run_dir.with_name(f"{run_dir.name}.log")


def wait_for_writer(run_dir: Path, timeout_s: float | None = None) -> str | None:
    """Wait until no process holds ``run_dir``'s lock; returns the holder if one still does after ``timeout_s``.

    A trainer whose driver was killed finishes its iteration, checkpoints and exits on its own; the next
    driver waits for that rather than racing it. ``timeout_s`` defaults to :data:`WRITER_WAIT_S` (read at
    call time, so tests may shorten it).
    """
    deadline = time.monotonic() + (WRITER_WAIT_S if timeout_s is None else timeout_s)
    while (holder := runlog.lock_holder(run_dir)) is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    return holder


def _still_written(cell: Cell, run_dir: Path, holder: str) -> Outcome:
    """The outcome of a cell whose run directory another process still writes: failed, and left as it is."""
    return Outcome(cell, "failed", f"{run_dir} is still being written by {holder}; stop that process (it saves a "
                                   "checkpoint), then rerun the bench to continue the cell", attempts=0)  # fmt: skip


def _set_aside(run_dir: Path) -> None:
    """Keep a failed attempt's directory, renamed, so the retry starts clean and nothing is lost.

    The name is hidden (``.seed0.failed1``), so reports and plots read only the current attempt."""
    if not run_dir.exists():  # the attempt failed before creating its directory (its input was refused)
        return
    attempt = 1
    while run_dir.with_name(f".{run_dir.name}.failed{attempt}").exists():
        attempt += 1
    run_dir.rename(run_dir.with_name(f".{run_dir.name}.failed{attempt}"))


class Stop:
    """The driver's stop request, passed on to every running cell exactly once.

    Cells run in their own process sessions, so a Ctrl-C on the terminal reaches only the driver; the
    driver then sends each cell one SIGINT, on which it checkpoints and exits (a second signal would
    stop it without a checkpoint).
    """

    requested = False
    children: ClassVar[dict[subprocess.Popen[bytes], tuple[Path, ...]]] = {}  # each running trainer → its run dirs
    stopped: ClassVar[set[Path]] = set()  # run directories stopped on their own (a pruned tuning trial's seeds)

    @classmethod
    def request(cls) -> None:
        cls.requested = True
        for process in list(cls.children):
            process.send_signal(signal.SIGINT)

    @classmethod
    def stop_runs(cls, run_dirs: set[Path]) -> None:
        """Stop the trainers of these run directories only, with a checkpoint; none of them starts again."""
        cls.stopped |= run_dirs
        for process, trained in list(cls.children.items()):
            if run_dirs & set(trained):
                process.send_signal(signal.SIGINT)

    @classmethod
    def halted(cls, run_dir: Path) -> bool:
        return cls.requested or run_dir in cls.stopped


def _train(cells: list[Cell], bench_dir: Path, resume: bool) -> list[tuple[str, str | None]]:
    """One ``testbed train`` process for the cells (seeds side by side when there are several); returns each
    cell's status and error. The process's output goes to every cell's log."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           runlog.PARENT_PID: str(os.getpid())}  # fmt: skip
    run_dirs = [cell.run_dir(bench_dir) for cell in cells]
    command = stack_command(cells, bench_dir, resume)
    # One stack log per driver and first seed: two stacks of one cell may run at once, in one folder.
    first = run_dirs[0]
    shared_log = log_path(first) if len(cells) == 1 else first.with_name(f".stack-{os.getpid()}-{first.name}.log")
    with open(shared_log, "a") as log:
        if len(cells) > 1:  # whose log it is, for share_stack_log even after this driver is killed
            log.write(f"# {' '.join(log_path(run_dir).name for run_dir in run_dirs)}\n")
        log.write(f"$ {' '.join(command[1:])}\n")
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)  # fmt: skip
        Stop.children[process] = tuple(run_dirs)
        if Stop.stopped & set(run_dirs):  # stopped while this process was starting
            process.send_signal(signal.SIGINT)
        try:
            returncode = process.wait()
        except KeyboardInterrupt:  # a cancelled Ray task: let the cells checkpoint before leaving
            process.send_signal(signal.SIGINT)
            returncode = process.wait()
        finally:
            Stop.children.pop(process, None)
    if len(cells) > 1:
        share_stack_log(shared_log)
    return [_result(run_dir, returncode) for run_dir in run_dirs]


def share_stack_log(path: Path) -> None:
    """Append a stack's console output (``.stack-<driver pid>-seed<k>.log``, written while it ran) to the log
    of each of its seeds, which its first line names, and remove it."""
    lines = path.read_text(errors="replace").splitlines(keepends=True)
    for name in lines[0].removeprefix("# ").split() if lines else []:
        with open(path.with_name(name), "a") as log:
            log.writelines(lines[1:])
    path.unlink()


def share_orphaned_stack_logs(folder: Path) -> None:
    """The logs of stacks whose driver was killed before it shared them: shared now, unless a trainer still
    writes one of their seeds (it then still writes the log too). This driver's own stacks are running."""
    for path in folder.glob(".stack-*.log"):
        if path.name.startswith(f".stack-{os.getpid()}-"):
            continue
        with open(path, errors="replace") as f:
            names = f.readline().removeprefix("# ").split()
        if not any(runlog.lock_holder(path.with_name(name.removesuffix(".log"))) for name in names):
            share_stack_log(path)


def _result(run_dir: Path, returncode: int) -> tuple[str, str | None]:
    """A trained cell's status and error, from its summary.json (or its log's last lines, without one)."""
    try:
        summary = read_summary(run_dir)
    except BadInput as error:  # a summary cut short: the attempt failed, and is set aside like any other
        return "failed", str(error)
    if summary is None:  # the process died before writing a summary, or its input was refused
        tail = log_path(run_dir).read_text().strip().splitlines()[-3:]
        return "failed", f"exit code {returncode}: {' | '.join(tail)}"
    return str(summary.get("status")), summary.get("error")


def run_cell(cell: Cell, bench_dir: Path, retries: int = 1) -> Outcome:
    """Train one cell: :func:`run_cells` with a stack of one."""
    return run_cells([cell], bench_dir, retries)[0]


def run_cells(cells: list[Cell], bench_dir: Path, retries: int = 1) -> list[Outcome]:
    """Train cells that differ in the seed only, side by side in one process (``train --seeds``): skip those
    done; in one process, resume those with a checkpoint and start the others (a stack resumes any mix);
    retry the failed ones once, from scratch and together.

    A run that failed, or stopped before its first checkpoint, is set aside and starts again. A run
    directory that another process still writes is waited for (:func:`wait_for_writer`), then left alone:
    the cell fails without a retry, and nothing is set aside.
    """
    outcomes: dict[int, Outcome] = {}
    todo: list[int] = []
    run_dirs = [cell.run_dir(bench_dir) for cell in cells]
    for i, (cell, run_dir) in enumerate(zip(cells, run_dirs, strict=True)):
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        holder = wait_for_writer(run_dir)
        if holder is not None:
            outcomes[i] = _still_written(cell, run_dir, holder)
            continue
        share_orphaned_stack_logs(run_dir.parent)  # before the cell's log is set aside or written again
        status = read_status(run_dir)
        if status == "completed":
            outcomes[i] = Outcome(cell, "completed", attempts=0)
            continue
        if run_dir.exists() and (status == "failed" or not (run_dir / runlog.CHECKPOINT).exists()):
            _set_aside(run_dir)
        todo.append(i)
    resumed = {i: (run_dirs[i] / runlog.CHECKPOINT).exists() for i in todo}
    if todo:
        results = _train([cells[i] for i in todo], bench_dir, any(resumed.values()))
        outcomes.update({i: Outcome(cells[i], *result, resumed=resumed[i]) for i, result in zip(todo, results)})

    def to_retry() -> list[int]:
        return [i for i in todo if outcomes[i].status == "failed" and outcomes[i].attempts <= retries
                and not Stop.halted(run_dirs[i])]  # fmt: skip

    while retry := to_retry():
        for i in retry:
            _set_aside(run_dirs[i])
        results = _train([cells[i] for i in retry], bench_dir, False)
        outcomes.update({i: Outcome(cells[i], *result, attempts=outcomes[i].attempts + 1)
                         for i, result in zip(retry, results)})  # fmt: skip
    return [outcomes[i] for i in range(len(cells))]


# ── a cell on a Ray worker: only its run directory and log travel ─────────────────────────────────


def pack_run(run_dir: Path) -> bytes | None:
    """``run_dir`` and its log as a tar.gz, or None when neither exists. Lock files stay behind: they name
    this machine's writer, and the receiving side takes its own."""
    parts = [path for path in (run_dir, log_path(run_dir)) if path.exists()]
    if not parts:
        return None
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in parts:
            tar.add(path, arcname=path.name,
                    filter=lambda info: None if Path(info.name).name == runlog.LOCK else info)  # fmt: skip
    return buffer.getvalue()


def unpack_run(data: bytes, folder: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(folder, filter="data")


def run_cells_remote(
    cells: list[Cell], files: list[bytes | None], retries: int
) -> list[tuple[Outcome, bytes | None]]:
    """A Ray task: run the cells (one stack) in a scratch bench folder, each from the run directory and log in
    its ``files`` if any; send back those run directories and logs only."""
    with tempfile.TemporaryDirectory(prefix="testbed-cells-") as scratch:  # named: a cancelled task leaves it
        for cell, packed in zip(cells, files, strict=True):
            cell.run_dir(Path(scratch)).parent.mkdir(parents=True, exist_ok=True)
            if packed is not None:
                unpack_run(packed, cell.run_dir(Path(scratch)).parent)
        outcomes = run_cells(cells, Path(scratch), retries)
        return [(outcome, pack_run(cell.run_dir(Path(scratch)))) for cell, outcome in zip(cells, outcomes)]


def receive_cell(outcome: Outcome, files: bytes | None, bench_dir: Path) -> Outcome:
    """Put a Ray task's run directory and log in place of the cell's own on this machine.

    The task made the same choice :func:`run_cell` makes here: it continued the directory it was sent
    (``outcome.resumed``), which the returned one then replaces, or it started over, in which case the
    local directory is set aside as it would have been locally. A run that completed here meanwhile is
    kept, and the task's files are dropped.
    """
    run_dir = outcome.cell.run_dir(bench_dir)
    if read_status(run_dir) == "completed":
        return Outcome(outcome.cell, "completed", attempts=0)
    if files is None:  # the task failed before its run directory or log existed
        return outcome
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    # Unpacked beside the run directory (same filesystem, so the moves below are renames), hidden from reports.
    with tempfile.TemporaryDirectory(dir=run_dir.parent, prefix=f".{run_dir.name}.incoming") as incoming:
        unpack_run(files, Path(incoming))
        received = Path(incoming) / run_dir.name
        if run_dir.exists():
            if outcome.resumed:
                run_dir.rename(Path(incoming) / "superseded")  # removed with the temporary folder
            else:
                _set_aside(run_dir)
        if received.is_dir():
            received.rename(run_dir)
        if (Path(incoming) / log_path(run_dir).name).is_file():
            os.replace(Path(incoming) / log_path(run_dir).name, log_path(run_dir))
    return outcome


# ── the grid ───────────────────────────────────────────────────────────────────────────────────────


class Board:
    """Overall progress: a bar and a short live table on a terminal, plain lines elsewhere."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.failed, self.running = total, 0, 0, 0
        self.interactive = sys.stderr.isatty()
        self.start = time.monotonic()
        self.recent: list[str] = []
        if self.interactive:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="run", dynamic_ncols=True, desc="bench")

    def started(self, cell: Cell) -> None:
        self.running += 1
        self._show(f"started  {cell.label} {cell.algo} seed {cell.seed}")

    def finished(self, outcome: Outcome) -> None:
        self.running -= 1
        self.done += 1
        self.failed += outcome.status == "failed"
        skipped = outcome.attempts == 0 and outcome.status == "completed"
        how = "skipped (done)" if skipped else outcome.status + (" (resumed)" if outcome.resumed else "")
        self._show(f"{how:<21} {outcome.cell.label} {outcome.cell.algo} seed {outcome.cell.seed}"
                   + (f": {outcome.error}" if outcome.error and outcome.status == "failed" else ""))  # fmt: skip
        if self.interactive:
            self.bar.update(1)

    def _show(self, line: str) -> None:
        counts = f"[{self.done}/{self.total} done, {self.running} running, {self.failed} failed]"
        if self.interactive:
            self.bar.set_postfix_str(f"running={self.running} failed={self.failed}", refresh=False)
            self.recent = [*self.recent[-4:], line]
            self.bar.write(f"{counts} {line}")
        else:
            print(f"{counts} {line}", flush=True)

    def close(self) -> None:
        if self.interactive:
            self.bar.close()


def run_local(cells: list[Cell], bench_dir: Path, workers: int, retries: int, board: Board,
              stack: int = 1) -> list[Outcome]:  # fmt: skip
    """The cells on ``workers`` processes at a time, seeds packed into stacks of at most ``stack``."""
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: dict[Future[list[Outcome]], list[Cell]] = {}
        queue = pack_stacks(cells, stack)
        try:
            while queue or pending:
                while queue and len(pending) < workers:
                    stacked = queue.pop(0)
                    for cell in stacked:
                        board.started(cell)
                    pending[pool.submit(run_cells, stacked, bench_dir, retries)] = stacked
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    pending.pop(future)
                    for outcome in future.result():
                        outcomes.append(outcome)
                        board.finished(outcome)
        except KeyboardInterrupt:
            Stop.request()  # every running cell checkpoints and exits; wait for them
            queue.clear()
            for future in pending:
                for outcome in future.result():
                    outcomes.append(outcome)
                    board.finished(outcome)
            raise
    return outcomes


def run_ray(cells: list[Cell], bench_dir: Path, retries: int, board: Board, stack: int = 1) -> list[Outcome]:
    """Each stack of cells (seeds packed as on the local backend) is one Ray task asking for one CPU."""
    ray = import_ray()
    remote = ray.remote(num_cpus=1)(run_cells_remote)
    outcomes: list[Outcome] = []
    pending: dict[Any, list[Cell]] = {}
    for stacked in pack_stacks(cells, stack):
        to_send = []
        for cell in stacked:
            run_dir = cell.run_dir(bench_dir)
            board.started(cell)
            holder = wait_for_writer(run_dir)  # a trainer on this machine may still be finishing the cell
            if holder is not None:
                outcomes.append(_still_written(cell, run_dir, holder))
            elif read_status(run_dir) == "completed":
                outcomes.append(Outcome(cell, "completed", attempts=0))
            else:
                to_send.append(cell)
                continue
            board.finished(outcomes[-1])
        if to_send:
            files = [pack_run(cell.run_dir(bench_dir)) for cell in to_send]
            pending[remote.remote(to_send, files, retries)] = to_send
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            pending.pop(ready[0])
            for outcome, files in ray.get(ready[0]):
                outcomes.append(receive_cell(outcome, files, bench_dir))
                board.finished(outcomes[-1])
    except KeyboardInterrupt:
        # Cancelled cells stop at once on their workers; their partial runs stay there, so they restart
        # from scratch next time. Finished cells are already on this machine.
        for ref in pending:
            ray.cancel(ref)
        raise
    return outcomes


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise BadInput("the ray backend needs Ray: pip install -e '.[ray]'") from None
    return ray


def connect_ray(address: str | None, workers: int) -> None:
    """Join a cluster (``auto`` or host:port), or start a local instance; a bad address fails here."""
    ray = import_ray()
    if ray.is_initialized():
        return
    if address and address != "auto":
        # Ray waits minutes on an address where nothing listens; a plain TCP connect answers at once.
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except (OSError, ValueError) as error:
            raise BadInput(f"cannot reach a Ray cluster at {address!r} ({error}). Start one with `ray start --head`, "
                           "or leave --ray-address out for a local instance.") from None  # fmt: skip
    try:
        if address:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        else:
            from lab.raywatch import init_local

            init_local(ray, num_cpus=workers, log_to_driver=False, logging_level="ERROR", include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise BadInput(f"cannot reach a Ray cluster at {address!r} ({error}). Start one with `ray start --head`, "
                       "or leave --ray-address out for a local instance.") from None  # fmt: skip


def build_reports(bench_dir: Path) -> dict[str, Path]:
    """Write the bench report (``lab.report``) and, for a credit study (``credit.yaml``), the study's report.

    Returns every written path, the study's under keys ``credit …``. BadInput if the bench holds no run.
    Both reports are built here, above them, so that ``lab.report`` need not know about credit studies.
    """
    # Imported here: reports load matplotlib, which planning and running a grid never need.
    from lab.credit import STUDY_FILE, build_credit_report
    from lab.report import build_report

    written = build_report(bench_dir)
    if (bench_dir / STUDY_FILE).exists():
        written.update({f"credit {k}": v for k, v in build_credit_report(bench_dir).items()})
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
) -> tuple[Path, list[Outcome]]:
    """Run every cell; rebuild the reports from disk (unless ``report`` is False). Returns the bench
    directory and the outcomes.

    The bench directory stays locked while the grid runs, so a second driver of the same bench is refused
    (BadInput naming this one) before it writes anything. Under the lock, after the grid's settings and
    every cell's summary.json are checked, ``prepare(bench_dir)`` writes what a caller keeps beside the
    bench (a credit study's ``credit.yaml``). ``stack``: the most seeds of one (algo, env) cell trained side
    by side in one process (``train --seeds``), for the algos that support it.
    """
    bench_dir = root / grid.name
    if backend == "ray":
        connect_ray(ray_address, workers)
    elif backend != "local":
        raise BadInput(f"unknown --backend {backend!r}; choose local or ray")
    cells = grid.cells()
    with runlog.DirLock(bench_dir):
        check_bench_dir(bench_dir, grid)
        # Before any cell starts: BadInput naming an unreadable summary.json, or a run trained with other settings.
        others = [why for cell in cells if (why := reused_elsewhere(cell, bench_dir))]
        if others:
            raise BadInput(f"{len(others)} run(s) of {bench_dir} were trained with other settings than this bench asks "
                           f"for (the presets changed?): {'; '.join(others[:3])}{' …' if len(others) > 3 else ''}. "
                           "Use another --name, or move those runs away to train them again.")  # fmt: skip
        if prepare is not None:
            prepare(bench_dir)
        write_bench_yaml(bench_dir, grid)
        outcomes, interrupted = _run_cells(cells, bench_dir, workers, backend, retries, stack)
        try:
            if report:
                build_reports(bench_dir)
        except BadInput:
            pass  # nothing finished yet: nothing to report
    if interrupted:
        raise KeyboardInterrupt
    return bench_dir, outcomes


def _run_cells(
    cells: list[Cell], bench_dir: Path, workers: int, backend: str, retries: int, stack: int = 1
) -> tuple[list[Outcome], bool]:
    """Run the cells on the backend, with SIGTERM and SIGINT stopping them cleanly; (outcomes, interrupted)."""
    board = Board(len(cells))
    outcomes: list[Outcome] = []
    try:
        with stop_signals():
            if backend == "local":
                outcomes = run_local(cells, bench_dir, workers, retries, board, stack)
            else:
                outcomes = run_ray(cells, bench_dir, retries, board, stack)
    except KeyboardInterrupt:
        return outcomes, True
    finally:
        board.close()
    return outcomes, False


@contextmanager
def stop_signals() -> Iterator[None]:
    """While a driver runs: SIGTERM and SIGINT both raise KeyboardInterrupt, on which it stops its runs cleanly.

    A shell starts background jobs (`testbed bench … &`, nohup) with SIGINT ignored, and Python keeps it
    ignored; an explicit SIGINT must still stop the driver. Leaving restores the handlers and the stop state.
    """

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    Stop.requested = False
    previous = signal.signal(signal.SIGTERM, on_term)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        Stop.stopped.clear()
