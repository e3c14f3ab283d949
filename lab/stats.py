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
from dataclasses import dataclass, field
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


def _estimates(
    scores: dict[str, Any], func: Callable[..., Any], reps: int, seed: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """rliable's ``get_interval_estimates``: point estimates and percentile CIs ``(2, …)`` per key, seeded.

    rliable's stratified bootstraps draw their resampling indices from NumPy's global generator
    (``np.random.choice``), not from the ``random_state`` they are given; so the global generator is seeded
    for the call, and its state put back after it."""
    from rliable import library  # here and below: only a report's section across envs needs rliable (and arch)

    global_state = np.random.get_state()
    np.random.seed(seed)
    try:
        with warnings.catch_warnings():
            # arch warns that rliable's RandomState argument is deprecated; it is passed on all the same.
            warnings.simplefilter("ignore", FutureWarning)
            return library.get_interval_estimates(
                scores, func, reps=reps, confidence_interval_size=CONFIDENCE, random_state=np.random.RandomState(seed)
            )
    finally:
        np.random.set_state(global_state)


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
    left_out: dict[str, int] = field(default_factory=dict)
    """Algos left out, with the number of envs each completed: too few to share with the others (below)."""


def score_matrices(runs: Sequence[Run], normalize: Callable[[Run, float], float | None]) -> ScoreMatrices:
    """Normalized final scores of completed runs, as one ``(R, M)`` matrix per algo.

    The envs are those where every algo has a completed, normalizable run; R is an algo's smallest number
    of such runs over these envs, taking the lowest seeds, since rliable's bootstrap needs R runs per env.
    Of three or more algos, the one with the fewest such envs is left out while that widens the envs the
    others share (a bench whose third algo has only begun compares the other two where both ran).
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

    def shared(chosen: list[str]) -> set[str]:
        return set.intersection(*(set(table[a]) for a in chosen)) if chosen else set()

    left_out: dict[str, int] = {}
    while len(algos) > 2:
        fewest = min(algos, key=lambda a: (len(table[a]), a))
        rest = [a for a in algos if a != fewest]
        if len(shared(rest)) <= len(shared(algos)):
            break
        algos, left_out[fewest] = rest, len(table[fewest])
    envs = sorted(shared(algos))
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
    return ScoreMatrices(envs, scores, dropped, unshared, left_out)


def aggregate_intervals(scores: dict[str, np.ndarray], seed: int = 0) -> dict[str, dict[str, Interval]]:
    """IQM, median, mean and optimality gap per algo, each with its stratified bootstrap CI."""
    metrics = _metrics()

    def all_metrics(matrix: np.ndarray) -> np.ndarray:
        return np.array([metrics[name](matrix) for name in METRIC_NAMES])

    points, intervals = _estimates(scores, all_metrics, REPS, seed)
    return {
        algo: {
            name: Interval(float(points[algo][i]), float(intervals[algo][0][i]), float(intervals[algo][1][i]))
            for i, name in enumerate(METRIC_NAMES)
        }
        for algo in scores
    }


def env_improvements(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P_m(X > Y) = 1/(R_x·R_y) Σ_i Σ_j [x_im > y_jm] + ½·[x_im = y_jm], for each env m.

    x: ``(R_x, M)`` scores of algo X, R_x runs on each of M envs; y: ``(R_y, M)`` of algo Y on the same envs.
    P_m is env m's Mann-Whitney probability that a run of X scores above a run of Y (ties count half),
    computed with one array comparison instead of one SciPy test per env, which makes the bootstrap's
    thousands of evaluations fast. Returns ``(M,)``.
    """
    greater = (x[:, None, :] > y[None, :, :]).mean(axis=(0, 1))  # (M,)
    ties = (x[:, None, :] == y[None, :, :]).mean(axis=(0, 1))  # (M,)
    return greater + 0.5 * ties


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) = 1/M Σ_m P_m(X > Y), the mean over the M envs of :func:`env_improvements`; this equals
    rliable's ``metrics.probability_of_improvement``. x: ``(R_x, M)``; y: ``(R_y, M)``."""
    return float(np.mean(env_improvements(x, y)))


