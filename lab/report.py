"""A bench's report, rebuilt from what is on disk: summary.csv, report.md, report.html and plots.

Everything is derived from the run directories under the bench (``lab.results.find_runs``), so a
report can be rebuilt at any time, while cells are still running or after more seeds are added;
rebuilding overwrites the previous report. The Markdown and the HTML are rendered from one list of
blocks, so they always say the same thing; the HTML carries its PNGs inline and needs no other file.

Conventions, stated in every report:
- a run's score is its final evaluation (deterministic policy, one episode per fixed seed, raw env
  return), as ``summary.json`` records it; only completed runs have one;
- CIs are 95% percentile bootstraps over seeds, marked † from fewer than 3; the IQM is the mean of the middle
  50% of seeds;
- normalized score = (score − random) / (target − random), with ``lab/reference_scores.yaml``;
- time to threshold: the first evaluation whose mean return reaches gymnasium's ``reward_threshold``;
- time and steps/s in core time: a run's share of its one-thread process, so stacked seeds (``train --seeds``)
  and a lone run compare at equal compute;
- published PPO figures (``lab/published.yaml``): each algo scored as the figure's source scored its runs.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from lab.cost import (
    compute_text,
    core_sps,
    core_time,
    machine_text,
    run_meta,  # noqa: F401  (lab.committed reads a run's meta through here)
    stacking_text,
    wall_clock_text,
)
from lab.document import (
    DASH,
    Block,
    Bullets,
    Heading,
    Image,
    Para,
    Table,
    fmt_ci,
    fmt_return,
    fmt_seconds,
    fmt_steps,
    render_html,
    render_markdown,
    safe_name,
)
from lab.normalized import across_envs, load_reference_scores, reward_threshold
from lab.plot import X_LABELS, algo_colors, plot_env_runs
from lab.published import load_published, published_section
from lab.results import Run, find_runs, natural_key
from lab.stats import FEW_SEEDS, bootstrap_ci, few_seeds_note, iqm, mark_few

SUMMARY_COLUMNS = (
    "algo",
    "env_id",
    "seed",
    "status",
    "final_eval_return_mean",
    "final_eval_return_std",
    "total_steps",
    "wall_time_s",
    "sps",
    "run_dir",
)
# What RunTracker.finish records; used only for runs whose summary.json predates the eval_convention key.
DEFAULT_EVAL_CONVENTION = "deterministic policy, one episode per fixed seed 1000000+i, raw env return"
CORE_TIME = "core time (s)"


def first_reach(run: Run, threshold: float) -> tuple[int, float] | None:
    """(env steps, core time s) at the run's first evaluation with mean return ≥ ``threshold``."""
    hits = np.flatnonzero(run.eval_return >= threshold)
    if hits.size == 0:
        return None
    return int(run.steps[hits[0]]), float(core_time(run)[hits[0]])


def _relative(run: Run, bench_dir: Path) -> str:
    try:
        return run.run_dir.resolve().relative_to(bench_dir.resolve()).as_posix()
    except ValueError:  # a symlinked cell outside the bench: its name is all we can say without an absolute path
        return run.run_dir.name


def _clean_error(error: Any, bench_dir: Path) -> str:
    """An error message on one line, with the bench's absolute location replaced by a relative one."""
    text = " ".join(str(error).split()) if error else "no error recorded"
    return text.replace(str(bench_dir.resolve()), ".")


# ── the parts of a report ────────────────────────────────────────────────────────────────────────


def _place(bench_dir: Path) -> Callable[[Run], str]:
    """A run named by its path under the bench: the default of a report's ``where``."""
    return lambda run: _relative(run, bench_dir)


