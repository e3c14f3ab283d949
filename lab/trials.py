"""One trial of a tuning study: its seeds trained side by side, their evaluations reported to the pruner as
they come, and its end told to the study."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from agents import rundir
from envs.errors import BadInput
from lab.board import Heartbeat
from lab.cells import Cell, Outcome, Stop, live_progress, pack_pending, run_cells, skipped
from lab.document import fmt_duration
from lab.executor import import_ray, pack_run, unpack_run
from lab.raywatch import scratch_folder
from lab.results import read_progress
from lab.study import trial_dir

POLL_S = 1.0
"""How often a running trial's evaluations are read and reported to the pruner."""


Reporter = Callable[[int, float], bool]
"""``report(step, value) → prune?``: hands the pruner the mean evaluation over seeds at ``step``."""


def study_status(
    elapsed: float,
    counts: dict[str, int],
    finished: int,
    trials: int,
    running: int,
    live: list[tuple[int, float]],
    seeds: int,
    steps_per_seed: int | None,
) -> str:
    """One heartbeat of a study: ``[2m10s] trials 3/24 done, 2 running · 5,200 steps/s · ETA 1h30m``.

    Done: the trials ``finished`` before this run of the study, plus this run's ``counts`` by state. ``live``:
    (env steps so far, env steps/s) of each seed the running trials have reported. ETA: the env steps left,
    (trials not done) × seeds × steps per seed less what the running seeds trained, over their current rate;
    n/a until a seed has reported or where the budget varies."""
    done = finished + sum(counts.values())
    rate = sum(sps for _, sps in live)
    eta = "n/a"
    if steps_per_seed and rate > 0:
        left = (trials - done) * seeds * steps_per_seed - sum(step for step, _ in live)
        eta = fmt_duration(max(left, 0) / rate)
    return (
        f"[{fmt_duration(elapsed)}] trials {done}/{trials} done, {running} running · "
        f"{f'{rate:,.0f} steps/s' if live else 'steps/s n/a'} · ETA {eta}"
    )


def study_heartbeat(
    counts: dict[str, int],
    finished: int,
    trials: int,
    pending: dict[Any, Any],
    stop: Stop,
    seeds: int,
    steps_per_seed: int | None,
) -> Heartbeat:
    """A :class:`~lab.board.Heartbeat` that prints :func:`study_status` every 10 s, in logs as on terminals."""
    return Heartbeat(
        lambda elapsed: print(
            study_status(elapsed, counts, finished, trials, len(pending), live_progress(stop), seeds, steps_per_seed),
            flush=True,
        )
    )


def eval_marks(steps: list[int], interval: int) -> list[int]:
    """Each evaluation's step as the pruner sees it: the multiple of ``interval`` (``eval_interval``) that the run
    had just passed when it evaluated; its own step where an earlier evaluation took that mark (the final one)
    or there is none (``interval`` 0, or before the first). A run evaluates after the iteration that passes a
    mark, so runs whose iterations differ evaluate at different steps past the same mark: keyed by the mark,
    Optuna's pruner compares them there, as RL Zoo compares its trials' n-th evaluations."""
    keys: list[int] = []
    for step in steps:
        mark = step // interval * interval if interval else 0
        keys.append(mark if mark > 0 and mark not in keys else step)
    return keys


def mean_curve(run_dirs: list[Path]) -> dict[int, float]:
    """The mean over runs of each evaluation that every run has reached so far (:func:`eval_marks` → mean return)."""
    curves = []
    for run_dir in run_dirs:
        steps, _, returns, _, _ = read_progress(run_dir / "progress.csv")
        interval = int(rundir.read_config(run_dir).get("eval_interval") or 0) if len(steps) else 0
        curves.append(dict(zip(eval_marks(steps.tolist(), interval), returns.tolist())))
    common = set.intersection(*(set(c) for c in curves)) if curves else set()
    return {int(s): float(np.mean([c[s] for c in curves])) for s in sorted(common)}


def run_trial(
    cells: list[Cell], bench_dir: Path, report: Reporter, retries: int = 1, stack: int = 1, stop: Stop | None = None
) -> tuple[list[Outcome], bool]:
    """Train the trial's seeds side by side, in stacks of at most ``stack`` seeds per process (for the algos
    that support it); stop them all when the pruner says so. ``stop``: the driver's, which also stops the
    trial's trainers on Ctrl-C (a new one by default). (outcomes, pruned)."""
    stop = stop or Stop()
    run_dirs = [cell.run_dir(bench_dir) for cell in cells]
    reported: set[int] = set()
    pruned = False

    def report_new() -> bool:
        for step, value in mean_curve(run_dirs).items():
            if step not in reported:
                reported.add(step)
                if report(step, value):
                    return True
        return False

    done, stacks = pack_pending(cells, bench_dir, stack)
    by_seed = {o.cell.seed: o for o in skipped(done)}
    with ThreadPoolExecutor(max_workers=max(len(stacks), 1)) as pool:
        futures = [pool.submit(run_cells, stacked, bench_dir, retries, stop) for stacked in stacks]
        while not all(f.done() for f in futures):
            wait(futures, timeout=POLL_S)
            if not pruned and report_new():
                pruned = True
                stop.stop_runs(set(run_dirs))
        by_seed.update((o.cell.seed, o) for f in futures for o in f.result())
        outcomes = [by_seed[cell.seed] for cell in cells]
    if not pruned and all(o.status == "completed" for o in outcomes):
        report_new()  # the last evaluations, written as the runs ended: later trials are pruned against them
    return outcomes, pruned


