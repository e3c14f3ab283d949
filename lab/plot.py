"""Learning-curve plots of any set of runs, and the interval, profile and sample-efficiency plots of
normalized scores.

Curves: one subplot per env (and per metric), one line per algo. A line is the mean over that algo's
runs of a return, on a common x grid: each run is interpolated on the grid only inside the range it
covers, and each grid point averages the runs that cover it. So runs of different lengths (a bench
still running, runs from two benches) still share one line, which ends where the longest run ends. The
shaded band is the 95% percentile bootstrap CI over runs, where at least two runs cover the point.

Two returns, two metrics: ``eval``, the deterministic evaluations (``eval/return_mean``, every
``eval_interval`` steps: a short run may hold one), and ``train``, the return of the episodes that ended
during each iteration of training (``charts/episodic_return`` of progress.csv, their mean; the stochastic
policy, raw env rewards), a point per iteration.

Figures are built on matplotlib's Agg canvas directly, never through pyplot, so plotting sets no
global state and needs no display.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

from envs.errors import BadInput
from lab.results import Run, find_runs, natural_key, read_series
from lab.stats import bootstrap_ci

XAxis = Literal["steps", "time"]
X_LABELS: dict[str, str] = {"steps": "env steps", "time": "wall-clock (s)"}
Metric = Literal["eval", "train"]
Y_LABELS: dict[str, str] = {"eval": "eval return (deterministic)", "train": "training return (episodes ended)"}
METRICS: dict[str, tuple[Metric, ...]] = {"eval": ("eval",), "train": ("train",), "both": ("eval", "train")}
"""The ``--metric`` choices and the panels each draws per env, left to right."""
TRAIN_COLUMN = "charts/episodic_return"
"""progress.csv's column of the mean return of the episodes that ended in each iteration (empty if none did)."""
GRID_POINTS = 200
"""The most points a curve is drawn with; fewer when the runs evaluate at fewer distinct x."""


@dataclass
class Curve:
    """The mean over runs of evaluation return on a grid, with its bootstrap band."""

    x: np.ndarray
    """(P,) grid."""
    mean: np.ndarray
    """(P,) mean over the runs covering each point; NaN where none does."""
    low: np.ndarray
    """(P,) lower end of the 95% CI; NaN where fewer than two runs cover the point."""
    high: np.ndarray
    """(P,) upper end of the 95% CI; NaN likewise."""
    n_runs: int
    """Runs with at least one evaluation."""


def train_returns(run: Run, x: XAxis) -> tuple[np.ndarray, np.ndarray]:
    """(x, mean return of the episodes that ended) of each progress.csv row where some episode ended."""
    path = run.run_dir / "progress.csv"
    steps, returns = read_series(path, TRAIN_COLUMN)
    if x == "steps":
        return steps.astype(np.float64), returns
    row_steps, times = read_series(path, "wall_time_s")
    time_at = dict(zip(row_steps.tolist(), times.tolist(), strict=True))
    return np.array([time_at.get(step, math.nan) for step in steps.tolist()], dtype=np.float64), returns


def run_xy(run: Run, x: XAxis, metric: Metric = "eval") -> tuple[np.ndarray, np.ndarray]:
    """The run's evaluations (``eval``) or training returns (``train``) as (x, return), sorted by x."""
    if metric == "eval":
        xs, ys = (run.steps.astype(np.float64) if x == "steps" else run.wall_time_s), run.eval_return
    else:
        xs, ys = train_returns(run, x)
    keep = np.isfinite(xs)
    order = np.argsort(xs[keep], kind="stable")
    return xs[keep][order], ys[keep][order]


