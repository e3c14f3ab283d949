"""A bench's report, rebuilt from what is on disk: summary.csv, report.md, report.html and plots.

Everything is derived from the run directories under the bench (``lab.results.find_runs``), so a
report can be rebuilt at any time, while cells are still running or after more seeds are added;
rebuilding overwrites the previous report. The Markdown and the HTML are rendered from one list of
blocks, so they always say the same thing; the HTML carries its PNGs inline and needs no other file.

Conventions, stated in every report:
- a run's score is its final evaluation (deterministic policy, one episode per fixed seed, raw env
  return), as ``summary.json`` records it; only completed runs have one;
- CIs are 95% percentile bootstraps over seeds; the IQM is the mean of the middle 50% of seeds;
- normalized score = (score − random) / (target − random), with ``lab/reference_scores.yaml``;
- time to threshold: the first evaluation whose mean return reaches gymnasium's ``reward_threshold``;
- published PPO figures (``lab/published.yaml``): each algo scored as the figure's source scored its runs.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from agents.config import read_yaml
from agents.rundir import TIME_FORMAT
from envs.errors import BadInput
from lab.document import DASH, Block, Bullets, Heading, Image, Para, Table, counted, fmt_ci, fmt_return, fmt_seconds
from lab.document import fmt_steps, render_html, render_markdown, safe_name
from lab.normalized import across_envs, load_reference_scores, reward_threshold
from lab.plan import parse_seeds
from lab.plot import X_LABELS, algo_colors, plot_env_runs
from lab.published import load_published, published_section
from lab.results import Run, find_runs, natural_key
from lab.stats import bootstrap_ci, iqm

SUMMARY_COLUMNS = (
    "algo", "env_id", "seed", "status", "final_eval_return_mean", "final_eval_return_std",
    "total_steps", "wall_time_s", "sps", "run_dir",
)  # fmt: skip
# What RunTracker.finish records; used only for runs whose summary.json predates the eval_convention key.
DEFAULT_EVAL_CONVENTION = "deterministic policy, one episode per fixed seed 1000000+i, raw env return"


def first_reach(run: Run, threshold: float) -> tuple[int, float] | None:
    """(env steps, wall-clock s) at the run's first evaluation with mean return ≥ ``threshold``."""
    hits = np.flatnonzero(run.eval_return >= threshold)
    if hits.size == 0:
        return None
    return int(run.steps[hits[0]]), float(run.wall_time_s[hits[0]])


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
    """The wall-clock time at which one env's algos are compared on equal time, and the algo it comes from:
    the median run time (its last evaluation) of the algo whose completed runs ended soonest."""
    ends: dict[str, list[float]] = {}
    for run in runs:
        if run.status == "completed" and run.wall_time_s.size:
            ends.setdefault(run.algo, []).append(float(run.wall_time_s[-1]))
    return min((float(np.median(times)), algo) for algo, times in ends.items()) if ends else None


def return_at(run: Run, seconds: float) -> float | None:
    """The run's last evaluation return at or before ``seconds`` of wall-clock time; None if none was by then."""
    by_then = np.flatnonzero(run.wall_time_s <= seconds)
    return float(run.eval_return[by_then[-1]]) if by_then.size else None


def env_table(runs: Sequence[Run], threshold: float | None, same_time: tuple[float, str] | None) -> Table:
    """One env's table: a row per algo, statistics over its seeds; ``same_time``: :func:`equal_time`."""
    header = [
        "algo", "seeds completed", "final return (mean)", "95% CI", "IQM",
        "steps to threshold (median)", "wall-clock to threshold (median)", "seeds reaching threshold", "steps/s",
        "return at equal wall-clock (mean)",
    ]  # fmt: skip
    rows = []
    for algo in sorted({r.algo for r in runs}):
        mine = [r for r in runs if r.algo == algo]
        completed = [r for r in mine if r.status == "completed"]
        finals = np.array([r.final_return for r in completed if r.final_return is not None])
        if finals.size:
            mean, ci, middle = fmt_return(float(finals.mean())), fmt_ci(*bootstrap_ci(finals)), fmt_return(iqm(finals))
        else:
            mean = ci = middle = DASH
        if threshold is None:
            to_steps = to_time = reached = DASH
        else:
            hits = [hit for hit in (first_reach(r, threshold) for r in mine) if hit is not None]
            reached = f"{len(hits)}/{len(mine)}"
            to_steps = fmt_steps(float(np.median([h[0] for h in hits]))) if hits else DASH
            to_time = fmt_seconds(float(np.median([h[1] for h in hits]))) if hits else DASH
        sps = [float(r.summary["sps"]) for r in mine if r.summary.get("sps") is not None]
        at_time = [v for v in (return_at(r, same_time[0]) for r in completed) if v is not None] if same_time else []
        rows.append([
            algo, f"{len(completed)}/{len(mine)}", mean, ci, middle, to_steps, to_time, reached,
            f"{np.mean(sps):,.0f}" if sps else DASH, fmt_return(float(np.mean(at_time))) if at_time else DASH,
        ])  # fmt: skip
    return Table(header, rows)


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
            parts.append(f"{name} " + ", ".join(f"{version} ({counted(len(dirs), 'run')})"
                                                for version, dirs in sorted(by_version.items())))  # fmt: skip
    text = "Machine and software: " + "; ".join(parts)
    if any(len(by_version) > 1 for by_version in versions.values()):
        text += (" (a run resumed under another counts under both; where the CPU model or the physics engine's "
                 "version differs, runs of the same seed and settings differ too)")
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
    return (f"Compute: {fmt_steps(steps)} env steps in {sum(processes.values()) / 3600:.3g} core-hours: the wall "
            f"time of {counted(len(processes), 'trainer process', 'trainer processes')} of one thread each, up to "
            f"{counted(widest, 'seed')} side by side in one (a process lasts as long as its longest run)")  # fmt: skip


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
        text += (f"; {counted(earlier, 'run')} started before the first invocation recorded here "
                 f"({first:%Y-%m-%d %H:%M} UTC): adopted from another bench, or trained before invocations were "
                 "recorded, not counted")  # fmt: skip
    # A killed invocation has no end: a run it started is placed in it up to the next invocation's start.
    windows = spans + [(s, next((t for t in opened if t > s), datetime.max.replace(tzinfo=s.tzinfo)))
                       for s in killed]  # fmt: skip
    outside = sum(start >= first and not any(s <= start <= e for s, e in windows) for start in starts)
    if outside:
        text += (f"; {counted(outside, 'run')} trained outside every invocation, by a cell's own `testbed train` "
                 "command: in the core-hours, not in this wall-clock")
    return text


