"""Cells: the runs a bench, a credit study or a tuning study asks for, and how one machine trains them.

A cell is one run (:class:`Cell`). Cells that differ in the seed only train side by side, up to ``--stack``
of them in one ``testbed train --seeds`` process with one torch thread (:func:`pack_stacks`); other cells,
one per process. :func:`run_cells` trains one such stack; ``lab.executor`` runs many, on a pool of processes
or as Ray tasks.

Cells are idempotent: a finished one is recognised from its summary.json without starting a process, an
interrupted one resumes from its checkpoint, as does one whose trainer was killed on its own (by the
out-of-memory killer, say), and a failed one is recorded with its error, set aside and retried once from
scratch, without stopping the others. A :class:`Stop` carries a driver's stop request
(Ctrl-C, SIGTERM, a pruned trial) to the trainers it started: each stops at its next iteration, with a
checkpoint, so rerunning the same command continues. Trainers run in their own process sessions (so that
a Ctrl-C reaches them once, through the driver) and stop with a checkpoint when the driver that started
them dies, even by SIGKILL.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from agents import registry, rundir
from agents.config import RunConfig
from envs.errors import BadInput
from lab.factories import ON_STDIN, by_value, pickled, send
from lab.plan import resolve_run

WRITER_WAIT_S = 30.0
"""How long a cell waits for another process still writing its run directory (the trainer of a driver
that was just killed, finishing its last iteration) before it gives up on the cell."""


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
        argv = [
            sys.executable,
            "-m",
            "lab",
            "train",
            "--algo",
            self.algo,
            "--env",
            self.env_id,
            "--seed",
            str(self.seed),
            "--run-dir",
            str(run_dir),
        ]
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
        steps = {"total_steps": self.total_steps} if self.total_steps is not None else {}
        pairs = [*self.overrides, f"seed={self.seed}", *(f"{k}={v}" for k, v in steps.items())]
        return resolve_run(registry.get(self.algo), self.env_id, pairs)[0]


def reused_elsewhere(cell: Cell, bench_dir: Path) -> str | None:
    """Why the cell's run directory, if it holds a run to reuse (completed, or with a checkpoint to resume),
    is not the run the cell asks for: the older code that trained it, or the settings in which its config.yaml
    differs; None if it is, or holds nothing to reuse."""
    run_dir = cell.run_dir(bench_dir)
    if not (run_dir / "config.yaml").exists() or not (
        (run_dir / rundir.CHECKPOINT).exists() or read_status(run_dir) == "completed"
    ):
        return None
    if (version := rundir.other_code_version(run_dir)) is not None:
        return f"{run_dir} (trained by code version {version}, today's is {rundir.CODE_VERSION})"
    differing = rundir.config_differences(run_dir, cell.algo, cell.config())
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


def pack_pending(cells: list[Cell], bench_dir: Path, stack: int) -> tuple[list[Cell], list[list[Cell]]]:
    """The cells whose run in ``bench_dir`` completed, which need no process, and the others packed among
    themselves (:func:`pack_stacks`).

    Packing only the cells still to train keeps a rerun's seeds in as few processes as a first run's: with
    seeds 0-4 done and 5-7 left, ``stack`` 5 trains 5-7 in one process, not 6 in one and 5, 7 in another.
    The stacks come longest first (:func:`longest_first`). A stack whose driver was killed after its runs
    completed but before it shared its console log leaves that log beside cells that need no process, so
    their folders' orphaned stack logs are shared here (:func:`share_orphaned_stack_logs`)."""
    done = [cell for cell in cells if read_status(cell.run_dir(bench_dir)) == "completed"]
    for folder in sorted({cell.run_dir(bench_dir).parent for cell in done}):
        share_orphaned_stack_logs(folder)
    return done, longest_first(pack_stacks([cell for cell in cells if cell not in done], stack))


def longest_first(stacks: list[list[Cell]]) -> list[list[Cell]]:
    """The stacks, the most env steps first (seeds × each one's budget), ties in their order: a pool that
    starts the longest processes first ends sooner than one that leaves them for last."""
    return sorted(stacks, key=lambda stacked: -len(stacked) * stacked[0].config().total_steps)


