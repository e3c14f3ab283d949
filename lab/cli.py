"""The ``testbed`` command line: ``train``, ``eval``, ``bench``, ``credit``, ``tune``, ``docs``, ``plot`` and
``report``.

Bad input exits with status 2 and a one-paragraph message, before any work starts.

Start-up: the modules that import torch (the algorithms, the lifecycle, checkpoints) or scipy and matplotlib
(reports) are imported inside the commands that use them, and algo names are checked against the registry's
list, which imports no algorithm. Torch alone takes seconds to import; ``--help``, a bad argument and a
misspelled algo or env id are answered without it.
"""

from __future__ import annotations

import argparse
import errno
import os
import statistics
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agents import registry, rundir
from agents.config import build_config, parse_key_values
from envs import check_env_id
from envs.errors import BadInput, brief
from envs.factory import check_can_render, check_saved_env_id
from lab import bench, manifest
from lab.document import counted
from lab.factories import receive as receive_factories
from lab.launch import train_planned
from lab.parser import GRADIENT_DEFAULTS, build_parser, check_sizes
from lab.plan import TrainPlan, check_folder, check_run_folder, checkpoint_policy, plan_train, preset_note
from lab.study import TUNE_FILE

if TYPE_CHECKING:
    from lab import credit, tune

EXIT_CODES = {"completed": 0, "failed": 1, "interrupted": 130}


def plan_training(args: argparse.Namespace) -> TrainPlan:
    """``testbed train``'s runs, every check done before anything is written (:func:`lab.plan.plan_train`)."""
    check_sizes(args)
    return plan_train(args)


def cmd_train(args: argparse.Namespace) -> int:
    # gymnasium warns that an old env version is out of date each time one is made, twice while planning and
    # again in training (its "once" filter is reset whenever a filter is added): shown once, before the note.
    with warnings.catch_warnings(record=True) as caught:
        plan = plan_training(args)
    algo, runs, seeds = plan.algo, plan.runs, plan.seeds
    for shown in {str(w.message): w for w in caught}.values():
        warnings.showwarning(shown.message, shown.category, shown.filename, shown.lineno)
    warnings.filterwarnings("ignore", message=r".*is out of date", category=DeprecationWarning)
    note = preset_note(algo, args.env, runs[0].preset) if args.preset is None and not args.resume else None
    if note:
        print(note, file=sys.stderr)
    first = runs[0]

    def announce(plan: TrainPlan) -> None:
        if seeds is None:
            print(
                f"{args.algo} on {first.cfg.env_id}, seed {first.cfg.seed}, {first.cfg.total_steps} steps, preset "
                f"{first.preset}"
            )
        else:
            print(
                f"{args.algo} on {first.cfg.env_id}, seeds {', '.join(map(str, seeds))} side by side, "
                f"{first.cfg.total_steps} steps each, preset {first.preset}"
            )
        for r in plan.runs:
            if r.mode == "done":
                print(f"{r.run_dir} completed its {r.cfg.total_steps} steps already: nothing to do")
            elif r.mode == "new" and r.saved:
                print(f"{r.run_dir} stopped before its first checkpoint: it starts again from its config.yaml")
        print(
            f"run directory: {first.run_dir}" if seeds is None else f"run directories: {first.run_dir.parent}/seed<k>"
        )

    summaries = train_planned(plan, args.algo, announce)

    for summary in summaries:
        if summary["status"] == "failed":
            print(f"error (seed {summary['seed']}): {summary['error']}", file=sys.stderr)
    # One line a seed; the whole summary stays in each run's summary.json.
    if seeds is None:
        print(seed_line(summaries[0]))
        print(
            f"run folder: {first.run_dir} (summary.json, progress.csv, checkpoint; TensorBoard: tensorboard --logdir "
            f"{first.run_dir})"
        )
    else:
        for r, summary in zip(runs, summaries, strict=True):
            print(f"{seed_line(summary)}, {r.run_dir}")
        print(seeds_line(summaries))
        print(f"every seed's summary.json is in its folder; TensorBoard: tensorboard --logdir {first.run_dir.parent}")
    statuses = {summary["status"] for summary in summaries}
    return EXIT_CODES[next(s for s in ("failed", "interrupted", "completed") if s in statuses)]


