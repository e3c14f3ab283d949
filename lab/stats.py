"""Aggregate statistics across envs, as rliable computes them (Agarwal et al. 2021, "Deep RL at the Edge of
the Statistical Precipice"), on normalized scores.

A score matrix holds one algo's normalized final scores, ``(R, M)``: R runs (seeds) of each of M envs.
Every interval is a 95% percentile *stratified* bootstrap: each resample draws R runs with replacement
within every env, so each env keeps its weight, where pooling all (env, seed) runs would let a resample
hold one env many times and another not at all. The resampling generator is seeded: rebuilding a report
from the same runs gives the same intervals.

The metrics (rliable's ``metrics``):
- IQM: the mean of the middle 50% of all R·M scores; robust to outlier runs, less noisy than the median;
- median and mean over envs of each env's mean score;
- optimality gap: γ − mean(min(score, γ)) with γ = 1, how far the algo falls short of the target;
- probability of improvement P(X > Y): for each env, the Mann-Whitney probability that a run of X scores
  above a run of Y (ties count half), averaged over envs;
- performance profile: for each τ, the fraction of the R·M runs scoring above τ;
- sample efficiency: the IQM over runs and envs of the normalized evaluation return at each env step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from envs.errors import BadInput
from lab.results import Run

REPS = 2000
"""Bootstrap resamples: rliable's default for performance profiles. Its default for aggregates, 50,000,
took 8.2 s per algo on GRPO's 9 MuJoCo runs (3 envs × 3 seeds, 2-core Xeon) and moved no bound of those
aggregates by as much as 0.001."""
CONFIDENCE = 0.95


def _estimates(scores: dict[str, Any], func: Callable[..., Any], reps: int, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """rliable's ``get_interval_estimates``: point estimates and percentile CIs ``(2, …)`` per key, seeded."""
    from rliable import library  # here and below: only a report's section across envs needs rliable (and arch)

    with warnings.catch_warnings():
        # arch warns that rliable's RandomState argument will someday need another keyword; it works today.
        warnings.simplefilter("ignore", FutureWarning)
        return library.get_interval_estimates(scores, func, reps=reps, confidence_interval_size=CONFIDENCE,
                                              random_state=np.random.RandomState(seed))  # fmt: skip


def _metrics() -> dict[str, Callable[[np.ndarray], float]]:
    from rliable import metrics

    return {
        "IQM": metrics.aggregate_iqm,
        "median": metrics.aggregate_median,
        "mean": metrics.aggregate_mean,
        "optimality gap": metrics.aggregate_optimality_gap,
    }


METRIC_NAMES = ("IQM", "median", "mean", "optimality gap")


@dataclass(frozen=True)
class Interval:
    point: float
    low: float
    high: float


@dataclass
class ScoreMatrices:
    """Each algo's ``(R, M)`` normalized final scores over the same M envs."""

    envs: list[str]
    scores: dict[str, np.ndarray]
    dropped: dict[str, int]
    """Runs left out per algo so that every env has the same R: an env's extra completed seeds."""
    unshared: list[str]
    """Envs with normalized scores that some algo has not run (to completion): left out of the comparison."""


def score_matrices(runs: Sequence[Run], normalize: Callable[[Run, float], float | None]) -> ScoreMatrices:
    """Normalized final scores of completed runs, as one ``(R, M)`` matrix per algo.

    The envs are those where every algo has a completed, normalizable run; R is an algo's smallest number
    of such runs over these envs, taking the lowest seeds, since rliable's bootstrap needs R runs per env.
    ``normalize(run, score)`` gives None for a run without reference scores.
    """
    table: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for run in runs:
        if run.status != "completed" or run.final_return is None:
            continue
        value = normalize(run, run.final_return)
        if value is not None:
            table.setdefault(run.algo, {}).setdefault(run.env_id, []).append((run.seed, value))
    algos = sorted(table)
    envs = sorted(set.intersection(*(set(table[a]) for a in algos))) if algos else []
    scores: dict[str, np.ndarray] = {}
    dropped: dict[str, int] = {}
    for algo in algos:
        if not envs:
            break
        per_env = [sorted(table[algo][env]) for env in envs]
        r = min(len(values) for values in per_env)
        scores[algo] = np.array([[values[i][1] for values in per_env] for i in range(r)])  # (R, M)
        dropped[algo] = sum(len(values) - r for values in per_env)
    unshared = sorted(set().union(*(set(table[a]) for a in algos)) - set(envs)) if algos else []
    return ScoreMatrices(envs, scores, dropped, unshared)