def skipped(done: list[Cell]) -> list[Outcome]:
    """The outcomes of cells whose runs completed before: nothing trained."""
    return [Outcome(cell, "completed", attempts=0) for cell in done]


@dataclass
class Outcome:
    cell: Cell
    status: str  # completed, failed, interrupted
    error: str | None = None
    attempts: int = 1
    resumed: bool = False
    diverged: bool = False  # failed on non-finite values: the same config and seed would again, so no retry


# ── one cell ───────────────────────────────────────────────────────────────────────────────────────


def read_status(run_dir: Path) -> str | None:
    """The run's status from its summary.json; None before it has one. BadInput if the file is unreadable."""
    summary = rundir.read_summary(run_dir)
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
    while (holder := rundir.lock_holder(run_dir)) is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    return holder


def kept_diverged(cell: Cell, run_dir: Path, error: str | None) -> Outcome:
    """The outcome of a cell whose run diverged before: failed, kept as it is, and not trained again."""
    return Outcome(
        cell,
        "failed",
        f"{error} Not rerun: on the CPU the same config and seed diverge at the same step. Change the config, or "
        f"delete {run_dir} to train it again.",
        attempts=0,
        diverged=True,
    )


def still_written(cell: Cell, run_dir: Path, holder: str) -> Outcome:
    """The outcome of a cell whose run directory another process still writes: failed, and left as it is."""
    return Outcome(
        cell,
        "failed",
        f"{run_dir} is still being written by {holder}; stop that process (it saves a checkpoint), then rerun the "
        "bench to continue the cell",
        attempts=0,
    )


def set_aside(run_dir: Path) -> None:
    """Keep a failed attempt's directory, renamed, so the retry starts clean and nothing is lost.

    The name is hidden (``.seed0.failed1``), so reports and plots read only the current attempt."""
    if not run_dir.exists():  # the attempt failed before creating its directory (its input was refused)
        return
    attempt = 1
    while run_dir.with_name(f".{run_dir.name}.failed{attempt}").exists():
        attempt += 1
    run_dir.rename(run_dir.with_name(f".{run_dir.name}.failed{attempt}"))


class Stop:
    """A driver's stop request, passed on to every trainer it started, exactly once.

    Trainers run in their own process sessions, so a Ctrl-C on the terminal reaches only the driver; the
    driver then sends each trainer one SIGINT, on which it checkpoints and exits (a second signal would stop
    it without a checkpoint). One object per grid or study, shared by the threads that run its stacks.
    """

    def __init__(self) -> None:
        self.requested = False
        self.children: dict[subprocess.Popen[bytes], tuple[Path, ...]] = {}  # each running trainer → its run dirs
        # Each running trainer → its console log and where this process's output starts in it: the driver's
        # heartbeat reads the trainers' progress lines there (progress.csv reaches the disk only at checkpoints).
        self.logs: dict[subprocess.Popen[bytes], tuple[Path, int]] = {}
        self.stopped: set[Path] = set()  # run directories stopped on their own (a pruned tuning trial's seeds)

    def request(self) -> None:
        """Stop every trainer; none starts again."""
        self.requested = True
        for process in list(self.children):
            process.send_signal(signal.SIGINT)

    def stop_runs(self, run_dirs: set[Path]) -> None:
        """Stop the trainers of these run directories only, with a checkpoint; none of them starts again."""
        self.stopped |= run_dirs
        for process, trained in list(self.children.items()):
            if run_dirs & set(trained):
                process.send_signal(signal.SIGINT)

    def halted(self, run_dir: Path) -> bool:
        return self.requested or run_dir in self.stopped


class Attempt(NamedTuple):
    """How one cell's attempt (one ``testbed train`` process) ended."""

    status: str  # completed, failed, interrupted
    error: str | None
    diverged: bool  # failed on non-finite values: not retried
    resumable: bool  # failed without a summary of its own, and its checkpoint can be continued: not set aside