def _pairwise(
    scores: dict[str, np.ndarray], func: Callable[[np.ndarray, np.ndarray], Any], seed: int
) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """``func(x, y)``'s point estimate and CI ``(2, …)`` for each pair of algos X before Y in ``scores``: a
    stratified bootstrap, the runs of X and of Y resampled independently within each env."""
    algos = list(scores)
    pairs = {f"{x}\t{y}": [scores[x], scores[y]] for i, x in enumerate(algos) for y in algos[i + 1 :]}
    if not pairs:
        return {}
    points, intervals = _estimates(pairs, func, REPS, seed)
    result: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    for key in pairs:
        x, y = key.split("\t")
        result[(x, y)] = np.asarray(points[key]), np.asarray(intervals[key])
    return result


def improvement_probabilities(scores: dict[str, np.ndarray], seed: int = 0) -> dict[tuple[str, str], Interval]:
    """P(X > Y) for every ordered pair of algos, with its stratified bootstrap CI (the runs of X and of Y
    resampled independently within each env). P(Y > X) = 1 − P(X > Y), so each pair is bootstrapped once."""
    result: dict[tuple[str, str], Interval] = {}
    for (x, y), (point, interval) in _pairwise(scores, probability_of_improvement, seed).items():
        low, high = map(float, np.ravel(interval))
        result[(x, y)] = Interval(float(point), low, high)
        result[(y, x)] = Interval(1.0 - float(point), 1.0 - high, 1.0 - low)
    return result


def improvement_by_env(scores: dict[str, np.ndarray], seed: int = 0) -> dict[tuple[str, str], list[Interval]]:
    """P_m(X > Y) on each env m, in the order of the matrices' columns, for each pair of algos X before Y in
    ``scores``, with its bootstrap CI (the runs of X and of Y resampled within env m): the terms whose mean is
    P(X > Y) (:func:`env_improvements`)."""
    return {
        pair: [Interval(float(p), float(low), float(high)) for p, low, high in zip(point, *interval, strict=True)]
        for pair, (point, interval) in _pairwise(scores, env_improvements, seed).items()
    }


