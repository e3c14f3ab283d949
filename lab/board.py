"""The progress a driver shows while cells run: a heartbeat thread and the board of runs done, processes,
env steps/s and ETA (``testbed bench``, ``credit``; ``tune`` and ``audit`` beat with their own lines)."""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from lab.cells import Cell, Outcome, pack_stacks
from lab.document import fmt_duration

HEARTBEAT_S = 10.0
"""Seconds between heartbeats while a grid runs or its report is built: a silent minute reads as a hang. The
trainers print their progress lines (which the heartbeat reads) as often."""


class Heartbeat:
    """Calls ``beat(elapsed_s)`` every ``every_s`` seconds on a thread of its own, from entering until leaving."""

    def __init__(self, beat: Callable[[float], None], every_s: float = HEARTBEAT_S) -> None:
        if not every_s > 0:
            raise ValueError(f"a heartbeat interval must be positive, got {every_s}")
        self.beat, self.every_s = beat, every_s
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def _run(self) -> None:
        start = time.monotonic()
        while not self.halt.wait(self.every_s):
            self.beat(time.monotonic() - start)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.thread.join()


class Board:
    """Overall progress: a line as each process starts and each run ends, and, at each :meth:`beat` (a
    :class:`Heartbeat` calls it), the done/total runs, the trainer processes and the runs in them, env steps/s
    over the grid and an ETA.

    Processes and runs differ: a process trains a stack of up to ``--stack`` seeds. ``slots``: the processes
    that run at once (``--workers``), or None on Ray, which queues its tasks itself. ``probe``: (steps so far,
    steps/s) of each seed the running trainers have reported (:func:`lab.cells.live_progress`); without one (Ray,
    whose trainers log on other machines) the ETA comes from the runs finished so far. Where every run left
    has a time budget (``budget_seconds``) and the processes run locally, the ETA is at most the time those
    budgets leave: the running stacks' rest, then the queued stacks' budgets, ``slots`` (packed as ``stack``)
    at a time. On a terminal a bar carries the heartbeat; where stdout is not a terminal (a log, CI), each
    heartbeat is a plain line too.
    """

    def __init__(
        self,
        cells: list[Cell],
        slots: int | None,
        probe: Callable[[], list[tuple[int, float]]] | None = None,
        stack: int = 1,
    ) -> None:
        self.cells, self.total, self.slots, self.probe, self.stack = cells, len(cells), slots, probe, stack
        self.done = self.failed = self.interrupted = self.running = self.processes = self.trained = 0
        self.ended: set[Cell] = set()
        self.launches: dict[Cell, float] = {}  # cell → when its process started
        # stack key → (total_steps, budget_seconds): resolved once, not per seed
        self.budgets: dict[tuple[Any, ...], tuple[int, float | None]] = {}
        self.rate: float | None = None  # the last env steps/s measured: kept while trainers start up
        self.interactive = sys.stderr.isatty()
        self.lines = not (self.interactive and sys.stdout.isatty())  # heartbeats as lines, unless all is a terminal
        self.start = time.monotonic()
        self.lock = threading.Lock()
        if self.interactive:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, unit="run", dynamic_ncols=True, desc="bench")

    def launched(self, cells: list[Cell], process: bool = True) -> None:
        """``cells`` start, side by side in one process (or Ray task); ``process=False``: resolved without one,
        which shows only how it ended."""
        self.running += len(cells)
        self.processes += process
        self.launches.update((cell, time.monotonic()) for cell in cells)
        if process:
            seeds = ",".join(str(cell.seed) for cell in cells)
            self._show(f"started  {cells[0].label} {cells[0].algo} seed{'s' if len(cells) > 1 else ''} {seeds}")

    def resolved(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Cells that ended without a process (done before, or another's to write), shown; returns ``outcomes``."""
        for outcome in outcomes:
            self.launched([outcome.cell], process=False)
            self.finished(outcome)
        return outcomes

    def finished(self, outcome: Outcome) -> None:
        self.running -= 1
        # An interrupted run resumes on the next invocation: it has ended here but is not done.
        self.interrupted += outcome.status == "interrupted"
        self.done += outcome.status != "interrupted"
        self.failed += outcome.status == "failed"
        self.trained += outcome.attempts > 0
        self.ended.add(outcome.cell)
        skipped = outcome.attempts == 0 and outcome.status == "completed"
        how = "skipped (done)" if skipped else outcome.status + (" (resumed)" if outcome.resumed else "")
        self._show(
            f"{how:<21} {outcome.cell.label} {outcome.cell.algo} seed {outcome.cell.seed}"
            + (f": {outcome.error}" if outcome.error and outcome.status == "failed" else "")
        )
        if self.interactive:
            self.bar.update(1)

    def exited(self, outcomes: list[Outcome]) -> None:
        """A process (or Ray task) has ended, with these outcomes of its runs."""
        self.processes -= 1
        for outcome in outcomes:
            self.finished(outcome)

    def _budget(self, cell: Cell) -> tuple[int, float | None]:
        """The cell's (env steps, seconds) budget; seconds None: no time budget."""
        if cell.stack_key not in self.budgets:
            config = cell.config()
            self.budgets[cell.stack_key] = config.total_steps, config.budget_seconds
        return self.budgets[cell.stack_key]

    def _time_left(self, left: list[Cell]) -> float | None:
        """An upper bound on the time the runs ``left`` still take, if each has a time budget; None otherwise."""
        if not left or self.slots is None:
            return None
        seconds: dict[Cell, float] = {}
        for cell in left:
            budget = self._budget(cell)[1]
            if budget is None:
                return None
            seconds[cell] = budget
        now = time.monotonic()
        running = [seconds[c] - (now - self.launches[c]) for c in left if c in self.launches]
        queued = pack_stacks([c for c in left if c not in self.launches], self.stack)
        waves = math.ceil(len(queued) / self.slots)  # queued stacks start as slots free: a bound, not a schedule
        longest = max((seconds[stacked[0]] for stacked in queued), default=0.0)
        return max([0.0, *running]) + waves * longest

    def status(self) -> str:
        """``processes 2/2 · runs 6 running, 3/9 done · 41,200 steps/s · ETA 1m20s``"""
        elapsed = time.monotonic() - self.start
        live = self.probe() if self.probe is not None else []
        if live:
            self.rate = sum(sps for _, sps in live)
        eta: float | None = None
        if self.done == self.total:
            eta = 0.0
        elif self.rate:  # the steps left of every run not ended, over the rate of those training now
            left = sum(self._budget(cell)[0] for cell in self.cells if cell not in self.ended)
            eta = max(left - sum(step for step, _ in live), 0) / self.rate
        elif self.trained:
            eta = elapsed / self.trained * (self.total - self.done)
        bound = None if eta == 0.0 else self._time_left([cell for cell in self.cells if cell not in self.ended])
        if bound is not None:
            eta = bound if eta is None else min(eta, bound)
        where = f"processes {self.processes}/{self.slots}" if self.slots else f"Ray tasks {self.processes}"
        failed = f" ({self.failed} failed)" if self.failed else ""
        failed += f", {self.interrupted} interrupted" if self.interrupted else ""
        rate = f"{self.rate:,.0f} steps/s" if self.rate is not None else "steps/s n/a"
        return (
            f"{where} · runs {self.running} running, {self.done}/{self.total} done{failed} · {rate} · ETA "
            f"{fmt_duration(eta) if eta is not None else 'n/a'}"
        )

    def beat(self) -> None:
        """One heartbeat: the bar's text on a terminal, and a plain line where stdout is not one."""
        text = self.status()
        if self.interactive:
            with self.lock:
                self.bar.set_postfix_str(text)
        if self.lines:
            self._print(f"[{fmt_duration(time.monotonic() - self.start)}] {text}")

    def _show(self, line: str) -> None:
        interrupted = f", {self.interrupted} interrupted" if self.interrupted else ""
        processes = f"{self.processes} process{'es' if self.processes != 1 else ''}"
        self._print(
            f"[{self.done}/{self.total} done, {self.running} running in {processes}, {self.failed} "
            f"failed{interrupted}] {line}"
        )

    def _print(self, line: str) -> None:
        with self.lock:  # the heartbeat's thread prints too
            if self.interactive:
                self.bar.write(line)  # above the bar, which stays at the bottom
            else:
                print(line, flush=True)

    def close(self) -> None:
        """A last heartbeat, which says where the grid ended, and the bar closed."""
        self.beat()
        if self.interactive:
            self.bar.close()