def _train(cells: list[Cell], bench_dir: Path, resume: bool, stop: Stop) -> list[Attempt]:
    """One ``testbed train`` process for the cells (seeds side by side when there are several); returns how
    each cell's attempt ended. The process's output goes to every cell's log."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        rundir.PARENT_PID: str(os.getpid()),
    }
    run_dirs = [cell.run_dir(bench_dir) for cell in cells]
    before = [summary_stamp(run_dir) for run_dir in run_dirs]  # a summary still there afterwards is an older one
    command = stack_command(cells, bench_dir, resume)
    # An env factory only this process holds goes to the trainer by value, on its standard input (lab.factories).
    factories = by_value({cell.env_id for cell in cells})
    payload = pickled(factories) if factories else None
    if payload is not None:
        env[ON_STDIN] = "1"
    # One stack log per driver and first seed: two stacks of one cell may run at once, in one folder.
    first = run_dirs[0]
    shared_log = log_path(first) if len(cells) == 1 else first.with_name(f".stack-{os.getpid()}-{first.name}.log")
    with open(shared_log, "a") as log:
        if len(cells) > 1:  # whose log it is, for share_stack_log even after this driver is killed
            log.write(f"# {' '.join(log_path(run_dir).name for run_dir in run_dirs)}\n")
        log.write(f"$ {' '.join(command[1:])}\n")
        log.flush()
        stdin = subprocess.PIPE if payload is not None else None
        process = subprocess.Popen(
            command, stdin=stdin, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        if payload is not None:
            assert process.stdin is not None
            send(process.stdin, payload)
        stop.children[process] = tuple(run_dirs)
        stop.logs[process] = (shared_log, log.tell())
        if stop.stopped & set(run_dirs):  # stopped while this process was starting
            process.send_signal(signal.SIGINT)
        try:
            returncode = process.wait()
        except KeyboardInterrupt:  # a cancelled Ray task: let the cells checkpoint before leaving
            process.send_signal(signal.SIGINT)
            returncode = process.wait()
        finally:
            stop.children.pop(process, None)
            stop.logs.pop(process, None)
    if len(cells) > 1:
        share_stack_log(shared_log)
    fresh = [summary_stamp(run_dir) not in (None, stamp) for run_dir, stamp in zip(run_dirs, before, strict=True)]
    # Its checkpoint continues a run whose process was killed (SIGKILL from the out-of-memory killer, say), or
    # whose stack was refused for another seed's checkpoint (that seed wrote its summary, as diverged). A process
    # that exited on its own without a summary refused this run's input, or crashed before training: start again.
    ran = returncode < 0 or any(fresh)
    return [_result(run_dir, returncode, written, ran) for run_dir, written in zip(run_dirs, fresh, strict=True)]


def summary_stamp(run_dir: Path) -> tuple[int, int] | None:
    """Which summary.json ``run_dir`` holds (its inode and modification time), or None: summaries are written
    by a rename, so a new one has another stamp."""
    try:
        stat = (run_dir / "summary.json").stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns


PROGRESS_LINE = re.compile(r"^\[.* seed (?P<seed>\d+)\] step (?P<step>\d+)/\d+ +(?P<sps>\d+) steps/s", re.MULTILINE)
"""A trainer's progress line in its log (``agents.runlog.Progress``, every 10 s when its output is a file):
``[ppo CartPole-v1 seed 3] step 40960/100000  3456 steps/s  recent return 45.3``."""
LOG_TAIL_BYTES = 65536
"""How much of a log's end is read for its latest progress lines: far more than one line per seed of a stack."""