def performance_profiles(
    scores: dict[str, np.ndarray], taus: np.ndarray, seed: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The fraction of runs scoring above each τ, per algo, and its CI ``(2, len(taus))``."""
    from rliable import library

    return _estimates(scores, lambda matrix: library.score_distributions(matrix, taus), REPS, seed)


def normalized_curves(
    runs: Sequence[Run], envs: list[str], normalize: Callable[[Run, float], float | None], points: int = 50
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Each algo's ``(R, M, S)`` normalized evaluation returns on a grid of S env steps.

    The grid spans every algo's steps, up to the last step of the longest run, in ``points`` even steps plus
    each algo's own first and last. An algo's curve covers the steps that every one of its runs covers, from
    its runs' latest first evaluation to the end of its shortest run, and is NaN elsewhere: an algo trained
    for 100k steps ends earlier on the same axis as one trained for 500k. A run's curve is linearly
    interpolated between its evaluations. R as in :func:`score_matrices`.
    """
    chosen = [r for r in runs if r.env_id in envs and r.status == "completed" and r.steps.size >= 2]
    spans: dict[str, tuple[float, float]] = {}  # algo → the steps all of its runs cover
    for algo in sorted({r.algo for r in chosen}):
        mine = [r for r in chosen if r.algo == algo]
        first, last = max(float(r.steps[0]) for r in mine), min(float(r.steps[-1]) for r in mine)
        if first <= last and {r.env_id for r in mine} == set(envs):
            spans[algo] = (first, last)
    if not spans:
        return np.zeros(0), {}
    low, high = min(a for a, _ in spans.values()), max(float(r.steps[-1]) for r in chosen if r.algo in spans)
    ends = [x for span in spans.values() for x in span]  # each algo's line starts and ends on the grid
    grid = np.unique(np.concatenate([np.linspace(low, high, points), ends]))  # (S,)
    curves: dict[str, np.ndarray] = {}
    for algo, (first, last) in spans.items():
        per_env = [
            sorted((r for r in chosen if r.algo == algo and r.env_id == env), key=lambda r: r.seed) for env in envs
        ]
        covered = (grid >= first) & (grid <= last)  # (S,)
        r_count = min(len(env_runs) for env_runs in per_env)
        curve = np.full((r_count, len(envs), grid.size), np.nan)  # (R, M, S)
        for i in range(r_count):
            for m, env_runs in enumerate(per_env):
                run = env_runs[i]
                values = np.interp(grid[covered], run.steps, run.eval_return)
                curve[i, m, covered] = [normalize(run, float(v)) for v in values]
        curves[algo] = curve
    return grid, curves


def sample_efficiency(
    curves: dict[str, np.ndarray], seed: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The IQM over runs and envs at each grid step, per algo, with its stratified bootstrap CI ``(2, S)``.

    Steps outside an algo's span (NaN in its curve, :func:`normalized_curves`) are NaN in its IQM and CI too."""

    def iqm_per_step(curve: np.ndarray) -> np.ndarray:  # (R, M, S) → (S,): rliable's aggregate_iqm at each step
        return stats.trim_mean(curve.reshape(-1, curve.shape[-1]), 0.25, axis=0)

    covered = {algo: np.isfinite(curve).all(axis=(0, 1)) for algo, curve in curves.items()}  # (S,) each
    points, cis = _estimates(
        {algo: curve[..., covered[algo]] for algo, curve in curves.items()}, iqm_per_step, REPS, seed
    )
    full_points, full_cis = {}, {}
    for algo, mask in covered.items():
        full_points[algo] = np.full(mask.size, np.nan)  # (S,)
        full_points[algo][mask] = points[algo]
        full_cis[algo] = np.full((2, mask.size), np.nan)  # (2, S)
        full_cis[algo][:, mask] = np.reshape(cis[algo], (2, -1))
    return full_points, full_cis


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


def difference_ci(
    x: np.ndarray, y: np.ndarray, confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """The difference of means Δ = ȳ − x̄ of two independent groups (each one value per seed) and its percentile
    bootstrap confidence interval: resample x and y with replacement, each on its own, ``n_resamples`` times,
    and take the ((1−c)/2, (1+c)/2) quantiles of Δ* = ȳ* − x̄*. Deterministic (its own generator, ``seed``).
    Groups with no spread give (Δ, Δ, Δ). Returns (Δ, low, high)."""
    x, y = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (x, y))
    if x.size == 0 or y.size == 0:
        raise BadInput("difference_ci needs at least one value in each group")
    delta = float(y.mean() - x.mean())
    if np.all(x == x[0]) and np.all(y == y[0]):
        return delta, delta, delta
    result = stats.bootstrap(
        (x, y),
        lambda a, b, axis: np.mean(b, axis=axis) - np.mean(a, axis=axis),
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return delta, float(result.confidence_interval.low), float(result.confidence_interval.high)


FEW_SEEDS = 3
"""A bootstrap CI from fewer seeds resamples only those few values: it spans at most them, and is marked."""
FEW_MARK = "†"


def mark_few(ci: str, n: int) -> str:
    """A CI's text, marked with :data:`FEW_MARK` when it comes from fewer than :data:`FEW_SEEDS` seeds."""
    return f"{ci} {FEW_MARK}" if n < FEW_SEEDS else ci


def few_seeds_note(n: int) -> str:
    """The footnote of :data:`FEW_MARK`; ``n``: the fewest seeds behind a marked CI."""
    seeds = "1 seed" if n == 1 else f"{n} seeds"
    return (
        f"{FEW_MARK} CI from {seeds}, fewer than {FEW_SEEDS}: a bootstrap resamples only those values, so the interval "
        "spans at most them; read it as their range, not as a 95% interval."
    )
