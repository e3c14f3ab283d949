"""``testbed docs``: every figure and table of the guide, docs/ppo_and_grpo.md, from the testbed's own runs.

Two kinds of experiment:
- training runs, as benches under ``runs/docs/`` (resumable: a rerun reuses finished runs): PPO and GRPO
  on CartPole, LunarLander and the chain at a long horizon, GRPO with dynamic sampling and with each loss
  aggregation on CartPole, and one short PPO run whose partly trained policy the small experiments use;
- small measured experiments on that policy (``lab/guide_experiments.py``).

``--quick`` gives every experiment a tiny budget and one seed: the same files, in seconds, for tests. The
committed figures come from the full mode. ``HOW_MADE.md`` beside them records the command, the seeds,
the machine and the time each part took.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from agents import registry, rundir, runlog
from agents.config import build_config
from agents.networks import ActorCritic
from agents.run_envs import make_eval_env
from envs.errors import BadInput
from lab import bench
from lab import guide_experiments as ex
from lab.plot import algo_colors, draw_env, mean_curve
from lab.results import Run, base_env_id, find_runs, read_series

SEED = 0  # the small experiments' seed, and the first seed of every bench


@dataclass(frozen=True)
class Budgets:
    """How much each experiment gets; ``None`` for a run's steps means its preset's budget."""

    seeds: int
    lunar_seeds: int
    cartpole_ppo: int | None
    cartpole_grpo: int | None
    lunar_steps: int | None
    chain_horizon: int
    chain_steps: int
    aggregation_steps: int
    partial_steps: int
    runaway_epochs: int
    kl_samples: int
    group_horizon: int
    evaluations: str  # an override for the CartPole and chain runs: evaluations often enough for curves

    @property
    def mode(self) -> str:
        return "quick" if self is QUICK else "full"


FULL = Budgets(
    seeds=5,
    lunar_seeds=3,
    cartpole_ppo=None,
    cartpole_grpo=None,
    lunar_steps=None,
    chain_horizon=300,
    chain_steps=200_000,
    aggregation_steps=150_000,
    partial_steps=8192,
    runaway_epochs=20,
    kl_samples=1_000_000,
    group_horizon=200,
    evaluations="eval_interval=10000",
)
QUICK = Budgets(
    seeds=1,
    lunar_seeds=1,
    cartpole_ppo=1024,
    cartpole_grpo=1500,
    lunar_steps=2000,
    chain_horizon=20,
    chain_steps=1500,
    aggregation_steps=1500,
    partial_steps=1024,
    runaway_epochs=2,
    kl_samples=20_000,
    group_horizon=60,
    evaluations="eval_episodes=2",
)

CARTPOLE, LUNAR, CHAIN = ex.ENV, "LunarLander-v3", "testbed/Chain-v0"
AGGREGATIONS = ("trajectory", "step", "constant")
SOLVED = {CARTPOLE: 475.0, LUNAR: 200.0, CHAIN: 0.9}
"""Evaluation returns that count as solving: gymnasium's reward thresholds, and 0.9 on the chain (±1 at the end)."""
FIGURES = (
    "clip_objective.png",
    "clip_runaway.png",
    "clip_runaway.md",
    "tied_group.md",
    "dynamic_sampling.png",
    "dynamic_sampling.md",
    "aggregation_weights.png",
    "aggregation_weights.md",
    "aggregation_training.png",
    "aggregation_training.md",
    "kl_estimators.png",
    "kl_estimators.md",
    "diagnostics.png",
    "diagnostics.md",
    "group_advantages.png",
    "length_bias.png",
    "length_bias.md",
    "cost.md",
    "HOW_MADE.md",
)
"""Every file ``testbed docs`` writes into its output folder."""