def reporter_for(study: optuna.Study, trial_id: int) -> Reporter:

    trial = optuna.trial.Trial(study, trial_id)
    # A resumed trial reported some steps before its driver was killed; Optuna takes each step once.
    done = set(study._storage.get_trial(trial_id).intermediate_values)

    def report(step: int, value: float) -> bool:
        if step not in done:
            trial.report(value, step)
            done.add(step)
        return trial.should_prune()

    return report


def run_trial_remote(cells: list[Cell], files: list[bytes | None], reporter: Any, trial_id: int, stack: int) -> Any:
    """A Ray task: the trial's seeds in a scratch folder; returns (outcomes, pruned, each run's files)."""

    ray = import_ray()
    with scratch_folder("testbed-trial-") as scratch:  # in the instance's folder: a killed worker's goes with it
        for cell, packed in zip(cells, files):
            cell.run_dir(Path(scratch)).parent.mkdir(parents=True, exist_ok=True)
            if packed is not None:
                unpack_run(packed, cell.run_dir(Path(scratch)).parent)
        outcomes, pruned = run_trial(
            cells, Path(scratch), lambda s, v: ray.get(reporter.report.remote(trial_id, s, v)), stack=stack
        )
        return outcomes, pruned, [pack_run(cell.run_dir(Path(scratch))) for cell in cells]


REFUSED = "config refused"
"""How a trial's ``error`` attribute begins when the algo's config refused its sample: it trained nothing."""


def refused(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether the algo's config refused the trial's sample (:data:`REFUSED`), so that it trained nothing."""
    return str(trial.user_attrs.get("error", "")).startswith(REFUSED)


COST = "cost"
"""The user attribute where the study keeps a finished trial's cost, (env steps, env steps per seed, wall-clock s):
the study then holds its own budget when the trials' runs are not at hand."""


def measured_cost(bench_dir: Path) -> tuple[int, int, float] | None:
    """(env steps, env steps per seed, wall-clock s) of a trial, from its runs: all steps it spent, summed over
    its seeds and failed attempts; the most that one seed trained; the time of its slowest seed. None when
    ``bench_dir`` holds no run."""
    progresses = sorted(bench_dir.rglob("progress.csv")) if bench_dir.exists() else []
    if not progresses:
        return None
    steps, per_seed, seconds = 0, 0, 0.0
    for progress in progresses:
        _, _, _, last_step, last_time = read_progress(progress)
        if any(part.startswith(".") for part in progress.relative_to(bench_dir).parts):
            steps += last_step  # a failed attempt, set aside: its steps count, its time is not the trial's
            continue
        summary = rundir.read_summary(progress.parent) or {}
        trained = int(summary.get("total_steps") or last_step)
        steps, per_seed = steps + trained, max(per_seed, trained)
        seconds = max(seconds, float(summary.get("wall_time_s") or last_time))
    return steps, per_seed, seconds


def trial_cost(trial: optuna.trial.FrozenTrial, tune_dir: Path) -> tuple[int, int, float] | None:
    """A trial's cost: measured from its runs where they are here, else as the study recorded it when the trial
    ended (:data:`COST`); nothing for a trial that has not trained or whose sample the config refused. None for a
    finished trial whose runs are elsewhere, in a study that ran before trials recorded their cost."""
    measured = measured_cost(trial_dir(tune_dir, trial.number))
    if measured is not None:
        return measured
    if COST in trial.user_attrs:
        steps, per_seed, seconds = trial.user_attrs[COST]
        return int(steps), int(per_seed), float(seconds)
    return (0, 0, 0.0) if refused(trial) or not trial.state.is_finished() else None


def known_costs(trials: list[optuna.trial.FrozenTrial], tune_dir: Path) -> dict[int, tuple[int, int, float]]:
    """Every trial's cost by number (:func:`trial_cost`), refusing a study whose report would count finished
    trials as costing nothing: their runs are not in ``tune_dir`` and the study does not record their cost.
    Called before any work, so the report kept stays."""
    costs = {t.number: trial_cost(t, tune_dir) for t in trials}
    unknown = [number for number, cost in costs.items() if cost is None]
    if unknown:
        shown = ", ".join(map(str, unknown[:8])) + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
        raise BadInput(
            f"{tune_dir} lacks the runs of trials {shown} (folders trialNNNN), and the study ran before trials "
            "recorded their cost in it, so a report from here would count their env steps as 0. Restore the folders "
            "(`testbed results restore NAME` where the result carries them), or keep the report built where they are; "
            "nothing was run or written"
        )
    return {number: cost for number, cost in costs.items() if cost is not None}


def settle(
    study: optuna.Study, trial: Any, outcomes: list[Outcome], pruned: bool, bench_dir: Path
) -> tuple[str, float | None]:
    """Tell the study how the trial ended, with its cost (:data:`COST`): (state, score). An interrupted trial
    stays running, to resume."""

    states = optuna.trial.TrialState
    failed = [o for o in outcomes if o.status == "failed"]
    if not pruned and not failed and any(o.status != "completed" for o in outcomes):
        return "interrupted", None
    optuna.trial.Trial(study, trial._trial_id).set_user_attr(COST, list(measured_cost(bench_dir) or (0, 0, 0.0)))
    if pruned:
        study.tell(trial.number, state=states.PRUNED)
        return "pruned", None
    if failed:
        error = f"seed {failed[0].cell.seed}: {failed[0].error}"
    else:
        finals = [
            (rundir.read_summary(o.cell.run_dir(bench_dir)) or {}).get("final_eval_return_mean") for o in outcomes
        ]
        if all(v is not None and math.isfinite(float(v)) for v in finals):
            score = float(np.mean([float(v) for v in finals]))
            study.tell(trial.number, score)
            return "completed", score
        error = "a seed completed without a finite final evaluation"
    optuna.trial.Trial(study, trial._trial_id).set_user_attr("error", error)
    study.tell(trial.number, state=states.FAIL)
    return "failed", None