def mean_curve(
    runs: Sequence[Run], x: XAxis = "steps", grid_points: int = GRID_POINTS, metric: Metric = "eval"
) -> Curve | None:
    """Mean and 95% bootstrap CI over ``runs`` of ``metric`` on a common grid; None when no run has a point."""
    series = [xy for xy in (run_xy(r, x, metric) for r in runs) if xy[0].size]
    if not series:
        return None
    # Runs of one bench evaluate at the same steps: the union of their x is then the exact grid.
    grid = np.unique(np.concatenate([xs for xs, _ in series]))
    if grid.size > grid_points:
        grid = np.linspace(grid[0], grid[-1], grid_points)
    values = np.full((len(series), grid.size), np.nan)  # (R, P)
    for i, (xs, ys) in enumerate(series):
        inside = (grid >= xs[0]) & (grid <= xs[-1])
        values[i, inside] = np.interp(grid[inside], xs, ys)
    covered = np.isfinite(values)  # (R, P)
    count = covered.sum(axis=0)  # (P,)
    mean = np.full(grid.size, np.nan)
    low, high = np.full(grid.size, np.nan), np.full(grid.size, np.nan)
    for p in np.flatnonzero(count):
        column = values[covered[:, p], p]
        mean[p] = column.mean()
        if column.size >= 2:
            low[p], high[p] = bootstrap_ci(column)
    return Curve(grid, mean, low, high, len(series))