def write_summary_csv(
    runs: Sequence[Run], bench_dir: Path, path: Path, where: Callable[[Run], str] | None = None
) -> None:
    """One row per run, each named by ``where`` (default: its path under ``bench_dir``). A run without
    summary.json shows its steps and wall-clock so far."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=SUMMARY_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for run in runs:
        s = run.summary
        row = {
            "algo": run.algo,
            "env_id": run.env_id,
            "seed": run.seed,
            "status": run.status,
            "final_eval_return_mean": s.get("final_eval_return_mean"),
            "final_eval_return_std": s.get("final_eval_return_std"),
            "total_steps": s.get("total_steps", run.last_step),
            "wall_time_s": s.get("wall_time_s", run.last_wall_time_s),
            "sps": s.get("sps"),
            "run_dir": (where or _place(bench_dir))(run),
        }
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    path.write_text(buffer.getvalue())


def equal_time(runs: Sequence[Run]) -> tuple[float, str] | None:
    """The core time (:func:`core_time`) at which one env's algos are compared on equal time, and the algo it
    comes from: the median run time (its last evaluation) of the algo whose completed runs ended soonest."""
    ends: dict[str, list[float]] = {}
    for run in runs:
        if run.status == "completed" and run.wall_time_s.size:
            ends.setdefault(run.algo, []).append(float(core_time(run)[-1]))
    return min((float(np.median(times)), algo) for algo, times in ends.items()) if ends else None


def return_at(run: Run, seconds: float) -> float | None:
    """The run's last evaluation return at or before ``seconds`` of core time; None if none was by then."""
    by_then = np.flatnonzero(core_time(run) <= seconds)
    return float(run.eval_return[by_then[-1]]) if by_then.size else None


def env_table(runs: Sequence[Run], threshold: float | None, same_time: tuple[float, str] | None) -> list[Block]:
    """One env's table, a row per algo with statistics over its seeds (``same_time``: :func:`equal_time`), and
    the footnote of a CI from too few seeds when one is marked. Time and steps/s are in core time
    (:func:`core_time`), so a stacked run and a lone one read side by side."""
    header = [
        "algo",
        "seeds completed",
        "final return (mean)",
        "95% CI",
        "IQM",
        "steps to threshold (median)",
        "core time to threshold (median)",
        "seeds reaching threshold",
        "steps per core-second",
        "return at equal core time (mean)",
    ]
    rows, few = [], []
    for algo in sorted({r.algo for r in runs}):
        mine = [r for r in runs if r.algo == algo]
        completed = [r for r in mine if r.status == "completed"]
        finals = np.array([r.final_return for r in completed if r.final_return is not None])
        if finals.size:
            mean, middle = fmt_return(float(finals.mean())), fmt_return(iqm(finals))
            ci = mark_few(fmt_ci(*bootstrap_ci(finals)), finals.size)
            few += [finals.size] if finals.size < FEW_SEEDS else []
        else:
            mean = ci = middle = DASH
        if threshold is None:
            to_steps = to_time = reached = DASH
        else:
            hits = [hit for hit in (first_reach(r, threshold) for r in mine) if hit is not None]
            reached = f"{len(hits)}/{len(mine)}"
            to_steps = fmt_steps(float(np.median([h[0] for h in hits]))) if hits else DASH
            to_time = fmt_seconds(float(np.median([h[1] for h in hits]))) if hits else DASH
        sps = [v for v in map(core_sps, mine) if v is not None]
        at_time = [v for v in (return_at(r, same_time[0]) for r in completed) if v is not None] if same_time else []
        rows.append(
            [
                algo,
                f"{len(completed)}/{len(mine)}",
                mean,
                ci,
                middle,
                to_steps,
                to_time,
                reached,
                f"{np.mean(sps):,.0f}" if sps else DASH,
                fmt_return(float(np.mean(at_time))) if at_time else DASH,
            ]
        )
    return [Table(header, rows), *([Para(few_seeds_note(min(few)))] if few else [])]


