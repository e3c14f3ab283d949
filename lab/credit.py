"""``testbed credit``: a credit-assignment study, a sweep over how far a reward lies from its action.

A study is a bench (``lab.bench``) whose grid has one variant per horizon: the same backends,
resumability, run directories and bench report, plus ``credit.md`` / ``credit.html`` and three plots:
score vs horizon, steps to solve vs horizon, and learning curves per horizon.

Tasks:
- ``chain`` / ``keydoor``: the testbed's tasks (``envs/tasks.py``), swept over their ``horizon``;
- ``delayed:ENV_ID``: any env with its rewards delayed (``envs/delay.py``), swept over the delay k
  (a number of steps, or ``end``);
- ``bsuite:EXPERIMENT``: bsuite's credit-assignment and memory experiments (``envs/bsuite.py``), swept over
  bsuite's own settings and scored by bsuite's own analysis (``lab/bsuite_study.py``, which writes their report).

Scores: a task's return normalized by its known random and optimal expected returns, (R − R_random) /
(R_optimal − R_random); a delayed env's by ``lab/reference_scores.yaml`` when it lists the env, else the
raw return. A run has solved the task once an evaluation's score reaches 0.9 (tasks) or the env's
``reward_threshold`` (delayed envs that have one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from agents.config import parse_key_values, read_yaml
from envs import bsuite, check_env_id, reference_returns
from envs.errors import BadInput
from lab import bsuite_study
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
    fmt_steps,
    render_html,
    render_markdown,
)
from lab.normalized import Reference, load_reference_scores, reference_for, reward_threshold
from lab.plot import algo_colors, new_figure, plot_env_runs, save_figure
from lab.results import Run, base_env_id, find_runs
from lab.stats import bootstrap_ci

STUDY_FILE = "credit.yaml"
TASKS = {"chain": "testbed/Chain-v0", "keydoor": "testbed/KeyDoor-v0"}
DEFAULT_HORIZONS = {
    "chain": ["10", "30", "100", "300", "1000"],
    "keydoor": ["10", "30", "100", "300", "1000"],
    "delayed": ["1", "20", "100", "end"],
}
SOLVED = 0.9
"""A task counts as solved at a normalized score of 0.9."""
TASK_TEXT = {
    "chain": "Chain: the first action must match a cue shown at the start; the reward for it (+1 or −1) arrives only "
    "at the last step, after horizon − 1 steps of zero-mean random distractor rewards.",
    "keydoor": "Key-to-door: taking the key at the first step costs a little at once; the door pays +1 at the last "
    "step only if the key was taken; in between, zero-mean random distractor rewards.",
    "delayed": "Delayed reward: the env's rewards are held back and released as one sum every k steps, or only at the "
    "episode's end; every episode's return is unchanged.",
}


@dataclass(frozen=True)
class Study:
    task: str  # chain, keydoor, delayed:ENV_ID or bsuite:EXPERIMENT
    env_id: str
    axis: str  # horizon, reward_delay or bsuite_setting (indices into bsuite's sweep)
    horizons: list[str]
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return {"reward_delay": "delayed", bsuite_study.AXIS: "bsuite"}.get(self.axis, self.task)

    def variants(self) -> dict[str, list[str]]:
        """Bench variants: label → key=value pairs for every algo."""
        if self.axis == bsuite_study.AXIS:
            return bsuite_study.variants(bsuite.experiment_of(self.env_id), self.horizons)
        variants = {}
        for h in self.horizons:
            kwargs = {**self.env_kwargs, "horizon": int(h)} if self.axis == "horizon" else dict(self.env_kwargs)
            pairs = [f"env_kwargs={','.join(f'{k}:{v}' for k, v in kwargs.items())}"] if kwargs else []
            if self.axis == "horizon":
                variants[f"horizon{h}"] = pairs
            else:
                variants[f"delay{h}"] = [f"reward_delay={h}", *pairs]
        return variants


def plan_study(task: str, horizons: Sequence[str] | None, env_kwargs: Sequence[str] = ()) -> Study:
    """Validate the task and its horizons (or delays); BadInput naming the fix."""
    try:
        kwargs = parse_key_values(list(env_kwargs))
    except ValueError:
        raise BadInput(f"--env-kwargs takes KEY:VALUE pairs, got {' '.join(env_kwargs)}") from None
    if task in TASKS:
        values = list(horizons or DEFAULT_HORIZONS[task])
        if any(not h.isdigit() or int(h) < 1 for h in values):
            raise BadInput(f"--horizons of {task} are episode lengths (integers >= 1), got {' '.join(values)}")
        if "horizon" in kwargs:
            raise BadInput("the study sets horizon itself: pass it with --horizons, not --env-kwargs")
        return Study(task, TASKS[task], "horizon", values, kwargs)
    prefix, _, env_id = task.partition(":")
    if prefix == "bsuite":
        experiment = bsuite.check_experiment(env_id)
        if kwargs:
            raise BadInput("bsuite's settings set the env's keyword arguments: pick settings with --horizons")
        settings = bsuite_study.plan_settings(experiment, horizons)
        return Study(task, bsuite.env_id(experiment), bsuite_study.AXIS, settings)
    if prefix != "delayed" or not env_id:
        raise BadInput(
            f"unknown --task {task!r}; choose chain, keydoor or delayed:ENV_ID (e.g. delayed:HalfCheetah-v5), or "
            f"bsuite:EXPERIMENT ({', '.join(bsuite.EXPERIMENTS)})"
        )
    check_env_id(env_id)
    values = list(horizons or DEFAULT_HORIZONS["delayed"])
    if any(h != "end" and (not h.isdigit() or int(h) < 1) for h in values):
        raise BadInput(
            f"--horizons of delayed:ENV_ID are reward delays (integers >= 1, or end), got {' '.join(values)}"
        )
    return Study(task, env_id, "reward_delay", values, kwargs)


def write_study(bench_dir: Path, study: Study) -> None:
    bench_dir.mkdir(parents=True, exist_ok=True)
    (bench_dir / STUDY_FILE).write_text(yaml.safe_dump(asdict(study), sort_keys=False))


def read_study(bench_dir: Path) -> Study:
    return Study(**read_yaml(bench_dir / STUDY_FILE))


# ── scores ─────────────────────────────────────────────────────────────────────────────────────────


def horizon_of(run: Run, study: Study) -> str:
    if study.axis == "horizon":
        return str((run.config.get("env_kwargs") or {}).get("horizon"))
    return str(run.config.get("reward_delay"))


def scorer(run: Run, study: Study, refs: dict[str, Reference]) -> tuple[Any, float | None, str]:
    """(score of a return, the return that counts as solved, the score's name) for the run's env."""
    if study.axis == "horizon":
        random, optimal = reference_returns(study.env_id, **(run.config.get("env_kwargs") or {}))
        return (lambda R: (R - random) / (optimal - random)), random + SOLVED * (optimal - random), "normalized return"
    ref = reference_for(run, refs)
    threshold = reward_threshold(base_env_id(run.env_id))
    if ref is not None:
        return ref.normalize, threshold, "normalized return"
    return (lambda R: R), threshold, "return"


@dataclass
class Cell:
    """One (algo, horizon): its seeds' final scores and steps to solve."""

    scores: np.ndarray  # (seeds completed,)
    returns: np.ndarray  # (seeds completed,) the raw final returns
    solved_at: list[int | None]  # per seed: env steps at the first solving evaluation
    steps: list[int]  # per seed: env steps trained


def cells(runs: Sequence[Run], study: Study) -> tuple[dict[tuple[str, str], Cell], str]:
    table: dict[tuple[str, str], Cell] = {}
    refs = load_reference_scores()
    scorers: dict[str, tuple[Any, float | None, str]] = {}  # one per env label: each builds an env or reads files
    name = "score"
    for run in runs:
        if run.env_id not in scorers:
            scorers[run.env_id] = scorer(run, study, refs)
        score, solved_return, name = scorers[run.env_id]
        cell = table.setdefault((run.algo, horizon_of(run, study)), Cell(np.array([]), np.array([]), [], []))
        if run.status == "completed" and run.final_return is not None:
            cell.scores = np.append(cell.scores, score(run.final_return))
            cell.returns = np.append(cell.returns, run.final_return)
        hits = np.flatnonzero(run.eval_return >= solved_return) if solved_return is not None else np.array([])
        cell.solved_at.append(int(run.steps[hits[0]]) if hits.size else None)
        cell.steps.append(run.last_step)
    return table, name


# ── plots and the document ──────────────────────────────────────────────────────────────────────────


def _x_positions(horizons: list[str]) -> tuple[list[float], bool]:
    """Numeric horizons on a log axis; a list with ``end`` on evenly spaced categories."""
    if all(h.isdigit() for h in horizons):
        return [float(h) for h in horizons], True
    return [float(i) for i in range(len(horizons))], False


def plot_vs_horizon(
    table: dict[tuple[str, str], Cell], study: Study, algos: list[str], out: Path, what: str, ylabel: str
) -> list[Path]:
    """``what`` = score: mean and 95% CI band per algo; = solve: median steps to solve over solving seeds."""
    colors = algo_colors(algos)
    fig, (ax,) = new_figure(1, (6.5, 4.0))
    xs, log = _x_positions(study.horizons)
    for algo in algos:
        points = []
        for x, h in zip(xs, study.horizons):
            cell = table.get((algo, h))
            if cell is None:
                continue
            if what == "score" and cell.scores.size:
                points.append((x, float(cell.scores.mean()), *bootstrap_ci(cell.scores)))
            elif what == "solve":
                hits = [s for s in cell.solved_at if s is not None]
                if hits:
                    points.append((x, float(np.median(hits)), min(hits), max(hits)))
        if points:
            x, mean, low, high = (np.array(v) for v in zip(*points))
            ax.plot(x, mean, marker="o", color=colors[algo], label=algo)
            ax.fill_between(x, low, high, color=colors[algo], alpha=0.2, linewidth=0)
    if log:
        ax.set_xscale("log")
        ax.minorticks_off()
    ax.set_xticks(xs, study.horizons)
    if what == "score" and study.axis == "horizon":
        ax.set_ylim(-1.05, 1.05)  # −1: always wrong (chain), 0: random, 1: optimal
    ax.set_xlabel("horizon (episode length)" if study.axis == "horizon" else "reward delay k (steps)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small")
    return save_figure(fig, out)


def build_credit_report(bench_dir: Path) -> dict[str, Path]:
    """Write credit.md, credit.html and plots/credit-*.png from the study's runs on disk."""
    bench_dir = Path(bench_dir)
    study = read_study(bench_dir)
    runs = find_runs([bench_dir])
    if not runs:
        raise BadInput(f"{bench_dir} holds no run yet: nothing to report")
    if study.axis == bsuite_study.AXIS:
        return bsuite_study.build_report(bench_dir, study, runs)
    table, score_name = cells(runs, study)
    algos = sorted({r.algo for r in runs})
    plots = bench_dir / "plots"
    written: dict[str, Path] = {"markdown": bench_dir / "credit.md", "html": bench_dir / "credit.html"}

    def image(paths: list[Path], alt: str) -> Image:
        for path in paths:
            written[path.relative_to(bench_dir).as_posix()] = path
        return Image(paths[0].relative_to(bench_dir).as_posix(), alt)

    axis = "horizon" if study.axis == "horizon" else "reward delay k"
    solved_rule = (
        f"an evaluation's normalized return reaches {SOLVED}"
        if study.axis == "horizon"
        else "an evaluation's mean return reaches gymnasium's reward_threshold for the env"
    )
    score_rule = " = (R − R_random) / (R_optimal − R_random), with the task's known expected returns"
    bench = read_yaml(bench_dir / "bench.yaml") if (bench_dir / "bench.yaml").exists() else {}
    budgets = sorted({int(r.config["total_steps"]) for r in runs if r.config.get("total_steps")})
    blocks: list[Block] = [
        Heading(1, f"Credit-assignment study: {bench_dir.resolve().name}"),
        Heading(2, "What was run"),
        Para(TASK_TEXT[study.kind]),
        Bullets(
            [
                f"Env: {study.env_id}" + (f" with {study.env_kwargs}" if study.env_kwargs else ""),
                f"{axis.capitalize()}: {', '.join(study.horizons)}",
                f"Algos: {', '.join(algos)}",
                f"Seeds: {', '.join(map(str, sorted({r.seed for r in runs})))}",
                (
                    f"Env steps per run: {', '.join(fmt_steps(b) for b in budgets)}; every env step counts, the vine's "
                    "branch steps included. A run stops after the iteration that reaches the budget, so an agent with "
                    "long iterations overshoots it: the table gives the steps actually trained"
                ),
                f"Score: {score_name}" + (score_rule if study.axis == "horizon" else ""),
                f"Solved: {solved_rule}. Steps to solve: the median over the seeds that solved it.",
                (
                    "A run's score is its final evaluation (deterministic policy, fixed evaluation seeds). CIs are 95% "
                    "percentile bootstraps over seeds."
                ),
                *(f"Command: `{c}`" for c in dict.fromkeys(bench.get("commands", []))),
            ]
        ),
    ]
    header = [
        axis,
        "algo",
        "seeds completed",
        "final return (mean)",
        f"final {score_name} (mean)",
        "95% CI",
        "seeds solved",
        "steps to solve (median)",
        "env steps trained (max)",
    ]
    rows = []
    for h in study.horizons:
        for algo in algos:
            cell = table.get((algo, h))
            if cell is None:
                continue
            hits = [s for s in cell.solved_at if s is not None]
            scores, done = cell.scores, cell.scores.size > 0
            rows.append(
                [
                    h,
                    algo,
                    f"{scores.size}/{len(cell.steps)}",
                    fmt_return(float(cell.returns.mean())) if done else DASH,
                    f"{scores.mean():.3f}" if done else DASH,
                    fmt_ci(*bootstrap_ci(scores)) if done else DASH,
                    f"{len(hits)}/{len(cell.steps)}",
                    fmt_steps(float(np.median(hits))) if hits else DASH,
                    fmt_steps(max(cell.steps)),
                ]
            )
    blocks += [Heading(2, f"Results by {axis}"), Table(header, rows), Heading(2, "Plots")]
    score_plot = plot_vs_horizon(table, study, algos, plots / "credit-score.png", "score", f"final {score_name}")
    blocks.append(image(score_plot, f"final {score_name} vs {axis}, mean and 95% CI"))
    solve_plot = plot_vs_horizon(
        table, study, algos, plots / "credit-steps-to-solve.png", "solve", "env steps to solve"
    )
    blocks.append(
        image(solve_plot, f"env steps to solve vs {axis}: median (line) and range (band) over the seeds that solved")
    )
    curves = plot_env_runs(runs, "steps", plots / "credit-curves.png", algo_colors(algos))
    blocks.append(image(curves, f"learning curves per {axis}: eval return vs env steps, mean and 95% CI over seeds"))
    written["markdown"].write_text(render_markdown(blocks))
    title = f"Credit-assignment study: {bench_dir.resolve().name}"
    written["html"].write_text(render_html(blocks, title, bench_dir))
    return written