def seed_line(summary: dict[str, Any]) -> str:
    """``seed 3: final eval return 500.00 ± 0.00 (10 episodes), 2,048 steps, 12.3 s`` from a summary.json."""
    where = f"{summary.get('total_steps') or 0:,} steps, {summary.get('wall_time_s') or 0.0:.1f} s"
    mean = summary.get("final_eval_return_mean")
    if summary.get("status") != "completed" or mean is None:
        return f"seed {summary.get('seed')}: {summary.get('status')} after {where}"
    std, episodes = summary.get("final_eval_return_std") or 0.0, summary.get("final_eval_episodes")
    return f"seed {summary['seed']}: final eval return {mean:.2f} ± {std:.2f} ({episodes} episodes), {where}"


def seeds_line(summaries: list[dict[str, Any]]) -> str:
    """The mean ± std over seeds of their final eval returns: the population std (ddof 0), as SB3 reports."""
    finals = [
        s["final_eval_return_mean"]
        for s in summaries
        if s.get("status") == "completed" and s.get("final_eval_return_mean") is not None
    ]
    if not finals:
        return f"no seed of {len(summaries)} completed: no mean over seeds"
    n = len(summaries)
    over = f"{n} seeds" if len(finals) == n else f"the {len(finals)} of {n} seeds that completed"
    return f"mean ± std over {over}: {statistics.fmean(finals):.2f} ± {statistics.pstdev(finals):.2f}"


@dataclass
class Evaluation:
    """What ``testbed eval`` measured: a run's policy over fixed episode seeds."""

    env_id: str
    global_step: int
    """The env steps its checkpoint had trained."""
    seeds: list[int]
    """The episodes' reset seeds, one episode each (shared by every run: common random numbers)."""
    returns: np.ndarray
    """(episodes,) each episode's undiscounted return."""
    deterministic: bool
    video: Path | None = None
    """The first episode's GIF, where one was asked for."""


def evaluate_run(args: argparse.Namespace) -> Evaluation:
    """``testbed eval``'s work, every check first: the run's checkpoint, acting in its env (with ``--env-kwargs`` on
    top of the run's own) for ``--episodes`` episodes, and the first one's video when ``--video`` asks."""
    check_sizes(args)  # --episodes: one env each
    run_dir = Path(args.run_dir)
    check_run_folder(run_dir)
    values = rundir.read_config(run_dir)
    algo_name = values.pop("algo")
    if algo_name not in registry.entries():
        raise BadInput(f"{run_dir} was written by algo {brief(algo_name, 60)}, which this command cannot evaluate")
    # A run folder is data: its env id imports nothing unless the user trusts it.
    check_saved_env_id(values.get("env_id"), str(run_dir / "config.yaml"), args.trust_env_module)
    import torch

    from agents.rollout import evaluate_policy
    from agents.run_envs import EVAL_SEED_BASE, check_env

    torch.set_num_threads(1)
    video_dir = _writable_dir(Path(args.video)) if args.video else None
    if args.env_kwargs:  # on top of the run's own, at evaluation only: the env the policy trained in stays
        try:
            extra = parse_key_values(args.env_kwargs)
        except ValueError as error:
            raise BadInput(f"--env-kwargs: {error}; give KEY:VALUE pairs, e.g. contact_cost_weight:0") from None
        values["eval_env_kwargs"] = {**(values.get("eval_env_kwargs") or {}), **extra}
    algo = registry.get(algo_name)
    cfg = build_config(algo.config, values)
    if args.env_kwargs:
        check_env(cfg)
    if video_dir is not None:  # before the evaluation: a machine that cannot draw says so at once
        check_can_render(cfg.env_id)
    ckpt, env, model = checkpoint_policy(algo, cfg, run_dir, args.episodes)
    try:
        seeds = [EVAL_SEED_BASE + i for i in range(args.episodes)]
        returns = evaluate_policy(model, env, seeds, deterministic=not args.stochastic)
    finally:
        env.close()
    done = Evaluation(cfg.env_id, ckpt["global_step"], seeds, returns, not args.stochastic)
    if video_dir is not None:
        from lab.video import record_episode

        done.video = record_episode(model, cfg.env_id, ckpt["normalizers"], video_dir, seeds[0], not args.stochastic)
    return done