def _what_was_run(runs: Sequence[Run], bench_dir: Path | None) -> list[Block]:
    """The facts at the top of a report; the wall-clock of ``bench_dir``'s invocations when its runs are the
    report's."""
    envs = sorted({r.env_id for r in runs}, key=natural_key)
    algos = sorted({r.algo for r in runs})
    seeds = sorted({r.seed for r in runs})
    statuses = {s: sum(r.status == s for r in runs) for s in sorted({r.status for r in runs})}
    episodes = sorted({int(r.summary["final_eval_episodes"]) for r in runs if r.summary.get("final_eval_episodes")})
    if not episodes:  # nothing completed yet: the configured number
        episodes = sorted({int(r.config["eval_episodes"]) for r in runs if r.config.get("eval_episodes")})
    conventions = sorted({str(r.summary["eval_convention"]) for r in runs if r.summary.get("eval_convention")})
    steps_rows = []
    for env_id in envs:
        for algo in algos:
            mine = [r for r in runs if r.env_id == env_id and r.algo == algo]
            if mine:
                budgets = sorted({int(r.config["total_steps"]) for r in mine if r.config.get("total_steps")})
                steps_rows.append(
                    [
                        env_id,
                        algo,
                        ", ".join(str(r.seed) for r in mine),
                        ", ".join(fmt_steps(b) for b in budgets) or DASH,
                    ]
                )
    episodes_text = ", ".join(map(str, episodes)) or "the configured number of"
    conventions_text = "; ".join(conventions) or DEFAULT_EVAL_CONVENTION
    facts = [
        f"Envs: {', '.join(envs)}",
        f"Algos: {', '.join(algos)}",
        f"Seeds: {', '.join(map(str, seeds))}",
        f"Runs: {len(runs)} ({', '.join(f'{n} {s}' for s, n in statuses.items())})",
        compute_text(runs),
        stacking_text(runs),
        *([wall] if bench_dir is not None and (wall := wall_clock_text(bench_dir, runs)) else []),
        *([machine] if (machine := machine_text(runs)) else []),
        (
            f"Evaluation: {episodes_text} episodes per evaluation; {conventions_text}. A run's score is its final "
            "evaluation."
        ),
        (
            "CI: 95% percentile bootstrap over seeds (2000 resamples, fixed resampling seed). IQM: interquartile mean "
            "over seeds (mean of the middle 50%)."
        ),
        (
            "Threshold: gymnasium's spec `reward_threshold`; a seed reaches it at its first evaluation whose mean "
            "return is at least the threshold. Steps and core time to it are medians over the seeds that reached it."
        ),
    ]
    return [
        Heading(2, "What was run"),
        Bullets(facts),
        Table(["env", "algo", "seeds", "env steps per run (configured)"], steps_rows),
    ]