def grids(b: Budgets) -> dict[str, bench.Grid]:
    """The training runs, one bench each, validated before any of them starts."""
    every = [b.evaluations]
    chain = [f"env_kwargs=horizon:{b.chain_horizon}", b.evaluations]
    lunar = [] if b.mode == "full" else every  # the full runs keep the preset's evaluations: they are long
    plans = {
        "partial": (["ppo"], CARTPOLE, 1, b.partial_steps, every, None),
        "cartpole-ppo": (["ppo"], CARTPOLE, b.seeds, b.cartpole_ppo, every, None),
        "cartpole-grpo": (["grpo"], CARTPOLE, b.seeds, b.cartpole_grpo, every, None),
        "cartpole-dynamic": (["grpo"], CARTPOLE, b.seeds, b.cartpole_grpo, [*every, "dynamic_sampling=true"], None),
        "aggregation": (
            ["grpo"],
            CARTPOLE,
            b.seeds,
            b.aggregation_steps,
            every,
            {mode: [f"aggregation={mode}"] for mode in AGGREGATIONS},
        ),
        "chain": (["ppo", "grpo"], CHAIN, b.seeds, b.chain_steps, chain, None),
        "lunar": (["ppo", "grpo"], LUNAR, b.lunar_seeds, b.lunar_steps, lunar, None),
    }
    return {
        name: bench.plan_grid(None, algos, [env], seeds, steps, sets, name, variants, first_seed=SEED)
        for name, (algos, env, seeds, steps, sets, variants) in plans.items()
    }


def partial_policy(run_dir: Path) -> ActorCritic:
    """The partly trained PPO actor-critic of the ``partial`` run."""
    values = rundir.read_config(run_dir)
    values.pop("algo")
    cfg = build_config(registry.get("ppo").config, values)
    ckpt = runlog.load_checkpoint(run_dir, {"algo": "ppo", "env_id": cfg.env_id})
    env = make_eval_env(cfg, 1)
    try:
        return registry.get("ppo").load_policy(cfg, env, ckpt["model"])
    finally:
        env.close()


# ── figures and tables from the runs ───────────────────────────────────────────────────────────────


def figure(rows: int, cols: int, size: tuple[float, float] = (4.2, 3.2)) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(size[0] * cols, size[1] * rows), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, np.atleast_2d(fig.subplots(rows, cols, squeeze=False))


