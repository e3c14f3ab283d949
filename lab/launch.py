"""Carrying out ``testbed train``'s plan (:func:`lab.plan.plan_train`): lock its run directories, write their
``config.yaml`` and ``meta.json``, train, and return each run's summary. The command line (``lab.cli``) and the
Python API (``lab.api``) both train through :func:`train_planned`, and print or return what it gives.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from agents import rundir
from lab.plan import TrainPlan

if TYPE_CHECKING:
    from agents.training import Callback


def train_planned(
    plan: TrainPlan,
    algo_name: str,
    announce: Callable[[TrainPlan], None] | None = None,
    callback: Callback | None = None,
    command: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Train the plan's runs, one per process or, with seeds, side by side; returns each run's summary, in the
    plan's order (a run that had nothing left to do gives its summary.json).

    Every run directory is locked for the whole of it. A new run writes its ``config.yaml`` (a resumed one that
    changes its budget too), and every run that trains a ``meta.json`` (a resume's beside the first). ``announce``
    is called once the runs are locked and recorded, before training (the command line's lines). ``callback``:
    called after each iteration (``agents.training.Callback``). ``command``: the ``testbed train …`` line that
    ``meta.json`` records, where it is not this process's own command line (the API's)."""
    extra: dict[str, Any] = {} if command is None else {"command": list(command)}
    with contextlib.ExitStack() as locks:
        for r in plan.runs:
            locks.enter_context(rundir.prepare_run_dir(r.run_dir, r.mode != "new"))
        for r in plan.runs:
            if r.mode == "new" or (r.mode == "resume" and r.cfg.total_steps != r.saved.get("total_steps")):
                rundir.write_config(r.run_dir, algo_name, r.cfg)
            if r.mode != "done":
                rundir.write_meta(r.run_dir, {"preset": r.preset, "resumed": r.mode == "resume", **extra})
        if announce is not None:
            announce(plan)
        active = [r for r in plan.runs if r.mode != "done"]
        hook: dict[str, Any] = {} if callback is None else {"callback": callback}
        trained: list[dict[str, Any]] = []
        if active and plan.seeds is None:
            first = plan.runs[0]
            trained = [plan.algo.train(first.cfg, first.run_dir, first.mode == "resume", algo_name, **hook)]
        elif active:
            assert plan.algo.train_stack is not None
            trained = plan.algo.train_stack(
                [r.cfg for r in active],
                [r.run_dir for r in active],
                [r.mode == "resume" for r in active],
                algo_name,
                **hook,
            )
        by_dir = {r.run_dir: summary for r, summary in zip(active, trained, strict=True)}
        return [by_dir[r.run_dir] if r.run_dir in by_dir else rundir.read_summary(r.run_dir) or {} for r in plan.runs]