def cmd_eval(args: argparse.Namespace) -> int:
    done = evaluate_run(args)
    mode = "deterministic" if done.deterministic else "stochastic"
    print(
        f"{done.env_id} after {done.global_step} steps, {mode}, {len(done.seeds)} episodes (seeds {done.seeds[0]}…): "
        f"return {done.returns.mean():.2f} ± {done.returns.std():.2f} (std over episodes)"
    )
    if done.video is not None:
        print(f"video of the first episode: {done.video}")
    return 0


def _writable_dir(path: Path) -> Path:
    """``path`` as a folder this process can write into (created if absent), or BadInput saying why not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BadInput(f"cannot create {path} ({error.strerror}); choose a folder you can write to") from None
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise BadInput(f"{path} is not a folder you can write to; choose another")
    return path


def _workers(args: argparse.Namespace) -> int:
    if args.workers is not None and args.workers < 1:
        raise BadInput(f"--workers must be at least 1, got {args.workers}")
    return args.workers or os.cpu_count() or 1


def stack_size(args: argparse.Namespace) -> int:
    """``--stack``: the most seeds one trainer process trains side by side."""
    if args.stack < 1:
        raise BadInput(f"--stack must be at least 1 (1 trains each seed in its own process), got {args.stack}")
    return args.stack


def _stopped_cells(backend: str, what: str) -> str:
    """What a Ctrl-C left of the running ``what``: checkpoints on the local backend; on Ray, a cancelled task's
    checkpoints stay on its worker, so those runs start again (docs/faults.md, known limits)."""
    if backend == "ray":
        return f"finished {what} are kept; running ones were cancelled and start again"
    return f"running {what} saved checkpoints"


def _run_grid(
    grid: Any,
    workers: int,
    args: argparse.Namespace,
    reports: str,
    prepare: Callable[[Path], None] | None = None,
    reuse_from: Sequence[Path] = (),
) -> int:
    """Run a planned grid, then say what completed, where the reports are, and what failed."""
    try:
        bench_dir, outcomes = bench.run_grid(
            grid,
            workers,
            args.backend,
            args.ray_address,
            prepare=prepare,
            stack=stack_size(args),
            reuse_from=reuse_from,
        )
    except KeyboardInterrupt:
        stopped = _stopped_cells(args.backend, "cells")
        print(f"interrupted: {stopped}; rerun the same command to continue", file=sys.stderr)
        return 130
    failed = [o for o in outcomes if o.status != "completed"]
    print(
        f"{len(outcomes) - len(failed)} of {len(grid.cells())} runs completed; {reports.format(bench_dir)}; "
        f"TensorBoard: tensorboard --logdir {bench_dir}"
    )
    for outcome in failed:
        print(f"  {outcome.status}: {outcome.cell.label} {outcome.cell.algo} seed {outcome.cell.seed}: {outcome.error}")
    return 1 if failed else 0


def grid_sets(args: argparse.Namespace) -> list[str]:
    """A grid's ``--set`` overrides, ``--budget-seconds`` among them: every run of the grid gets the same."""
    return [*args.set, *([f"budget_seconds={args.budget_seconds}"] if args.budget_seconds is not None else [])]


def plan_bench(args: argparse.Namespace) -> tuple[bench.Grid, int, list[Path]]:
    """``testbed bench``'s grid, checked whole (every cell's config resolved), its workers and the benches it
    reuses runs from."""
    check_sizes(args)
    workers = _workers(args)
    grid = bench.plan_grid(
        args.suite,
        args.algos,
        args.envs,
        args.seeds,
        args.total_steps,
        grid_sets(args),
        args.name,
        first_seed=args.first_seed,
    )
    reuse_from = [Path(folder) for folder in args.reuse_from or []]
    for folder in reuse_from:
        if not folder.is_dir():
            raise BadInput(
                f"--reuse-from {brief(str(folder), 80)} is not a folder; give another bench's folder, runs/bench/NAME"
            )
    return grid, workers, reuse_from