def _what_was_run(runs: Sequence[Run], bench_dir: Path | None) -> list[Block]:
    """The facts at the top of a report; the wall-clock of ``bench_dir``'s invocations when its runs are the report's."""
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
                steps_rows.append([env_id, algo, ", ".join(str(r.seed) for r in mine),
                                   ", ".join(fmt_steps(b) for b in budgets) or DASH])  # fmt: skip
    episodes_text = ", ".join(map(str, episodes)) or "the configured number of"
    conventions_text = "; ".join(conventions) or DEFAULT_EVAL_CONVENTION
    facts = [
        f"Envs: {', '.join(envs)}",
        f"Algos: {', '.join(algos)}",
        f"Seeds: {', '.join(map(str, seeds))}",
        f"Runs: {len(runs)} ({', '.join(f'{n} {s}' for s, n in statuses.items())})",
        compute_text(runs),
        *([wall] if bench_dir is not None and (wall := wall_clock_text(bench_dir, runs)) else []),
        *([machine] if (machine := machine_text(runs)) else []),
        (
            f"Evaluation: {episodes_text} episodes per evaluation; {conventions_text}. "
            "A run's score is its final evaluation."
        ),
        (
            "CI: 95% percentile bootstrap over seeds (2000 resamples, fixed resampling seed). "
            "IQM: interquartile mean over seeds (mean of the middle 50%)."
        ),
        (
            "Threshold: gymnasium's spec `reward_threshold`; a seed reaches it at its first evaluation whose "
            "mean return is at least the threshold. Steps and wall-clock to it are medians over the seeds "
            "that reached it."
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
        blocks.append(Para(
            f"Threshold: {threshold:g} (gymnasium `reward_threshold`)." if threshold is not None
            else "Threshold: none (gymnasium's spec has no `reward_threshold` for this env)."
        ))  # fmt: skip
        same_time = equal_time(env_runs)
        blocks.append(env_table(env_runs, threshold, same_time))
        if same_time is not None:
            blocks.append(Para(f"Equal wall-clock: {fmt_seconds(same_time[0])}, the median run time of {same_time[1]}, "
                               "whose runs ended soonest; each completed run's last evaluation by then."))  # fmt: skip
        counts = ", ".join(f"{a} {sum(r.algo == a for r in env_runs)}" for a in sorted({r.algo for r in env_runs}))
        for x in ("steps", "time"):
            png = add_plots(plot_env_runs(env_runs, x, plots_dir / f"{safe_name(env_id)}-{x}.png", colors))
            images.append(Image(png, f"{env_id}: eval return vs {X_LABELS[x]}", (
                f"{env_id}: evaluation return (deterministic policy, raw env return) against {X_LABELS[x]}; line: "
                "mean over runs, band: 95% percentile bootstrap CI over runs, where at least two cover the point; "
                f"runs: {counts}.")))  # fmt: skip

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
            [r.env_id, r.algo, str(r.seed), r.status, _clean_error(r.summary.get("error"), bench_dir)
             if r.summary else "no summary.json yet (running, or killed)", (where or _place(bench_dir))(r)]
            for r in unfinished
        ]  # fmt: skip
        blocks.append(Table(["env", "algo", "seed", "status", "error", "run dir"], listed))
    else:
        blocks.append(Para("None: every run completed."))

    blocks.append(Heading(2, "Plots"))
    blocks.append(Para("SVG versions of every plot sit beside the PNGs in `plots/`."))
    blocks.extend(images)

    written["markdown"].write_text(render_markdown(blocks))
    written["html"].write_text(render_html(blocks, title, out_dir))
    return written