def series_curve(runs: list[Run], column: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean over runs of a progress.csv column, on the first run's steps (runs of one bench log alike)."""
    series = [read_series(r.run_dir / "progress.csv", column) for r in runs]
    series = [(s, v) for s, v in series if s.size]
    if not series:
        return None
    grid = series[0][0]
    inside = [np.interp(grid, s, v, right=np.nan) for s, v in series]
    return grid, np.nanmean(np.vstack(inside), axis=0)


def smooth(values: np.ndarray) -> np.ndarray:
    """A centred moving average over about a tenth of the points (3 to 9), keeping the length: edges average
    fewer points. A short series (a dozen iterations) stays close to its raw values."""
    window = min(9, 2 * (values.size // 20) + 1)
    if window < 3:
        return values
    kernel = np.ones(window)
    return np.convolve(values, kernel, "same") / np.convolve(np.ones_like(values), kernel, "same")


def quarter_means(runs: list[Run], column: str) -> tuple[float, float]:
    """Mean of ``column`` over the first and over the last quarter of each run's rows, then over runs."""
    early, late = [], []
    for run in runs:
        _, values = read_series(run.run_dir / "progress.csv", column)
        if values.size:
            q = max(1, values.size // 4)
            early.append(values[:q].mean())
            late.append(values[-q:].mean())
    return (float(np.mean(early)), float(np.mean(late))) if early else (float("nan"), float("nan"))


def finals(runs: list[Run]) -> str:
    values = [r.final_return for r in runs if r.final_return is not None]
    if not values:
        return "–"
    return f"{np.mean(values):.2f} ({', '.join(f'{v:.1f}' for v in values)})"


def diagnostics(envs: dict[str, list[Run]], out_png: Path, out_md: Path) -> list[Path]:
    """Per env: eval return of both, PPO's explained variance, GRPO's tied-group fraction and return std."""
    columns = (
        ("losses/explained_variance", "ppo", "PPO: explained variance"),
        ("grpo/frac_zero_std_groups", "grpo", "GRPO: fraction of tied groups"),
        ("grpo/group_return_std", "grpo", "GRPO: return std within a group"),
    )
    fig, axes = figure(len(envs), 4)
    colors = algo_colors(["ppo", "grpo"])
    rows = []
    for r, (label, runs) in enumerate(envs.items()):
        draw_env(axes[r, 0], runs, "steps", colors)
        axes[r, 0].set_title(f"{label}: eval return")
        for c, (column, algo, title) in enumerate(columns, start=1):
            own = [run for run in runs if run.algo == algo]
            curve = series_curve(own, column)
            if curve is not None:
                axes[r, c].plot(curve[0], curve[1], color=colors[algo], alpha=0.35, linewidth=0.8)
                axes[r, c].plot(
                    curve[0],
                    smooth(curve[1]),
                    color=colors[algo],
                    linewidth=1.6,
                    marker="o" if curve[0].size < 3 else None,
                )
            axes[r, c].set(title=title, xlabel="env steps")
            axes[r, c].grid(alpha=0.3)
            early, late = quarter_means(own, column)
            rows.append([label, title, f"{early:.3f}", f"{late:.3f}"])
        for algo in ("ppo", "grpo"):
            own = [run for run in runs if run.algo == algo]
            rows.append([label, f"{algo.upper()}: final eval return (mean, per seed)", "", finals(own)])
            solved = SOLVED[base_env_id(runs[0].env_id)]
            rows.append([label, f"{algo.upper()}: seeds reaching {solved}, median steps", "", steps_to(own, solved)])
    note = (
        "Each diagnostic: its mean over the first and over the last quarter of each run's iterations, then over seeds."
    )
    table = ex.write_table(
        out_md,
        "Over a run: PPO's critic beside GRPO's groups",
        ["env", "quantity", "first quarter", "last quarter"],
        rows,
        note,
    )
    return [ex.save_png(fig, out_png), table]


def steps_to(runs: list[Run], threshold: float) -> str:
    """Seeds whose evaluations reached ``threshold``, and the median env steps to the first that did."""
    reached = [int(r.steps[np.argmax(r.eval_return >= threshold)]) for r in runs if (r.eval_return >= threshold).any()]
    return f"{len(reached)}/{len(runs)}, " + (f"{int(np.median(reached)):,}" if reached else "–")


def iterations(run: Run) -> int:
    """The iterations a run made: progress.csv holds one row per iteration. Tables that give env steps per
    iteration take each run's own ratio, then the mean over runs, so that they agree with each other."""
    return max(1, read_series(run.run_dir / "progress.csv", "charts/SPS")[0].size)


def dynamic_sampling(plain: list[Run], dynamic: list[Run], label: str, out_png: Path, out_md: Path) -> list[Path]:
    """GRPO with and without DAPO's dynamic sampling, on the same seeds."""
    named = {"without": plain, "with dynamic sampling": dynamic}
    fig, axes = figure(1, 3)
    palette = algo_colors(list(named))
    rows = []
    for (name, runs), style in zip(named.items(), ("-", "--"), strict=True):
        curve = mean_curve(runs)
        if curve is not None:
            axes[0, 0].plot(curve.x, curve.mean, style, color=palette[name], label=name)
        for ax, column in zip(axes[0, 1:], ("grpo/frac_zero_std_groups", "grpo/dropped_groups"), strict=True):
            series = series_curve(runs, column)
            if series is not None:
                ax.plot(
                    series[0],
                    smooth(series[1]),
                    style,
                    color=palette[name],
                    label=name,
                    marker="o" if series[0].size < 30 else None,
                )
        dropped = [read_series(r.run_dir / "progress.csv", "grpo/dropped_groups")[1] for r in runs]
        rows.append(
            [
                name,
                finals(runs),
                steps_to(runs, 475),
                f"{quarter_means(runs, 'grpo/frac_zero_std_groups')[1]:.3f}",
                f"{np.mean([d.mean() for d in dropped]):.2f}",
                f"{np.mean([iterations(r) for r in runs]):.0f}",
                f"{np.mean([r.last_step / iterations(r) for r in runs]):,.0f}",
                f"{np.mean([r.summary.get('wall_time_s', np.nan) for r in runs]):.1f}",
            ]
        )
    for ax, title in zip(
        axes[0],
        (f"{label}: eval return", "tied groups among those collected", "groups collected but not used, per iteration"),
        strict=True,
    ):
        ax.set(title=title, xlabel="env steps")
        ax.grid(alpha=0.3)
        ex.legend(ax)
    header = [
        "GRPO",
        "final eval return (mean, per seed)",
        "seeds reaching 475, median steps",
        "tied fraction, last quarter",
        "groups collected but not used, per iteration",
        "iterations",
        "env steps per iteration",
        "wall time (s)",
    ]
    note = (
        "The tied fraction counts every group collected, those not used included. An iteration with dynamic sampling "
        "collects up to 1 + max_resample_rounds rounds of B groups to keep B informative ones; the groups it does not "
        "use are the tied ones and the informative ones beyond B."
    )
    table = ex.write_table(out_md, f"Dynamic sampling on {label}", header, rows, note)
    return [ex.save_png(fig, out_png), table]


def aggregation_training(runs: list[Run], out_png: Path, out_md: Path) -> list[Path]:
    """GRPO on CartPole with each loss aggregation: curves and final returns."""
    by_mode = {mode: [r for r in runs if r.config.get("aggregation") == mode] for mode in AGGREGATIONS}
    fig, axes = figure(1, 1, (6.0, 3.8))
    palette = algo_colors(list(AGGREGATIONS))
    rows = []
    for mode, own in by_mode.items():
        curve = mean_curve(own)
        if curve is not None:
            axes[0, 0].plot(curve.x, curve.mean, color=palette[mode], label=mode)
            if np.isfinite(curve.low).any():
                axes[0, 0].fill_between(curve.x, curve.low, curve.high, color=palette[mode], alpha=0.15, linewidth=0)
        rows.append([mode, finals(own), steps_to(own, 475)])
    axes[0, 0].set(title="GRPO on CartPole-v1, by loss aggregation", xlabel="env steps", ylabel="eval return")
    axes[0, 0].grid(alpha=0.3)
    ex.legend(axes[0, 0])
    header = ["aggregation", "final eval return (mean, per seed)", "seeds reaching 475, median steps"]
    table = ex.write_table(out_md, "Aggregation in training: GRPO on CartPole-v1", header, rows)
    return [ex.save_png(fig, out_png), table]


def cost(groups: dict[str, list[Run]], out_md: Path) -> Path:
    """What each agent holds and spends, from the runs' summaries and logs."""
    rows = []
    for label, runs in groups.items():
        for algo in ("ppo", "grpo"):
            own = [r for r in runs if r.algo == algo]
            if not own:
                continue
            s = own[0].summary
            params = (
                f"{s.get('parameters_actor_critic', 0):,} (actor + critic)"
                if algo == "ppo"
                else f"{s.get('parameters_actor', 0):,} actor + {s.get('parameters_reference', 0):,} reference"
            )
            steps = [r.last_step / iterations(r) for r in own]
            length = "charts/episodic_length" if algo == "ppo" else "grpo/episode_length_mean"
            per_start = np.mean([read_series(r.run_dir / "progress.csv", length)[1].mean() for r in own])
            G = own[0].config.get("group_size", 1) if algo == "grpo" else 1
            rows.append(
                [
                    label,
                    algo,
                    params,
                    f"{s.get('model_memory_bytes', 0):,}",
                    f"{np.mean(steps):,.0f}",
                    f"{per_start * G:,.0f} ({G} × {per_start:,.1f})",
                    f"{np.mean([r.summary.get('sps', np.nan) for r in own]):,.0f}",
                    f"{np.mean([r.summary.get('wall_time_s', np.nan) for r in own]):.1f}",
                ]
            )
    header = [
        "env",
        "algo",
        "parameters",
        "model memory (bytes)",
        "env steps per iteration",
        "env steps per start state",
        "steps/s",
        "wall time (s)",
    ]
    note = (
        "Model memory: the networks' weights and Adam's two moments (`summary.json`). A start state is a reset: PPO "
        "runs one episode from it, GRPO a group of G. Means over seeds."
    )
    return ex.write_table(out_md, "Cost: what each agent holds and spends", header, rows, note)


# ── the command ────────────────────────────────────────────────────────────────────────────────────


def cpu_name() -> str:
    """The processor's model name where the system tells it, else the architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def how_made(out: Path, b: Budgets, seconds: dict[str, float], small: float, workers: int, elapsed: float) -> Path:
    """HOW_MADE.md: the command, seeds, machine and times behind the figures."""

    seeds = (
        f"seeds {SEED}–{SEED + b.seeds - 1}, LunarLander {SEED}–{SEED + b.lunar_seeds - 1}"
        if b.seeds > 1
        else f"seed {SEED}"
    )
    lines = [
        "# How these figures were made",
        "",
        (
            f"- Command: `testbed docs{' --quick' if b.mode == 'quick' else ''}` ({b.mode} mode), from the "
            "repository's root."
        ),
        f"- Training runs: {seeds} (the partly trained policy: seed {SEED}); the small experiments: seed {SEED}.",
        (
            f"- Machine: {cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch "
            f"{torch.__version__}, one torch thread per run."
        ),
        "- Training time per bench, summed over its runs (s): "
        + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items())
        + f"; the small experiments: {small:.0f} s.",
        f"- This invocation took {elapsed:.0f} s with {workers} workers; runs that had finished before were reused.",
    ]
    (out / "HOW_MADE.md").write_text("\n".join(lines) + "\n")
    return out / "HOW_MADE.md"


def make_figures(out: Path, runs_root: Path, quick: bool, workers: int) -> list[Path]:
    """Run every experiment of the guide and write its figures and tables into ``out``; returns them."""
    b = QUICK if quick else FULL
    plans = grids(b)  # validated before any work
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    found: dict[str, list[Run]] = {}
    began = time.perf_counter()
    for name, grid in plans.items():
        # A quick run skips the bench reports: its tiny runs would only make them slower to write.
        bench_dir, outcomes = bench.run_grid(grid, workers, "local", None, root=runs_root, report=not quick)
        failed = [o for o in outcomes if o.status != "completed"]
        if failed:
            raise BadInput(
                f"{len(failed)} run(s) of {bench_dir} did not complete ({failed[0].error}); rerun `testbed docs` to "
                "resume them"
            )
        found[name] = find_runs([bench_dir])
        seconds[name] = sum(float(r.summary.get("wall_time_s") or 0.0) for r in found[name])
    started = time.perf_counter()
    model = partial_policy(found["partial"][0].run_dir)
    written = [ex.draw_clip_objective(out / "clip_objective.png")]
    written += ex.runaway_update(model.actor, SEED, b.runaway_epochs, out / "clip_runaway.png", out / "clip_runaway.md")
    written.append(ex.tied_group_update(model.actor, SEED, out / "tied_group.md"))
    written += ex.aggregation_weights(
        [20, 100, 500], 500, out / "aggregation_weights.png", out / "aggregation_weights.md"
    )
    written += ex.kl_estimators(b.kl_samples, SEED, out / "kl_estimators.png", out / "kl_estimators.md")
    written.append(
        ex.group_advantages_picture(model, SEED, b.group_horizon, 0.98, (0.0, 0.8, 1.0), out / "group_advantages.png")
    )
    written += ex.length_bias(out / "length_bias.png", out / "length_bias.md")
    small = time.perf_counter() - started
    chain_label = f"Chain (horizon {b.chain_horizon})"
    envs = {
        "CartPole-v1": found["cartpole-ppo"] + found["cartpole-grpo"],
        LUNAR: found["lunar"],
        chain_label: found["chain"],
    }
    written += diagnostics(envs, out / "diagnostics.png", out / "diagnostics.md")
    written += dynamic_sampling(
        found["cartpole-grpo"],
        found["cartpole-dynamic"],
        "CartPole-v1",
        out / "dynamic_sampling.png",
        out / "dynamic_sampling.md",
    )
    written += aggregation_training(
        found["aggregation"], out / "aggregation_training.png", out / "aggregation_training.md"
    )
    written.append(cost(envs, out / "cost.md"))
    written.append(how_made(out, b, seconds, small, workers, time.perf_counter() - began))
    return written


def main(out: str | None, runs: str | None, quick: bool, workers: int) -> list[Path]:
    """``testbed docs``: the defaults of each mode, checked options, then every figure. A quick run writes
    under runs/ by default, never over the committed figures."""
    if workers < 1:
        raise BadInput(f"--workers must be at least 1, got {workers}")
    default_out, default_runs = (
        ("runs/docs-quick/figures", "runs/docs-quick") if quick else ("docs/figures", "runs/docs")
    )
    return make_figures(Path(out or default_out), Path(runs or default_runs), quick, workers)