def cmd_bench(args: argparse.Namespace) -> int:
    grid, workers, reuse_from = plan_bench(args)
    cells = len(grid.cells())
    print(
        f"bench {grid.name}: {counted(len(grid.algos), 'algo')} × {counted(len(grid.envs), 'env')} × "
        f"{counted(len(grid.seeds), 'seed')} = {counted(cells, 'run')}, {args.backend} backend, "
        f"{counted(workers, 'process', 'processes')} at a time → {bench.BENCH_ROOT / grid.name}"
    )
    return _run_grid(grid, workers, args, "report: {0}/report.md", reuse_from=reuse_from)


def plan_credit(args: argparse.Namespace) -> tuple[bench.Grid, credit.Study, int]:
    """``testbed credit``'s study, its grid (one variant per horizon or delay, checked whole) and its workers."""
    from lab import credit

    check_sizes(args)
    workers = _workers(args)
    study = credit.plan_study(args.task, args.horizons, args.env_kwargs)
    name = args.name or "credit-" + args.task.replace(":", "-").replace("/", "_")
    grid = bench.plan_grid(
        None,
        args.algos,
        [study.env_id],
        args.seeds,
        args.total_steps,
        grid_sets(args),
        name,
        variants=study.variants(),
        first_seed=args.first_seed,
    )
    return grid, study, workers


def cmd_credit(args: argparse.Namespace) -> int:
    from lab import credit

    grid, study, workers = plan_credit(args)
    bench_dir = bench.BENCH_ROOT / grid.name
    print(
        f"credit study {grid.name}: {study.env_id}, {study.axis} {' '.join(study.horizons)} × "
        f"{counted(len(grid.algos), 'algo')} × {counted(len(grid.seeds), 'seed')} = "
        f"{counted(len(grid.cells()), 'run')}, {args.backend} backend, {counted(workers, 'process', 'processes')} at a "
        f"time → {bench_dir}"
    )
    return _run_grid(
        grid,
        workers,
        args,
        "study report: {0}/credit.md; bench report: {0}/report.md",
        prepare=lambda folder: credit.write_study(folder, study),
    )


def gradient_settings(args: argparse.Namespace) -> dict[str, Any] | None:
    """``testbed audit --gradients``'s settings (``agents.true_gradient.GradientSettings``' fields), checked; None
    without --gradients, where a gradient option is refused."""
    given = {flag: getattr(args, flag[2:].replace("-", "_")) for flag in GRADIENT_DEFAULTS}
    if not args.gradients:
        named = [flag for flag, value in given.items() if value is not None] + ["--gradient-vine"] * args.gradient_vine
        if named:
            raise BadInput(f"{', '.join(named)} apply to the gradient audit: add --gradients")
        return None
    values = {flag: GRADIENT_DEFAULTS[flag] if value is None else value for flag, value in given.items()}
    for flag, value in values.items():
        if value < 2:
            why = "the scores' standard errors" if flag == "--gradient-batches" else "the split to identify its parts"
            raise BadInput(f"{flag} must be at least 2 for {why}, got {value}")
    if args.groups < 2:
        raise BadInput(
            "--gradients needs --groups of at least 2: the true gradient's standard error is clustered by start "
            f"state; got {args.groups}"
        )
    return {
        "batches": values["--gradient-batches"],
        "vine": args.gradient_vine,
        "split_states": values["--split-states"],
        "split_actions": values["--split-actions"],
        "split_rollouts": values["--split-rollouts"],
    }