def build_report(
    bench_dir: Path,
    runs: Sequence[Run] | None = None,
    out_dir: Path | None = None,
    title: str | None = None,
    where: Callable[[Run], str] | None = None,
    preface: Sequence[Block] = (),
) -> dict[str, Path]:
    """Write summary.csv, report.md, report.html and plots/ for the bench at ``bench_dir``.

    Returns the paths: ``summary``, ``markdown``, ``html``, and each plot under its path relative to
    ``out_dir`` (e.g. ``plots/CartPole-v1-steps.png``). BadInput if ``bench_dir`` holds no run. A credit
    study's own report is built beside this one by ``lab.bench.build_reports``.

    The other arguments make the same report over other runs (``lab.committed``'s comparison of a bench with a
    committed result): ``runs`` instead of the bench's, written into ``out_dir`` (default ``bench_dir``) under
    ``title``, each run named by ``where`` (default: its path under ``bench_dir``), with ``preface`` after the
    title. The bench's wall-clock is left out then: its invocations did not train runs read from elsewhere.
    """
    bench_dir = Path(bench_dir)
    own = runs is None
    runs = find_runs([bench_dir]) if runs is None else list(runs)
    out_dir = bench_dir if out_dir is None else Path(out_dir)
    title = title or f"Bench report: {bench_dir.resolve().name}"
    refs = load_reference_scores()
    plots_dir = out_dir / "plots"
    colors = algo_colors([r.algo for r in runs])
    written: dict[str, Path] = {
        "summary": out_dir / "summary.csv",
        "markdown": out_dir / "report.md",
        "html": out_dir / "report.html",
    }
    write_summary_csv(runs, bench_dir, written["summary"], where)

    def add_plots(paths: list[Path]) -> str:
        for path in paths:
            written[path.relative_to(out_dir).as_posix()] = path
        return paths[0].relative_to(out_dir).as_posix()

    blocks: list[Block] = [Heading(1, title), *preface, *_what_was_run(runs, bench_dir if own else None)]
    images: list[Image] = []

    # Per env: the table, and the curves against env steps and wall-clock.
    for env_id in sorted({r.env_id for r in runs}, key=natural_key):
        env_runs = [r for r in runs if r.env_id == env_id]
        threshold = reward_threshold(env_id)
        blocks.append(Heading(2, env_id))
        blocks.append(
            Para(
                f"Threshold: {threshold:g} (gymnasium `reward_threshold`)."
                if threshold is not None
                else "Threshold: none (gymnasium's spec has no `reward_threshold` for this env)."
            )
        )
        same_time = equal_time(env_runs)
        blocks.extend(env_table(env_runs, threshold, same_time))
        if same_time is not None:
            blocks.append(
                Para(
                    f"Equal core time: {fmt_seconds(same_time[0])}, the median run time of {same_time[1]}, whose runs "
                    "ended soonest; each completed run's last evaluation by then."
                )
            )
        counts = ", ".join(f"{a} {sum(r.algo == a for r in env_runs)}" for a in sorted({r.algo for r in env_runs}))
        # The time plot in core time, as the table: each run's wall-clock as its share of its process.
        in_core_time = [replace(r, wall_time_s=core_time(r)) for r in env_runs]
        for x, plotted, label in (("steps", env_runs, X_LABELS["steps"]), ("time", in_core_time, CORE_TIME)):
            path = plots_dir / f"{safe_name(env_id)}-{x}.png"
            png = add_plots(plot_env_runs(plotted, x, path, colors, x_label=label))
            images.append(
                Image(
                    png,
                    f"{env_id}: eval return vs {label}",
                    (
                        f"{env_id}: evaluation return (deterministic policy, raw env return) against {label}; line: "
                        "mean over runs, band: 95% percentile bootstrap CI over runs, where at least two cover the "
                        f"point; runs: {counts}."
                    ),
                )
            )

    # Each algo against the published PPO figures, scored as their sources score a run.
    blocks.extend(published_section(runs, load_published()))

    # Across envs: rliable's aggregates of normalized scores.
    across, plots = across_envs(runs, refs, plots_dir, colors)
    blocks.extend(across)
    for png, alt, caption in plots:
        images.append(Image(add_plots(png), alt, caption))

    # Runs that did not complete, with their errors.
    unfinished = [r for r in runs if r.status != "completed"]
    blocks.append(Heading(2, "Runs that did not complete"))
    if unfinished:
        listed = [
            [
                r.env_id,
                r.algo,
                str(r.seed),
                r.status,
                _clean_error(r.summary.get("error"), bench_dir)
                if r.summary
                else "no summary.json yet (running, or killed)",
                (where or _place(bench_dir))(r),
            ]
            for r in unfinished
        ]
        blocks.append(Table(["env", "algo", "seed", "status", "error", "run dir"], listed))
    else:
        blocks.append(Para("None: every run completed."))

    blocks.append(Heading(2, "Plots"))
    blocks.append(Para("SVG versions of every plot sit beside the PNGs in `plots/`."))
    blocks.extend(images)

    written["markdown"].write_text(render_markdown(blocks))
    written["html"].write_text(render_html(blocks, title, out_dir))
    return written