def aggregate_intervals(scores: dict[str, np.ndarray], seed: int = 0) -> dict[str, dict[str, Interval]]:
    """IQM, median, mean and optimality gap per algo, each with its stratified bootstrap CI."""
    metrics = _metrics()

    def all_metrics(matrix: np.ndarray) -> np.ndarray:
        return np.array([metrics[name](matrix) for name in METRIC_NAMES])

    points, intervals = _estimates(scores, all_metrics, REPS, seed)
    return {algo: {name: Interval(float(points[algo][i]), float(intervals[algo][0][i]), float(intervals[algo][1][i]))
                   for i, name in enumerate(METRIC_NAMES)} for algo in scores}  # fmt: skip


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) = 1/M Σ_m 1/(R_x·R_y) Σ_i Σ_j [x_im > y_jm] + ½·[x_im = y_jm].

    x: ``(R_x, M)`` scores of algo X, R_x runs on each of M envs; y: ``(R_y, M)`` of algo Y on the same envs.
    The inner double sum is the Mann-Whitney U statistic of env m, so this equals rliable's
    ``metrics.probability_of_improvement``; it is computed here with one array comparison instead of
    one SciPy test per env, which makes the bootstrap's thousands of evaluations fast.
    """
    greater = (x[:, None, :] > y[None, :, :]).mean(axis=(0, 1))  # (M,)
    ties = (x[:, None, :] == y[None, :, :]).mean(axis=(0, 1))
    return float(np.mean(greater + 0.5 * ties))


def improvement_probabilities(scores: dict[str, np.ndarray], seed: int = 0) -> dict[tuple[str, str], Interval]:
    """P(X > Y) for every ordered pair of algos, with its stratified bootstrap CI (the runs of X and of Y
    resampled independently within each env). P(Y > X) = 1 − P(X > Y), so each pair is bootstrapped once."""
    algos = list(scores)
    pairs = {f"{x}\t{y}": [scores[x], scores[y]] for i, x in enumerate(algos) for y in algos[i + 1 :]}
    if not pairs:
        return {}
    points, intervals = _estimates(pairs, probability_of_improvement, REPS, seed)
    result: dict[tuple[str, str], Interval] = {}
    for key in pairs:
        x, y = key.split("\t")
        point, (low, high) = float(points[key]), map(float, np.ravel(intervals[key]))
        result[(x, y)] = Interval(point, low, high)
        result[(y, x)] = Interval(1.0 - point, 1.0 - high, 1.0 - low)
    return result


def performance_profiles(
    scores: dict[str, np.ndarray], taus: np.ndarray, seed: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The fraction of runs scoring above each τ, per algo, and its CI ``(2, len(taus))``."""
    from rliable import library

    return _estimates(scores, lambda matrix: library.score_distributions(matrix, taus), REPS, seed)


def normalized_curves(
    runs: Sequence[Run], envs: list[str], normalize: Callable[[Run, float], float | None], points: int = 20
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Each algo's ``(R, M, S)`` normalized evaluation returns on a grid of S env steps.

    The grid runs to the last step that every run of the ``envs`` reached, so each point has every run;
    a run's curve is linearly interpolated between its evaluations. R as in :func:`score_matrices`.
    """
    chosen = [r for r in runs if r.env_id in envs and r.status == "completed" and r.steps.size >= 2]
    if not chosen:
        return np.zeros(0), {}
    last = min(float(r.steps[-1]) for r in chosen)
    first = max(float(r.steps[0]) for r in chosen)
    grid = np.linspace(first, last, points) if last > first else np.array([last])
    curves: dict[str, np.ndarray] = {}
    for algo in sorted({r.algo for r in chosen}):
        per_env = [sorted((r for r in chosen if r.algo == algo and r.env_id == env), key=lambda r: r.seed) for env in envs]
        if any(not env_runs for env_runs in per_env):
            continue
        r_count = min(len(env_runs) for env_runs in per_env)
        curves[algo] = np.array([[[normalize(run, float(v)) for v in np.interp(grid, run.steps, run.eval_return)]
                                  for run in (env_runs[i] for env_runs in per_env)]
                                 for i in range(r_count)], dtype=np.float64)  # fmt: skip
    return grid, curves


def sample_efficiency(curves: dict[str, np.ndarray], seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The IQM over runs and envs at each grid step, per algo, with its stratified bootstrap CI ``(2, S)``."""
    def iqm_per_step(curve: np.ndarray) -> np.ndarray:  # (R, M, S) → (S,): rliable's aggregate_iqm at each step
        return stats.trim_mean(curve.reshape(-1, curve.shape[-1]), 0.25, axis=0)

    return _estimates(curves, iqm_per_step, REPS, seed)


# ── one set of values: the IQM and bootstrap intervals of the reports ─────────────────────────────


def iqm(values: np.ndarray) -> float:
    """Interquartile mean: the mean of the middle 50% of the values (25% trimmed from each end).

    IQM = mean{ x_(i) : ⌊0.25·n⌋ ≤ i < n − ⌊0.25·n⌋ } over the sorted values x_(0) ≤ … ≤ x_(n−1).
    Robust to an outlier seed, yet uses more of the data than the median (Agarwal et al. 2021,
    "Deep RL at the Edge of the Statistical Precipice").
    """
    return float(stats.trim_mean(np.asarray(values, dtype=np.float64), 0.25))


def _iqm_along(values: np.ndarray, axis: int) -> np.ndarray:
    return stats.trim_mean(values, 0.25, axis=axis)


# Vectorized forms of statistics that take no ``axis``: scipy then resamples in one array operation
# instead of calling the statistic 2000 times.
_VECTORIZED: dict[Callable[..., Any], Callable[..., Any]] = {iqm: _iqm_along}


def bootstrap_ci(
    values: np.ndarray,
    statistic: Callable[..., Any] = np.mean,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of ``statistic`` over ``values`` (e.g. one value per seed).

    Resample the n values with replacement ``n_resamples`` times; the interval is the
    ((1−c)/2, (1+c)/2) quantiles of the statistic over the resamples. Deterministic: the resampling
    uses its own generator seeded with ``seed``. One value gives ``(v, v)``: there is no spread to
    resample.
    """
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if values.size == 0:
        raise BadInput("bootstrap_ci needs at least one value")
    if values.size == 1 or np.all(values == values[0]):
        value = float(statistic(values))
        return value, value
    result = stats.bootstrap(
        (values,),
        _VECTORIZED.get(statistic, statistic),
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)