def cmd_audit(args: argparse.Namespace) -> int:
    for name in ("samples", "branches", "groups", "vine_branches"):
        if getattr(args, name) < 1:
            raise BadInput(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.group_size < 2:
        raise BadInput(f"--group-size must be at least 2 (a group estimator compares members), got {args.group_size}")
    if any(t < 0 for t in args.steps) or args.seed < 0:
        raise BadInput("--steps and --seed must be non-negative")
    if args.max_branches and args.max_branches < 2 * args.branches:
        raise BadInput(
            f"--max-branches must be 0 (off) or at least twice --branches, {2 * args.branches}, so that rollouts can "
            f"be added; got {args.max_branches}"
        )
    gradient_fields = gradient_settings(args)
    workers = _workers(args)
    from lab import audit

    out = Path(args.out) if args.out else Path("runs/audit") / Path(args.paths[0]).resolve().name
    check_folder(out, "--out")
    targets = audit.plan([Path(p) for p in args.paths], args.checkpoints, out, args.trust_env_module)
    settings = audit.AuditSettings(
        samples=args.samples,
        branches=args.branches,
        groups=args.groups,
        group_size=args.group_size,
        vine_branches=args.vine_branches,
        seed=args.seed,
        steps=tuple(args.steps),
        max_branches=args.max_branches,
    )
    print(f"audit: {len(targets)} checkpoints, {workers} at a time → {out}")
    gradients = audit.GradientSettings(**gradient_fields) if gradient_fields else None
    _, failures = audit.run_audits(targets, settings, workers, args.backend, args.ray_address, gradients=gradients)
    paths = audit.build_report(out, " ".join(["testbed", *sys.argv[1:]]))
    print(f"audit report: {paths['md']}")
    if failures:
        print(
            f"testbed audit: {len(failures)} of {len(targets)} checkpoints failed (above); the report holds the "
            "others. Rerun the same command after fixing the cause: finished audits are kept.",
            file=sys.stderr,
        )
        return 1
    return 0


def plan_tuning(args: argparse.Namespace) -> tuple[tune.TunePlan, int]:
    """``testbed tune``'s study, checked whole, and the most seeds a trial trains in one process."""
    check_sizes(args)
    registry.check_name(args.algo)  # before the study's modules, which import Optuna and the reports
    check_env_id(args.env)
    from lab import tune

    stack = stack_size(args)
    plan = tune.plan_tune(
        args.algo,
        args.env,
        args.trials,
        args.total_steps,
        args.seeds,
        args.space,
        args.set,
        args.name,
        args.storage,
        args.first_seed,
        args.pruner,
        args.startup_trials,
        args.sampler_seed,
        tuple(args.vary),
    )
    return plan, stack


def cmd_tune(args: argparse.Namespace) -> int:
    plan, stack = plan_tuning(args)  # names checked before the study's modules, which import Optuna and the reports
    from lab import tune

    print(
        f"tune {plan.name}: {args.algo} on {args.env}, {plan.describe()}; {len(plan.space)} parameters, {args.backend} "
        f"backend, {counted(args.workers, 'trial')} at a time → {tune.TUNE_ROOT / plan.name}"
    )
    try:
        tune_dir, counts = tune.run_study(plan, args.workers, args.backend, args.ray_address, stack=stack)
    except KeyboardInterrupt:
        stopped = _stopped_cells(args.backend, "trials")
        print(f"interrupted: {stopped}; rerun the same command to continue", file=sys.stderr)
        return 130
    done = ", ".join(f"{n} {state}" for state, n in counts.items()) or "nothing new: the study is full"
    reports = (
        f"report: {tune_dir}/tune.md; preset: {tune_dir}/preset.yaml"
        if (tune_dir / "tune.md").exists()
        else "no trial has completed, so there is no report yet"
    )
    print(f"this run: {done}; {reports}")
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    from lab import guide

    written = guide.main(args.out, args.runs, args.quick, args.workers)
    print(f"wrote {len(written)} files into {written[0].parent}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from lab.plot import plot_runs

    out = Path(args.out) if args.out else None
    for path in plot_runs([Path(p) for p in args.paths], x=args.x, out=out, metric=args.metric):
        print(f"wrote {path}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    bench_dir = Path(args.bench_dir)
    if not bench_dir.is_dir():
        raise BadInput(
            f"{bench_dir} is not a folder; give a bench directory, runs/bench/NAME, or a study's, runs/tune/NAME"
        )
    if args.against is not None:
        from lab.committed import report_against  # statistics and plots: imported only when a report is built

        written = report_against(bench_dir, args.against)  # checks both sides before writing anything
        print(f"wrote {written['markdown']} and {written['html']}")
        return 0
    if (bench_dir / TUNE_FILE).exists():
        from lab.tune_report import build_tune_report

        written = build_tune_report(bench_dir)  # read-only on the study: a running driver may keep adding trials
        print(f"wrote {written['markdown']}, {written['html']} and {written['preset']}")
        return 0
    with rundir.DirLock(bench_dir):  # a running bench's driver holds it, and rebuilds the report when it ends
        written = bench.build_reports(bench_dir)
    print(f"wrote {written['markdown']} and {written['html']}")
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    if args.action in ("list", "pages") and (args.names or args.all or args.cheap):
        raise BadInput(
            f"`testbed results {args.action}` takes no names, --all or --cheap; they are for `run` and `save` and "
            "`restore`"
        )
    root = Path.cwd()
    found = manifest.load(root)
    if args.action in ("save", "restore"):
        kept = False
        for entry in manifest.select(found, args.names, args.all, args.cheap):
            if args.action == "restore":
                if runs := manifest.restore(root, entry):
                    print(f"{entry.name}: {len(runs)} kept runs → {entry.output}")
                continue
            if runs := manifest.keep(root, entry):
                print(f"{entry.name}: {len(runs)} runs that ended → {entry.folder}")
            if (saved := manifest.keep_progress(root, found, entry)) is not None:
                found, kept = saved, True
                print(f"{entry.name}: its files so far → {entry.folder} (its page says it is in progress)")
        if not kept:
            return 0
    if args.action == "list":
        for e in found.entries:
            p = e.produced
            saved = f", in progress (saved {e.progress['date']})" if found.in_progress(e) else ""
            state = ", stopped" if e.stopped else ", older code" if found.older(e) else saved
            print(
                f"{e.name:<32} {e.cost:<5} {p.get('date', 'not produced yet')}, commit "
                f"{p.get('commit', '—')}{state}\n    {e.command}"
            )
        return 0
    from lab import pages  # statistics (scipy) only when pages are built

    def rebuild() -> None:
        written = pages.write_all(root)
        print(
            f"pages: {len(written)} files rewritten"
            + (f" ({', '.join(map(str, written))})" if written else ", all up to date")
        )

    if args.action == "run":
        chosen = manifest.select(found, args.names, args.all, args.cheap)
        done = 0
        try:
            for i, entry in enumerate(chosen, 1):
                print(f"[{i}/{len(chosen)}] {entry.name}: {entry.command}", flush=True)
                found = manifest.rerun(root, found, entry)
                done += 1
                print(
                    f"[{i}/{len(chosen)}] {entry.name} done in {found.entry(entry.name).produced['wall_s']:.0f} s; its "
                    f"files are in {entry.folder}",
                    flush=True,
                )
        finally:  # the results finished before a failure or a stop get their pages
            if done:
                rebuild()
        return 0
    rebuild()
    return 0


WRITE_ERRORS = {
    errno.ENOSPC: "Free space",
    errno.EDQUOT: "Free space",
    errno.EFBIG: "Free space",
    errno.EROFS: "Choose a writable folder",
}
"""The errors only a write meets, and their fix: a full disk or quota, a read-only file system."""


def os_error_message(error: OSError) -> str:
    """One line for an OSError that reached the command: what could not be written, and how to make room, for
    the errors only writing meets; otherwise the file and the cause alone (a missing or unreadable file is not a
    full disk)."""
    where = f" {error.filename}" if error.filename else ""
    cause = error.strerror or str(error)
    if error.errno in WRITE_ERRORS:
        return f"cannot write{where}: {cause}. {WRITE_ERRORS[error.errno]}, then rerun."
    return f"cannot use{where}: {cause}. Check the path and its permissions, then rerun."


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "train": cmd_train,
    "eval": cmd_eval,
    "bench": cmd_bench,
    "credit": cmd_credit,
    "audit": cmd_audit,
    "tune": cmd_tune,
    "docs": cmd_docs,
    "plot": cmd_plot,
    "report": cmd_report,
    "results": cmd_results,
}


def main(argv: list[str] | None = None) -> int:
    receive_factories()  # a bench cell's env factories, sent by value by its driver (lab.factories)
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except BadInput as error:
        message = str(error)  # a value quoted whole (a huge --name, say) is cut, keeping the advice at the end
        if len(message) > 1500:
            message = f"{message[:1000]} … {message[-400:]}"
        print(f"testbed {args.command}: error: {message}", file=sys.stderr)
        return 2
    except OSError as error:  # a read-only or full disk, a folder that vanished: no traceback, nothing half-written
        print(f"testbed {args.command}: error: {os_error_message(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before a run's own signal handling starts (or after it ends)
        print(
            f"testbed {args.command}: interrupted. A run directory without a checkpoint can be started again with the "
            "same command.",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