def live_progress(stop: Stop) -> list[tuple[int, float]]:
    """(env steps so far, env steps/s in this session) of every seed that the running trainers have reported,
    from the latest progress line of each seed in their logs."""
    reported = []
    for log, start in list(stop.logs.values()):
        try:
            with open(log, "rb") as f:
                f.seek(max(start, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                text = f.read().decode(errors="replace")
        except OSError:  # a stack's log, shared out and removed as its trainer ended
            continue
        latest = {m["seed"]: (int(m["step"]), float(m["sps"])) for m in PROGRESS_LINE.finditer(text)}
        reported += latest.values()
    return reported


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
        if not any(rundir.lock_holder(path.with_name(name.removesuffix(".log"))) for name in names):
            share_stack_log(path)


def _result(run_dir: Path, returncode: int, written: bool, ran: bool) -> Attempt:
    """How a trained cell's attempt ended, from the summary.json it wrote (``written``), or else its log's
    last lines. ``ran``: its process got past its input (:func:`_train`), so that a run it left without a
    summary continues from its checkpoint."""
    try:
        summary = rundir.read_summary(run_dir) if written else None
    except BadInput as error:  # a summary cut short: the attempt failed, and is set aside like any other
        return Attempt("failed", str(error), False, False)
    if summary is None:  # the process died before writing a summary, or its input was refused
        tail = log_path(run_dir).read_text().strip().splitlines()[-3:]
        ended = f"killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exit code {returncode}"
        resumable = ran and (run_dir / rundir.CHECKPOINT).exists()
        return Attempt("failed", f"{ended}: {' | '.join(tail)}", False, resumable)
    return Attempt(str(summary.get("status")), summary.get("error"), bool(summary.get("diverged")), False)


def run_cells(cells: list[Cell], bench_dir: Path, retries: int = 1, stop: Stop | None = None) -> list[Outcome]:
    """Train cells that differ in the seed only, side by side in one process (``train --seeds``): skip those
    done; in one process, resume those with a checkpoint and start the others (a stack resumes any mix);
    retry the failed ones once, together.

    A run that diverged (non-finite values) is neither retried nor trained again on a rerun: on the CPU its
    seed diverges at the same step every time. A run whose trainer was killed (:class:`Attempt`
    ``resumable``) is retried from its last checkpoint, as a rerun resumes it. Any other run that failed, or
    stopped before its first checkpoint, is set aside and starts again. A run directory that another process
    still writes is waited for (:func:`wait_for_writer`), then left alone: the cell fails without a retry,
    and nothing is set aside. ``stop``: the driver's (a new one by default).
    """
    stop = stop or Stop()
    outcomes: dict[int, Outcome] = {}
    todo: list[int] = []
    run_dirs = [cell.run_dir(bench_dir) for cell in cells]
    for i, (cell, run_dir) in enumerate(zip(cells, run_dirs, strict=True)):
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        holder = wait_for_writer(run_dir)
        if holder is not None:
            outcomes[i] = still_written(cell, run_dir, holder)
            continue
        share_orphaned_stack_logs(run_dir.parent)  # before the cell's log is set aside or written again
        summary = rundir.read_summary(run_dir)
        status = None if summary is None else summary.get("status")
        if status == "completed":
            outcomes[i] = Outcome(cell, "completed", attempts=0)
            continue
        if status == "failed" and summary and summary.get("diverged"):
            outcomes[i] = kept_diverged(cell, run_dir, summary.get("error"))
            continue
        if run_dir.exists() and (status == "failed" or not (run_dir / rundir.CHECKPOINT).exists()):
            set_aside(run_dir)
        todo.append(i)
    resumed = {i: (run_dirs[i] / rundir.CHECKPOINT).exists() for i in todo}
    resumable: dict[int, bool] = {}
    if todo:
        results = _train([cells[i] for i in todo], bench_dir, any(resumed.values()), stop)
        for i, attempt in zip(todo, results, strict=True):
            outcomes[i] = Outcome(
                cells[i], attempt.status, attempt.error, resumed=resumed[i], diverged=attempt.diverged
            )
            resumable[i] = attempt.resumable

    def to_retry() -> list[int]:
        return [
            i
            for i in todo
            if outcomes[i].status == "failed"
            and not outcomes[i].diverged
            and outcomes[i].attempts <= retries
            and not stop.halted(run_dirs[i])
        ]

    while retry := to_retry():
        for i in retry:
            if not resumable[i]:
                set_aside(run_dirs[i])
        # ``resumed``: the run directory still continues the one this call found (a Ray task's: the one it was sent).
        kept = {i: resumable[i] and outcomes[i].resumed for i in retry}
        results = _train([cells[i] for i in retry], bench_dir, any(resumable[i] for i in retry), stop)
        for i, attempt in zip(retry, results, strict=True):
            outcomes[i] = Outcome(
                cells[i],
                attempt.status,
                attempt.error,
                attempts=outcomes[i].attempts + 1,
                resumed=kept[i],
                diverged=attempt.diverged,
            )
            resumable[i] = attempt.resumable
    return [outcomes[i] for i in range(len(cells))]
