"""Aggregate statistics across envs (lab/stats.py): hand-checked values, rliable's own functions, stratification."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.figure import Figure
from rliable import library, metrics

from lab import stats
from lab.plot import plot_aggregates
from lab.results import Run

# (R, M) = (3 runs, 2 envs): env 0 scores near 0, env 1 near 1.
SPLIT = np.array([[0.00, 1.00], [0.01, 1.01], [0.02, 1.02]])


def test_the_aggregates_are_rliables_and_match_hand_computed_values() -> None:
    scores = np.array([[0.5, 1.2, 0.1], [0.8, 0.2, 0.3]])  # (R, M) = (2, 3)
    estimates = stats.aggregate_intervals({"x": scores})["x"]
    # Hand: the per-env means are 0.65, 0.7 and 0.2; their mean is 0.5167 and their median 0.65.
    # The IQM drops one of the six scores at each end (0.1, 1.2) and averages 0.2, 0.3, 0.5, 0.8 → 0.45.
    # Optimality gap = 1 − mean(min(s, 1)) = 1 − (0.5 + 1 + 0.1 + 0.8 + 0.2 + 0.3)/6 = 0.5167.
    assert estimates["mean"].point == pytest.approx(1.55 / 3)
    assert estimates["median"].point == pytest.approx(0.65)
    assert estimates["IQM"].point == pytest.approx(0.45) == pytest.approx(metrics.aggregate_iqm(scores))
    assert estimates["optimality gap"].point == pytest.approx(1 - 2.9 / 6)
    for interval in estimates.values():
        assert interval.low <= interval.point <= interval.high
    # The same seed gives the same intervals: a rebuilt report does not move.
    assert stats.aggregate_intervals({"x": scores}) == stats.aggregate_intervals({"x": scores})


def test_intervals_do_not_depend_on_numpys_global_generator_and_leave_it_as_it_was() -> None:
    # rliable's StratifiedBootstrap draws its resamples from np.random, whatever random_state it is given; a
    # report built after training (which seeds np.random) would otherwise move its bounds from run to run.
    scores = np.random.default_rng(1).random((5, 4))  # (R, M): enough runs that resamples differ
    pairs = {"x": scores, "y": scores[::-1] * 0.9}
    np.random.seed(1)
    first = stats.aggregate_intervals(pairs), stats.improvement_probabilities(pairs)
    state = np.random.get_state()
    second = stats.aggregate_intervals(pairs), stats.improvement_probabilities(pairs)
    assert first == second
    after = np.random.get_state()
    assert after[0] == state[0] and np.array_equal(after[1], state[1]) and after[2:] == state[2:]


def test_probability_of_improvement_equals_rliables_and_hand_cases() -> None:
    rng = np.random.default_rng(0)
    x, y = np.round(rng.normal(size=(4, 3)), 1), np.round(rng.normal(size=(6, 3)), 1)
    y[:2] = x[:2]  # ties, which count half
    assert stats.probability_of_improvement(x, y) == pytest.approx(metrics.probability_of_improvement(x, y))
    # Hand: env 0, x = (1, 3) against y = (2, 2): two of four pairs greater → 0.5; env 1, (1, 1) against
    # (1, 0): two greater, two tied → (2 + 1)/4 = 0.75. Mean over envs 0.625.
    assert stats.probability_of_improvement(np.array([[1, 1], [3, 1]]), np.array([[2, 1], [2, 0]])) == pytest.approx(
        0.625
    )
    both = stats.improvement_probabilities({"a": SPLIT + 0.5, "b": SPLIT})
    assert both[("a", "b")].point == pytest.approx(1.0) and both[("b", "a")].point == pytest.approx(0.0)
    assert both[("b", "a")].high == pytest.approx(1.0 - both[("a", "b")].low)


def test_improvement_by_env_gives_each_envs_term_of_the_mean() -> None:
    # Hand: env 0, x = (1, 3) against y = (2, 2): 0.5; env 1, (1, 1) against (1, 0): 0.75 (as above).
    x, y = np.array([[1, 1], [3, 1]]), np.array([[2, 1], [2, 0]])
    assert stats.env_improvements(x, y) == pytest.approx([0.5, 0.75])
    # a wins every pairing on env 0 and loses every one on env 1: 1 and 0, each with no spread, mean 0.5.
    a = np.column_stack([SPLIT[:, 0] + 0.5, SPLIT[:, 1] - 0.5])
    by_env = stats.improvement_by_env({"a": a, "b": SPLIT})
    assert list(by_env) == [("a", "b")]
    assert by_env[("a", "b")] == [stats.Interval(1.0, 1.0, 1.0), stats.Interval(0.0, 0.0, 0.0)]
    assert stats.improvement_probabilities({"a": a, "b": SPLIT})[("a", "b")].point == pytest.approx(0.5)
    # Where runs overlap, each env's interval brackets its point and stays within [0, 1].
    rng = np.random.default_rng(2)
    scores = {"x": rng.random((5, 3)), "y": rng.random((5, 3)), "z": rng.random((5, 3))}
    by_env = stats.improvement_by_env(scores)
    assert list(by_env) == [("x", "y"), ("x", "z"), ("y", "z")]
    for (x_name, y_name), intervals in by_env.items():
        points = stats.env_improvements(scores[x_name], scores[y_name])
        assert [v.point for v in intervals] == pytest.approx(points)
        assert all(0.0 <= v.low <= v.point <= v.high <= 1.0 for v in intervals)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # arch on rliable's RandomState argument
def test_the_bootstrap_is_stratified_where_pooling_would_give_another_interval() -> None:
    stratified = stats.aggregate_intervals({"x": SPLIT})["x"]["mean"]
    # Resampling runs within each env keeps one env-0 and one env-1 score per pair: the mean stays near 0.51.
    assert stratified.high - stratified.low < 0.03
    # Pooling the six (env, seed) runs lets a resample draw mostly one env: a wide interval.
    pooled = library.StratifiedBootstrap(SPLIT.reshape(-1, 1), random_state=np.random.RandomState(0))
    low, high = np.ravel(pooled.conf_int(np.mean, reps=2000, method="percentile"))
    assert high - low > 0.5


def run(algo: str, env_id: str, seed: int, final: float, steps: list[int], returns: list[float]) -> Run:
    return Run(
        Path(f"{algo}/{env_id}/{seed}"),
        algo,
        env_id,
        seed,
        "completed",
        {},
        np.array(steps),
        np.zeros(len(steps)),
        np.array(returns, dtype=float),
        final,
    )


def test_score_matrices_keep_common_envs_and_equal_run_counts() -> None:
    runs = [
        run("a", "E1", 0, 1.0, [0], [0]),
        run("a", "E1", 1, 2.0, [0], [0]),
        run("a", "E2", 0, 3.0, [0], [0]),
        run("b", "E1", 0, 4.0, [0], [0]),
        run("b", "E3", 0, 5.0, [0], [0]),
    ]
    matrices = stats.score_matrices(runs, lambda r, score: score / 10)
    assert matrices.envs == ["E1"] and matrices.unshared == ["E2", "E3"]
    np.testing.assert_allclose(matrices.scores["a"], [[0.1], [0.2]])
    np.testing.assert_allclose(matrices.scores["b"], [[0.4]])
    two_envs = stats.score_matrices(runs[:3], lambda r, score: score)
    np.testing.assert_allclose(two_envs.scores["a"], [[1.0, 3.0]])  # R = 1: E2 has one seed
    assert two_envs.dropped == {"a": 1}


def test_sample_efficiency_is_the_iqm_at_each_step() -> None:
    runs = [run("a", "E", seed, 1.0, [0, 100], [0.0, 1.0 + seed]) for seed in range(4)]
    grid, curves = stats.normalized_curves(runs, ["E"], lambda r, value: value, points=3)
    np.testing.assert_allclose(grid, [0, 50, 100])
    assert curves["a"].shape == (4, 1, 3)
    points, cis = stats.sample_efficiency(curves)
    # At step 100 the runs score 1, 2, 3, 4: the IQM keeps 2 and 3 → 2.5; at step 50, half of that.
    np.testing.assert_allclose(points["a"], [0.0, 1.25, 2.5])
    assert np.all(cis["a"][0] <= points["a"] + 1e-12) and np.all(points["a"] <= cis["a"][1] + 1e-12)


def test_sample_efficiency_spans_every_algos_steps_and_each_line_only_its_own() -> None:
    runs = [run("short", "E", seed, 1.0, [0, 100], [0.0, 1.0]) for seed in range(2)]  # evaluated at 0 and 100
    runs += [run("long", "E", seed, 1.0, [100, 500], [1.0, 5.0]) for seed in range(2)]  # first evaluated at 100
    grid, curves = stats.normalized_curves(runs, ["E"], lambda r, value: value, points=3)
    np.testing.assert_allclose(grid, [0, 100, 250, 500])  # three even steps over 0…500, and each algo's ends
    np.testing.assert_allclose(curves["short"][1, 0], [0.0, 1.0, np.nan, np.nan])
    np.testing.assert_allclose(curves["long"][0, 0], [np.nan, 1.0, 2.5, 5.0])
    points, cis = stats.sample_efficiency(curves)
    np.testing.assert_allclose(points["long"], [np.nan, 1.0, 2.5, 5.0])
    np.testing.assert_allclose(points["short"], [0.0, 1.0, np.nan, np.nan])
    assert cis["short"].shape == (2, 4) and np.isnan(cis["short"][:, 2:]).all()
    np.testing.assert_allclose(cis["short"][:, :2], [[0.0, 1.0], [0.0, 1.0]])  # two equal runs: no spread


def test_the_interval_plot_leaves_room_around_every_bar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    limits: list[tuple[float, float]] = []
    savefig = Figure.savefig

    def record(self: Figure, *args: Any, **kwargs: Any) -> None:
        limits.append(self.axes[0].get_xlim())
        savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    intervals = {"a": {"IQM": stats.Interval(1.4, 1.2, 2.6)}, "b": {"IQM": stats.Interval(0.1, -0.3, 0.2)}}
    plot_aggregates(intervals, ["IQM"], tmp_path / "i.png")
    low, high = limits[0]
    assert low < -0.3 and high > 2.6