def algo_colors(algos: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """One colour per algo, the same in every subplot and figure of a report."""
    palette = matplotlib.colormaps["tab10"]
    return {algo: palette(i % 10) for i, algo in enumerate(sorted(set(algos)))}


LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")


def line_styles(lines: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """Keyword arguments for ``ax.plot`` of each line: its own dash pattern and marker, the markers of the
    k-th line shifted by k/len of their spacing, so that lines drawn on top of each other (three algos all at
    the top of a performance profile) still show as three."""
    styles = {}
    for k, (algo, y) in enumerate(lines.items()):
        every = max(len(lines), y.size // 8)  # about 8 markers a line, each line's at its own points
        styles[algo] = {
            "linestyle": LINE_STYLES[k % len(LINE_STYLES)],
            "marker": MARKERS[k % len(MARKERS)],
            "markevery": (k * every // len(lines), every),
            "markersize": 5,
        }
    return styles


def coinciding(lines: dict[str, np.ndarray]) -> dict[str, list[str]]:
    """For each line, the earlier lines it coincides with (the same finite values, NaN at the same points):
    the legend names them, since one line on top of another hides it."""
    same: dict[str, list[str]] = {}
    for k, (algo, y) in enumerate(lines.items()):
        for other, z in list(lines.items())[:k]:
            if y.shape == z.shape and np.array_equal(np.isnan(y), np.isnan(z)) and np.allclose(y, z, equal_nan=True):
                same.setdefault(algo, []).append(other)
    return same


def draw_env(
    ax: Axes,
    runs: Sequence[Run],
    x: XAxis,
    colors: dict[str, tuple[float, ...]],
    metric: Metric = "eval",
    x_label: str | None = None,
) -> None:
    """One env's runs on ``ax``: a mean line of ``metric`` and its CI band per algo; ``x_label`` instead of
    the axis's usual name (a report's time in core time)."""
    drawn = False
    for k, algo in enumerate(sorted({r.algo for r in runs})):
        curve = mean_curve([r for r in runs if r.algo == algo], x, metric=metric)
        if curve is None:
            continue
        drawn = True
        color = colors[algo]
        label = f"{algo} ({curve.n_runs} run{'s' if curve.n_runs != 1 else ''})"
        # A curve of one point would be invisible as a line.
        marker = "o" if np.isfinite(curve.mean).sum() < 2 else None
        ax.plot(
            curve.x,
            curve.mean,
            color=color,
            label=label,
            marker=marker,
            linewidth=1.6,
            linestyle=LINE_STYLES[k % len(LINE_STYLES)],
        )
        band = np.isfinite(curve.low)
        if band.any():
            ax.fill_between(curve.x, curve.low, curve.high, where=band, color=color, alpha=0.2, linewidth=0)
    if drawn:
        ax.legend(fontsize="small", loc="best")
    else:
        empty = "no evaluations yet" if metric == "eval" else "no episode has ended yet"
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(x_label or X_LABELS[x])
    ax.set_ylabel(Y_LABELS[metric])
    ax.grid(alpha=0.3)


def new_figure(
    n_panels: int, panel_size: tuple[float, float] = (5.0, 3.6), ncols: int = 3
) -> tuple[Figure, list[Axes]]:
    """A figure on the Agg canvas with ``n_panels`` axes, at most ``ncols`` a row; spare axes hidden."""
    ncols = max(1, min(ncols, n_panels))
    nrows = max(1, math.ceil(n_panels / ncols))
    fig = Figure(figsize=(panel_size[0] * ncols, panel_size[1] * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).reshape(-1))
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes[:n_panels]


def save_figure(fig: Figure, out: Path) -> list[Path]:
    """Write the figure once, in one format: SVG where ``out`` ends in ``.svg`` (no date, a fixed id salt),
    else a PNG of at most 256 colours (a third of a full-colour one's size, for results kept in git); returns
    ``[path]``. The same figure gives the same bytes either way."""
    path = out if out.suffix == ".svg" else out.with_suffix(".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".svg":
        with matplotlib.rc_context({"svg.hashsalt": "testbed"}):
            fig.savefig(path, format="svg", metadata={"Date": None})
        return [path]
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    with Image.open(buffer) as image:
        palette = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    palette.save(path, format="PNG", optimize=True)
    return [path]


PANEL_TITLES: dict[str, str] = {"eval": "evaluation", "train": "training"}


def plot_env_runs(
    runs: Sequence[Run],
    x: XAxis,
    out: Path,
    colors: dict[str, tuple[float, ...]] | None = None,
    metrics: Sequence[Metric] = ("eval",),
    x_label: str | None = None,
) -> list[Path]:
    """Plot runs (of one env or many) one subplot per env and metric, an env's metrics side by side on the
    same axes' scales; write ``out`` as PNG and SVG. ``x_label``: see :func:`draw_env`."""
    envs = sorted({r.env_id for r in runs}, key=natural_key)
    colors = colors or algo_colors([r.algo for r in runs])
    fig, axes = new_figure(len(envs) * len(metrics), ncols=3 if len(metrics) == 1 else len(metrics))
    for i, env_id in enumerate(envs):
        row = axes[i * len(metrics) : (i + 1) * len(metrics)]
        for ax in row[1:]:
            # One scale: the deterministic evaluations beside the training episodes, at the same steps.
            ax.sharex(row[0])
            ax.sharey(row[0])
        for ax, metric in zip(row, metrics, strict=True):
            draw_env(ax, [r for r in runs if r.env_id == env_id], x, colors, metric, x_label)
            ax.set_title(env_id if len(metrics) == 1 else f"{env_id}: {PANEL_TITLES[metric]}")
    return save_figure(fig, out)


def default_out(paths: Sequence[Path], x: XAxis, metric: str) -> Path:
    """Where :func:`plot_runs` writes without ``out``: into the one folder plotted, beside its runs, as
    ``PATH/plots/curves-<x>.png`` (``curves-<metric>-<x>.png`` for one metric). A figure of several
    folders belongs to none of them: it needs ``out``."""
    if len(paths) != 1:
        raise BadInput(
            f"{len(paths)} paths make one figure that belongs to none of them: say where it goes with --out FILE, e.g. "
            "--out plots/compare.png (one path writes into PATH/plots/)."
        )
    return Path(paths[0]) / "plots" / (f"curves-{x}.png" if metric == "both" else f"curves-{metric}-{x}.png")


def plot_runs(paths: Sequence[Path], x: XAxis = "steps", out: Path | None = None, metric: str = "both") -> list[Path]:
    """Learning curves of every run found in ``paths``: one subplot per env and metric, one line per algo.

    ``metric``: ``eval`` (the deterministic evaluations), ``train`` (the training episodes' returns) or
    ``both``, side by side. Writes ``out`` (default: :func:`default_out`) as PNG and SVG and returns both
    paths.
    """
    if x not in X_LABELS:
        raise BadInput(f"x must be one of {', '.join(X_LABELS)}, not {x!r}")
    if metric not in METRICS:
        raise BadInput(f"metric must be one of {', '.join(METRICS)}, not {metric!r}")
    out = Path(out) if out is not None else default_out(paths, x, metric)
    runs = find_runs(paths)
    return plot_env_runs(runs, x, out, metrics=METRICS[metric])


def _fit_x(ax: Axes, values: Sequence[float]) -> None:
    """x-limits that hold every value with a margin, so that no bar or reference line touches the edge."""
    low, high = min(values), max(values)
    pad = 0.08 * (high - low) if high > low else 0.5
    ax.set_xlim(low - pad, high + pad)


def plot_aggregates(
    aggregates: dict[str, dict[str, Any]],
    metric_names: Sequence[str],
    out: Path,
    colors: dict[str, tuple[float, ...]] | None = None,
    title: str = "Aggregate normalized scores",
) -> list[Path]:
    """rliable's interval-estimate figure: one panel per metric, all in one row, one bar (CI) per algo, a tick
    at the point. Every panel names the algos of its rows, so that no bar is read against another's label."""
    algos = list(aggregates)
    colors = colors or algo_colors(algos)
    # One row that never wraps: new_figure's rows of three would put a fourth panel alone below.
    fig = Figure(figsize=(1.0 + 3.4 * len(metric_names), 0.5 * len(algos) + 1.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(1, len(metric_names), squeeze=False)[0])
    for ax, name in zip(axes, metric_names, strict=True):
        for i, algo in enumerate(algos):
            y, interval = len(algos) - 1 - i, aggregates[algo][name]
            ax.barh(
                y,
                max(interval.high - interval.low, 0.0),
                left=interval.low,
                height=0.6,
                color=colors.get(algo, "tab:gray"),
                alpha=0.75,
            )
            ax.vlines(interval.point, y - 0.3, y + 0.3, color="black", linewidth=2)
        _fit_x(ax, [v for algo in algos for v in (aggregates[algo][name].low, aggregates[algo][name].high)])
        ax.set_yticks(range(len(algos)), list(reversed(algos)))
        ax.set_title(name)
        ax.set_xlabel("normalized score")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(title)
    return save_figure(fig, out)


def plot_bands(
    x: np.ndarray,
    lines: dict[str, np.ndarray],
    bands: dict[str, np.ndarray],
    xlabel: str,
    ylabel: str,
    out: Path,
    colors: dict[str, tuple[float, ...]] | None = None,
    *,
    title: str,
) -> list[Path]:
    """One line per algo with its CI band ``(2, len(x))``: performance profiles, sample-efficiency curves.

    A line may end early (NaN past its last point, e.g. an algo trained for fewer steps); the x-axis still
    spans all of ``x``, so every algo's range shows. Each line has its own dash and markers
    (:func:`line_styles`), and the legend names the lines it coincides with (:func:`coinciding`)."""
    colors = colors or algo_colors(list(lines))
    fig, (ax,) = new_figure(1, panel_size=(6.0, 3.8))
    styles, same = line_styles(lines), coinciding(lines)
    for algo, y in lines.items():
        label = f"{algo} (same line as {', '.join(same[algo])})" if algo in same else algo
        style = styles[algo] if np.isfinite(y).sum() >= 2 else {**styles[algo], "markevery": None}  # one point shows
        ax.plot(x, y, color=colors.get(algo), label=label, **style)
        ax.fill_between(x, bands[algo][0], bands[algo][1], color=colors.get(algo), alpha=0.2, linewidth=0)
    if len(x) > 1:
        ax.set_xlim(float(x[0]), float(x[-1]))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, out)
