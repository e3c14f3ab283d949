"""Tests for lab/results.py, lab/plot.py, lab/report.py, lab/normalized.py and lab/published.py, on run
directories written by hand.

No training: each run directory is fabricated with known numbers (config.yaml, summary.json,
progress.csv), so every figure in a report can be checked against a hand computation.
"""

from __future__ import annotations

import csv
import html as html_text
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from matplotlib.figure import Figure
from PIL import Image

from envs.errors import BadInput
from lab import plot
from lab.cost import machine_text, wall_clock_text
from lab.normalized import left_out_pairs, load_reference_scores, reference_for
from lab.plot import mean_curve, plot_runs
from lab.published import best_point, load_published, published_section
from lab.report import build_report
from lab.results import find_runs
from lab.stats import bootstrap_ci, difference_ci, iqm, score_matrices

COLUMNS = ["global_step", "wall_time_s", "charts/episodic_return", "eval/return_mean", "eval/return_std"]
CONVENTION = "deterministic policy, one episode per fixed seed 1000000+i, raw env return"


def make_run(
    run_dir: Path,
    env_id: str,
    algo: str,
    seed: int,
    evals: list[tuple[int, float, float]],
    status: str | None = "completed",
    final: float | None = None,
    error: str | None = None,
    sps: float = 1000.0,
) -> Path:
    """A run directory as ``testbed train`` leaves it; ``evals`` holds (step, wall_time_s, return).

    Between evaluations sits a row without one (empty eval cells), as in real progress.csv files.
    ``status=None`` leaves out summary.json: a run still running.
    """
    run_dir.mkdir(parents=True)
    total_steps = evals[-1][0] if evals else 0
    config = {"algo": algo, "env_id": env_id, "seed": seed, "total_steps": total_steps, "eval_episodes": 10}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    with open(run_dir / "progress.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for step, time_s, ret in evals:
            writer.writerow([step - 1, time_s - 0.01, 9.0, "", ""])
            writer.writerow([step, time_s, 10.0, ret, 1.0])
    if status is not None:
        if status == "completed" and final is None:
            final = evals[-1][2]
        summary: dict[str, Any] = {
            "algo": algo,
            "env_id": env_id,
            "seed": seed,
            "status": status,
            "total_steps": total_steps,
            "wall_time_s": evals[-1][1] if evals else 0.0,
            "sps": sps,
            "final_eval_return_mean": final if status == "completed" else None,
            "final_eval_return_std": 0.0 if status == "completed" else None,
            "final_eval_episodes": 10 if status == "completed" else 0,
            "eval_convention": CONVENTION,
            "error": error,
        }
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def linear_evals(n: int, every: int = 1024, start: float = 20.0, slope: float = 50.0) -> list[tuple[int, float, float]]:
    """n evaluations every ``every`` steps, one second apart, with returns rising by ``slope`` each."""
    return [(every * (i + 1), float(i + 1), start + slope * i) for i in range(n)]


# ── results: finding and reading runs ────────────────────────────────────────────────────────────


def test_find_runs_reads_a_single_run_dir(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "one", "CartPole-v1", "ppo", 3, [(100, 1.0, 20.0), (200, 2.0, 40.0)], final=41.0)
    [run] = find_runs([run_dir])
    assert (run.algo, run.env_id, run.seed, run.status) == ("ppo", "CartPole-v1", 3, "completed")
    # Only the rows with an evaluation: the rows between them have empty eval cells.
    np.testing.assert_array_equal(run.steps, [100, 200])
    np.testing.assert_array_equal(run.wall_time_s, [1.0, 2.0])
    np.testing.assert_array_equal(run.eval_return, [20.0, 40.0])
    assert run.final_return == 41.0
    assert run.summary["sps"] == 1000.0


def test_find_runs_walks_a_bench_and_takes_env_ids_from_config(tmp_path: Path) -> None:
    bench = tmp_path / "bench"
    # An env id with '/' sits in a path with '_': the id must come from config.yaml.
    make_run(bench / "MyNS_Toy-v0" / "ppo" / "seed1", "MyNS/Toy-v0", "ppo", 1, linear_evals(2))
    make_run(bench / "MyNS_Toy-v0" / "ppo" / "seed0", "MyNS/Toy-v0", "ppo", 0, linear_evals(2))
    make_run(bench / "CartPole-v1" / "grpo" / "seed0", "CartPole-v1", "grpo", 0, linear_evals(2))
    make_run(bench / "CartPole-v1" / "ppo" / "seed0", "CartPole-v1", "ppo", 0, linear_evals(3), status=None)
    runs = find_runs([bench])
    assert [(r.env_id, r.algo, r.seed) for r in runs] == [
        ("CartPole-v1", "grpo", 0),
        ("CartPole-v1", "ppo", 0),
        ("MyNS/Toy-v0", "ppo", 0),
        ("MyNS/Toy-v0", "ppo", 1),
    ]
    running = runs[1]
    assert (running.status, running.summary, running.final_return) == ("running", {}, None)
    assert running.steps.size == 3 and running.last_step == 3072


def test_find_runs_on_a_mix_reads_each_run_once(tmp_path: Path) -> None:
    cell = make_run(tmp_path / "b1" / "CartPole-v1" / "ppo" / "seed0", "CartPole-v1", "ppo", 0, linear_evals(2))
    make_run(tmp_path / "b1" / "CartPole-v1" / "ppo" / "seed1", "CartPole-v1", "ppo", 1, linear_evals(2))
    single = make_run(tmp_path / "elsewhere" / "run", "Acrobot-v1", "grpo", 7, linear_evals(2))
    runs = find_runs([tmp_path / "b1", single, cell])
    assert [(r.env_id, r.seed) for r in runs] == [("Acrobot-v1", 7), ("CartPole-v1", 0), ("CartPole-v1", 1)]


def test_find_runs_refuses_missing_paths_and_dirs_without_runs(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="does not exist"):
        find_runs([tmp_path / "nope"])
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(BadInput, match=r"config\.yaml"):
        find_runs([tmp_path / "empty"])


# ── statistics ───────────────────────────────────────────────────────────────────────────────────


def test_iqm_is_the_mean_of_the_middle_half() -> None:
    # Sorted: 1 2 | 3 4 5 6 | 7 100: the outlier is trimmed away with the lowest and highest quarter.
    assert iqm(np.array([1, 2, 3, 4, 100, 5, 6, 7])) == pytest.approx(4.5)
    assert iqm(np.array([2.0, 8.0])) == pytest.approx(5.0)


def test_the_difference_of_two_groups_means_and_its_interval() -> None:
    # No spread: Δ = 3 − 1 exactly, and the interval is that point.
    assert difference_ci(np.array([1.0, 1.0, 1.0]), np.array([3.0, 3.0])) == (2.0, 2.0, 2.0)
    # y's seeds 10 and 20 against x's 0 and 0: the resampled means of y are 10, 15 or 20 (probabilities ¼, ½, ¼),
    # so Δ* takes those values and the 95% percentile interval is [10, 20] around Δ = 15.
    delta, low, high = difference_ci(np.array([0.0, 0.0]), np.array([10.0, 20.0]))
    assert (delta, low, high) == (15.0, 10.0, 20.0)
    x, y = np.array([1.0, 4.0, 2.0, 8.0]), np.array([5.0, 7.0, 6.0, 9.0])
    assert difference_ci(x, y) == difference_ci(x, y)  # its own generator: the same interval
    delta, low, high = difference_ci(x, y)
    # Δ* lies between the smallest y* mean less the largest x* mean (5 − 8) and the reverse (9 − 1).
    assert delta == 3.0 and -3.0 <= low < 3.0 < high <= 8.0


def test_bootstrap_ci_brackets_the_statistic_and_is_deterministic() -> None:
    values = np.array([1.0, 2.0, 3.0, 4.0, 10.0])
    low, high = bootstrap_ci(values)
    assert low < values.mean() < high
    assert low >= values.min() and high <= values.max()
    assert bootstrap_ci(values) == (low, high)
    assert bootstrap_ci(values, seed=1) != (low, high)
    low_iqm, high_iqm = bootstrap_ci(values, iqm)
    assert low_iqm <= iqm(values) <= high_iqm


def test_bootstrap_ci_special_cases() -> None:
    assert bootstrap_ci(np.array([7.5])) == (7.5, 7.5)
    assert bootstrap_ci(np.array([3.0, 3.0, 3.0])) == (3.0, 3.0)
    # Two values: resampled means are 480, 490 or 500, with P(480) = P(500) = 1/4 > 2.5%.
    assert bootstrap_ci(np.array([480.0, 500.0])) == (480.0, 500.0)
    with pytest.raises(BadInput):
        bootstrap_ci(np.array([]))


# ── plots ────────────────────────────────────────────────────────────────────────────────────────


def test_mean_curve_averages_only_the_runs_covering_each_point(tmp_path: Path) -> None:
    make_run(tmp_path / "a", "CartPole-v1", "ppo", 0, [(100, 1.0, 0.0), (200, 2.0, 10.0), (300, 3.0, 20.0)])
    make_run(tmp_path / "b", "CartPole-v1", "ppo", 1, [(150, 1.0, 10.0), (250, 2.0, 30.0)])
    curve = mean_curve(find_runs([tmp_path]), "steps")
    assert curve is not None and curve.n_runs == 2
    np.testing.assert_array_equal(curve.x, [100, 150, 200, 250, 300])
    # a interpolates to 5 at 150 and 15 at 250; b covers only 150..250, interpolating to 20 at 200.
    np.testing.assert_allclose(curve.mean, [0.0, 7.5, 15.0, 22.5, 20.0])
    assert np.isnan(curve.low[[0, 4]]).all() and np.isfinite(curve.low[1:4]).all()
    assert (curve.low[1:4] <= curve.mean[1:4]).all() and (curve.mean[1:4] <= curve.high[1:4]).all()


def _check_images(paths: list[Path]) -> None:
    assert [p.suffix for p in paths] == [".png"]
    with Image.open(paths[0]) as image:
        assert image.format == "PNG" and image.mode == "P"  # a palette of at most 256 colours


def test_plot_runs_one_run_with_the_default_output(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "r", "CartPole-v1", "ppo", 0, linear_evals(4))
    paths = plot_runs([run_dir])
    assert paths == [run_dir / "plots" / "curves-steps.png"]
    _check_images(paths)


def test_plot_runs_of_different_lengths_and_benches(tmp_path: Path) -> None:
    for seed, n in enumerate((3, 5, 8)):  # different last global_step
        make_run(tmp_path / "b1" / f"seed{seed}", "CartPole-v1", "ppo", seed, linear_evals(n))
    make_run(tmp_path / "b2" / "grpo" / "seed0", "CartPole-v1", "grpo", 0, linear_evals(6, every=2048))
    make_run(tmp_path / "b2" / "grpo-lunar" / "seed0", "LunarLander-v3", "grpo", 0, linear_evals(1))
    _check_images(plot_runs([tmp_path / "b1"], out=tmp_path / "three.png"))
    _check_images(plot_runs([tmp_path / "b1", tmp_path / "b2"], out=tmp_path / "two-benches.png"))
    paths = plot_runs([tmp_path / "b1", tmp_path / "b2"], x="time", out=tmp_path / "out" / "time.png")
    assert paths == [tmp_path / "out" / "time.png"]
    _check_images(paths)


# ── report ───────────────────────────────────────────────────────────────────────────────────────


@pytest.fixture
def bench(tmp_path: Path) -> Path:
    """CartPole-v1: ppo reaches 475 at step 2048 (seed 0) and 3072 (seed 1); grpo never does; one grpo run fails."""
    bench = tmp_path / "bench" / "demo"
    cell = bench / "CartPole-v1"
    ppo0 = [(1024, 1.0, 100.0), (2048, 2.0, 480.0), (3072, 3.0, 470.0), (4096, 4.0, 500.0)]
    ppo1 = [(1024, 1.5, 100.0), (2048, 2.5, 300.0), (3072, 3.5, 475.0), (4096, 4.5, 490.0)]
    make_run(cell / "ppo" / "seed0", "CartPole-v1", "ppo", 0, ppo0, final=500.0, sps=2000.0)
    make_run(cell / "ppo" / "seed1", "CartPole-v1", "ppo", 1, ppo1, final=480.0, sps=1000.0)
    make_run(cell / "grpo" / "seed0", "CartPole-v1", "grpo", 0, linear_evals(4, slope=10), final=200.0)
    make_run(cell / "grpo" / "seed1", "CartPole-v1", "grpo", 1, linear_evals(4, slope=10), final=300.0)
    make_run(
        cell / "grpo" / "seed2",
        "CartPole-v1",
        "grpo",
        2,
        linear_evals(2),
        status="failed",
        error="non-finite values in losses/policy_loss; training stopped",
    )
    return bench


def _table_row(markdown: str, section: str, first_cell: str) -> list[str]:
    """The cells of the row starting with ``first_cell`` in the first table of section ``## section``."""
    text = markdown.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    line = next(line for line in text.splitlines() if line.startswith(f"| {first_cell} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_build_report_writes_every_part(bench: Path) -> None:
    written = build_report(bench)
    assert written["summary"] == bench / "summary.csv"

    with open(written["summary"], newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == [
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
    ]
    assert len(rows) == 5
    assert [(r["algo"], r["seed"], r["status"]) for r in rows] == [
        ("grpo", "0", "completed"),
        ("grpo", "1", "completed"),
        ("grpo", "2", "failed"),
        ("ppo", "0", "completed"),
        ("ppo", "1", "completed"),
    ]
    assert rows[3]["run_dir"] == "CartPole-v1/ppo/seed0"
    assert rows[2]["final_eval_return_mean"] == ""

    markdown = written["markdown"].read_text()
    # ppo: mean and IQM of 500 and 480 are 490; the bootstrap CI is [480, 500] (see the two-value case).
    # Threshold 475 first reached at 2048 (2.0 s) and 3072 (3.5 s): medians 2560 steps and 2.75 s.
    # steps/s: mean of 2000 and 1000. Each run had its own process: core time is wall-clock.
    # Equal time: grpo's completed runs end at 4.0 s, ppo's at 4.0 and 4.5 s (median 4.25): 4.0 s. By then
    # ppo seed 0 logged 500 (at 4.0 s) and seed 1 475 (at 3.5 s): 487.5; grpo 50 and 50 (20 + 3 · 10).
    # Two seeds' CI is marked: a bootstrap of two values spans them.
    assert _table_row(markdown, "CartPole-v1", "ppo") == [
        "ppo",
        "2/2",
        "490.00",
        "[480.00, 500.00] †",
        "490.00",
        "2,560",
        "2.8 s",
        "2/2",
        "1,500",
        "487.50",
    ]
    assert "† CI from 2 seeds, fewer than 3" in markdown
    assert "Equal core time: 4.0 s, the median run time of grpo, whose runs ended soonest" in markdown
    assert "Every run had its own process." in markdown
    # grpo: 2 of 3 seeds completed, mean 250; its curves top out at 50, far below the threshold.
    grpo = _table_row(markdown, "CartPole-v1", "grpo")
    assert grpo[:3] == ["grpo", "2/3", "250.00"] and grpo[4] == "250.00"
    assert grpo[5:8] == ["—", "—", "0/3"] and grpo[9] == "50.00"
    assert "Threshold: 475" in markdown
    assert "non-finite values in losses/policy_loss; training stopped" in markdown
    assert "10 episodes per evaluation" in markdown and "1000000+i" in markdown

    # Normalized with CartPole's reference (random 22.15, target 475), by hand: (500 − 22.15) / 452.85 = 1.0552 and
    # (480 − 22.15) / 452.85 = 1.0110; the IQM over 2 runs is their mean, 1.0331.
    assert _table_row(markdown, "Normalized scores across envs", "ppo")[1].startswith("1.033 [")
    assert "Runs per env: grpo 2, ppo 2." in markdown
    assert "| ppo | grpo | " in markdown and "| grpo | ppo | " in markdown  # P(X > Y), both ways

    html = written["html"].read_text()
    # The env's two curves; the aggregates, the performance profiles and the sample-efficiency curves.
    assert html.count("data:image/png;base64,") == 5
    assert "<table>" in html and 'src="plots/' not in html
    for name in (
        "CartPole-v1-steps",
        "CartPole-v1-time",
        "normalized-scores",
        "performance-profiles",
        "sample-efficiency",
    ):
        path = bench / "plots" / f"{name}.png"
        assert written[f"plots/{name}.png"] == path and path.stat().st_size > 0
        assert f"plots/{name}.svg" not in written and not path.with_suffix(".svg").exists()  # one format
        assert f"](plots/{name}.png)" in markdown
    # No absolute path leaks into the outputs.
    for key in ("summary", "markdown", "html"):
        assert str(bench.parent) not in written[key].read_text()


def test_every_plot_has_a_title_and_a_caption_and_its_axes_cover_every_algos_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures: dict[str, Figure] = {}
    save = plot.save_figure

    def keep(fig: Figure, out: Path) -> list[Path]:
        figures[out.stem] = fig
        return save(fig, out)

    monkeypatch.setattr(plot, "save_figure", keep)
    # ppo evaluates every 10k steps up to 100k, grpo every 50k up to 500k.
    bench = tmp_path / "b"
    for seed in (0, 1):
        make_run(
            bench / "CartPole-v1" / "ppo" / f"seed{seed}",
            "CartPole-v1",
            "ppo",
            seed,
            linear_evals(10, every=10_000, start=100.0, slope=30.0 + seed),
        )
        make_run(
            bench / "CartPole-v1" / "grpo" / f"seed{seed}",
            "CartPole-v1",
            "grpo",
            seed,
            linear_evals(10, every=50_000, start=50.0, slope=40.0 + seed),
        )
    written = build_report(bench)
    assert sorted(figures) == [
        "CartPole-v1-steps",
        "CartPole-v1-time",
        "normalized-scores",
        "performance-profiles",
        "sample-efficiency",
    ]
    for name, fig in figures.items():
        assert fig.get_suptitle() or all(ax.get_title() for ax in fig.axes if ax.get_visible()), name

    # The x-axis runs to grpo's 500k; ppo's line ends at its own last evaluation, 100k.
    (efficiency,) = figures["sample-efficiency"].axes
    assert efficiency.get_title() == "Sample efficiency" and efficiency.get_xlim()[1] >= 500_000
    ends = {line.get_label(): line.get_xdata()[np.isfinite(line.get_ydata())].max() for line in efficiency.get_lines()}
    assert ends == {"grpo": 500_000, "ppo": 100_000}
    assert figures["performance-profiles"].axes[0].get_title() == "Performance profiles"

    # The four interval panels side by side in one row, each naming the algos of its rows.
    intervals = figures["normalized-scores"]
    assert intervals.get_suptitle() == "Aggregate normalized scores"
    assert [ax.get_title() for ax in intervals.axes] == ["IQM", "median", "mean", "optimality gap"]
    for ax in intervals.axes:
        assert ax.get_subplotspec().rowspan.start == 0
        assert [label.get_text() for label in ax.get_yticklabels()] == ["ppo", "grpo"]  # bottom to top

    markdown, html = written["markdown"].read_text(), written["html"].read_text()
    runs = "runs: grpo 2 (2 per env × 1 env), ppo 2 (2 per env × 1 env)."
    captions = [
        "*CartPole-v1: evaluation return (deterministic policy, raw env return) against env steps; line: mean over "
        "runs, band: 95% percentile bootstrap CI over runs, where at least two cover the point; runs: grpo 2, ppo 2.*",
        "*Aggregate normalized scores: IQM, median, mean and optimality gap (lower is better) of the normalized final "
        f"scores; tick: point estimate, bar: 95% stratified bootstrap CI (2000 resamples); {runs}*",
        "*Performance profiles: the fraction of runs whose normalized final score exceeds τ, per algo; band: 95% "
        f"stratified bootstrap CI (2000 resamples); {runs}*",
        "*Sample efficiency: the IQM over runs and envs of the normalized evaluation return at each env step; band: "
        "95% stratified bootstrap CI (2000 resamples). The axis runs to the longest run's last step; each algo's line "
        f"covers the steps all of its runs reached, ending at grpo 500,000, ppo 100,000 steps; {runs}*",
    ]
    for caption in captions:
        assert f".png)\n\n{caption}\n" in markdown
        assert f"<figcaption>{html_text.escape(caption.strip('*'))}</figcaption></figure>" in html
    assert markdown.count("](plots/") == html.count("<figcaption>") == 5


def test_the_report_counts_a_stack_of_seeds_as_one_process_in_its_core_hours(bench: Path) -> None:
    # PPO's seeds 0 and 1 trained side by side (4.0 s and 4.5 s: one process of 4.5 s); GRPO's three alone
    # (4.0 s, 4.0 s and a failed 2.0 s). 4.5 + 4.0 + 4.0 + 2.0 = 14.5 s.
    for seed in (0, 1):
        meta = {"command": ["lab", "train", "--algo", "ppo", "--seeds", "0,1", "--run-dir", "x"]}
        (bench / "CartPole-v1" / "ppo" / f"seed{seed}" / "meta.json").write_text(json.dumps(meta))
    markdown = build_report(bench)["markdown"].read_text()
    steps = 2 * 4096 + 2 * 4096 + 2048
    assert (
        f"- Compute: {steps:,} env steps in 0.00403 core-hours: the wall time of 4 trainer processes of one thread "
        "each, up to 2 seeds side by side in one"
    ) in markdown


def test_a_stacked_run_s_speed_and_times_are_its_share_of_the_process(bench: Path) -> None:
    # PPO's seeds 0 and 1 trained side by side: each had half of its process. Steps per core-second: 2 × the
    # mean of 2000 and 1000 = 3000. Threshold at 2.0 s and 3.5 s of wall-clock: 1.0 s and 1.75 s of core time,
    # median 1.375 s. Equal time: ppo's runs end at 2.0 and 2.25 s of core time (median 2.125), before grpo's
    # 4.0 s; by then ppo logged 500 (2.0 s) and 475 (1.75 s), grpo 20 + 10 = 30 (at 2.0 s).
    for seed in (0, 1):
        meta = {"command": ["lab", "train", "--algo", "ppo", "--seeds", "0,1", "--run-dir", "x"]}
        (bench / "CartPole-v1" / "ppo" / f"seed{seed}" / "meta.json").write_text(json.dumps(meta))
    markdown = build_report(bench)["markdown"].read_text()
    assert _table_row(markdown, "CartPole-v1", "ppo")[5:] == ["2,560", "1.4 s", "2/2", "3,000", "487.50"]
    assert _table_row(markdown, "CartPole-v1", "grpo")[8:] == ["1,000", "30.00"]
    assert "Equal core time: 2.1 s, the median run time of ppo" in markdown
    assert "Seeds per process: ppo 2 seeds; the others one." in markdown
    assert (
        "| algo | seeds completed | final return (mean) | 95% CI | IQM | steps to threshold (median) | core time to"
        in markdown
    )


def test_a_ci_from_three_seeds_or_more_is_not_marked(tmp_path: Path) -> None:
    for seed in range(3):
        make_run(tmp_path / "b" / "CartPole-v1" / "ppo" / f"seed{seed}", "CartPole-v1", "ppo", seed, linear_evals(2))
    markdown = build_report(tmp_path / "b")["markdown"].read_text()
    assert "†" not in _table_row(markdown, "CartPole-v1", "ppo")[3] and "CI from" not in markdown


def test_a_stack_started_with_a_seed_count_is_one_process(bench: Path) -> None:
    # `testbed train --seeds 2 --seed 0` trains seeds 0 and 1 in one process, as --seeds 0,1 does.
    for seed in (0, 1):
        meta = {"command": ["lab", "train", "--algo", "grpo", "--seeds", "2", "--seed", "0", "--run-dir", "x"]}
        (bench / "CartPole-v1" / "grpo" / f"seed{seed}" / "meta.json").write_text(json.dumps(meta))
    markdown = build_report(bench)["markdown"].read_text()
    # ppo 0 and 1 alone (4.0 s, 4.5 s), grpo 0 and 1 together (4.0 s), grpo 2 alone (2.0 s): 14.5 s in 4.
    assert "in 0.00403 core-hours: the wall time of 4 trainer processes of one thread each, up to 2 seeds" in markdown


def test_build_report_is_idempotent(bench: Path) -> None:
    first = build_report(bench)
    texts = {key: first[key].read_text() for key in ("summary", "markdown", "html")}
    png = (bench / "plots" / "CartPole-v1-steps.png").read_bytes()
    second = build_report(bench)
    assert second == first
    assert {key: second[key].read_text() for key in texts} == texts
    assert (bench / "plots" / "CartPole-v1-steps.png").read_bytes() == png


def test_build_report_leaves_out_envs_without_references(tmp_path: Path) -> None:
    bench = tmp_path / "b"
    make_run(bench / "MyNS_Toy-v0" / "ppo" / "seed0", "MyNS/Toy-v0", "ppo", 0, linear_evals(3))
    make_run(bench / "MyNS_Toy-v0" / "ppo" / "seed1", "MyNS/Toy-v0", "ppo", 1, linear_evals(2), status=None)
    written = build_report(bench)
    markdown = written["markdown"].read_text()
    assert "Left out (no reference scores in `lab/reference_scores.yaml`): MyNS/Toy-v0." in markdown
    assert "nothing to aggregate" in markdown
    assert "Threshold: none" in markdown
    # One algo: equal core time is its own run time (3.0 s), where its one completed run logged 120.
    assert _table_row(markdown, "MyNS/Toy-v0", "ppo") == [
        "ppo",
        "1/2",
        "120.00",
        "[120.00, 120.00] †",
        "120.00",
        "—",
        "—",
        "—",
        "1,000",
        "120.00",
    ]
    assert "no summary.json yet" in markdown
    assert (bench / "plots" / "MyNS_Toy-v0-steps.png").stat().st_size > 0
    assert "plots/normalized-scores.png" not in written
    # The running run reports its progress so far in summary.csv.
    with open(written["summary"], newline="") as f:
        running = list(csv.DictReader(f))[1]
    assert (running["status"], running["total_steps"], running["sps"]) == ("running", "2048", "")


def test_env_kwargs_that_only_choose_the_observation_keep_the_reference_scores(tmp_path: Path) -> None:
    # Ant's presets leave out the contact forces: the reward is the same, so the suite's aggregate counts it.
    for env_id, kwargs in (
        ("Ant-v5", {"include_cfrc_ext_in_observation": False}),
        ("Hopper-v5", {"healthy_reward": 0}),
    ):
        run_dir = make_run(tmp_path / env_id, env_id, "ppo", 0, linear_evals(2))
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        (run_dir / "config.yaml").write_text(yaml.safe_dump({**config, "env_kwargs": kwargs}))
    refs = load_reference_scores()
    found = {run.env_id: reference_for(run, refs) for run in find_runs([tmp_path])}
    assert found == {
        "Ant-v5[include_cfrc_ext_in_observation=False]": refs["Ant-v5"],
        "Hopper-v5[healthy_reward=0]": None,  # another reward: another scale
    }


def test_build_report_refuses_a_dir_without_runs(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    with pytest.raises(BadInput, match="no run found"):
        build_report(tmp_path / "b")


def test_reference_scores_cover_the_envs_we_benchmark() -> None:
    refs = load_reference_scores()
    benchmarked = (
        "CartPole-v1",
        "Acrobot-v1",
        "MountainCar-v0",
        "LunarLander-v3",
        "Pendulum-v1",
        "HalfCheetah-v5",
        "Hopper-v5",
        "Walker2d-v5",
        "Ant-v5",
        "Humanoid-v5",
        "Swimmer-v5",
        "InvertedPendulum-v5",
    )
    for env_id in benchmarked:
        assert math.isfinite(refs[env_id].random) and refs[env_id].target > refs[env_id].random
    assert refs["CartPole-v1"].target == 475.0 and refs["Acrobot-v1"].target == -100.0


# ── published figures: each algo scored as the figure's source scores a run ─────────────────


def test_best_point_is_the_top_of_the_mean_curve_on_the_steps_every_run_reached(tmp_path: Path) -> None:
    make_run(tmp_path / "a", "Hopper-v5", "ppo", 0, [(1024, 1.0, 10.0), (2048, 2.0, 50.0), (3072, 3.0, 20.0)])
    make_run(
        tmp_path / "b",
        "Hopper-v5",
        "ppo",
        1,
        [(1024, 1.0, 10.0), (2048, 2.0, 30.0), (3072, 3.0, 50.0), (4096, 4.0, 100.0)],
    )
    # Means: 10, 40, 35 on the steps both reached; 4096, which only b reached, is left out.
    assert best_point(find_runs([tmp_path])) == (40.0, 2048.0)


def test_the_report_scores_each_algo_by_the_measure_of_the_published_figure(tmp_path: Path) -> None:
    bench = tmp_path / "b"
    # HalfCheetah-v5's figure is the zoo's final return, 5819.1; Hopper-v5's Tianshou's best point, 2609.3.
    make_run(bench / "hc-ppo-0", "HalfCheetah-v5", "ppo", 0, linear_evals(3), final=6000.0)
    make_run(bench / "hc-ppo-1", "HalfCheetah-v5", "ppo", 1, linear_evals(3), final=5000.0)
    make_run(bench / "hc-grpo-0", "HalfCheetah-v5", "grpo", 0, linear_evals(3), final=6000.0)
    make_run(bench / "hc-grpo-1", "HalfCheetah-v5", "grpo", 1, linear_evals(2), status=None)
    for seed, returns in enumerate(((2000.0, 3000.0, 1000.0), (2000.0, 2400.0, 500.0))):
        make_run(
            bench / f"hop-ppo-{seed}",
            "Hopper-v5",
            "ppo",
            seed,
            [(1024 * (i + 1), float(i + 1), ret) for i, ret in enumerate(returns)],
        )
    make_run(bench / "cp-ppo-0", "CartPole-v1", "ppo", 0, linear_evals(2))
    blocks = published_section(find_runs([bench]), load_published())
    table = next(b for b in blocks if hasattr(b, "rows"))
    rows = {row[0]: row for row in table.rows if row[0] != "Hopper-v5"}
    assert table.header[3:] == ["grpo", "ppo"] and {row[0] for row in table.rows} == {"HalfCheetah-v5", "Hopper-v5"}
    low, high = bootstrap_ci(np.array([6000.0, 5000.0]))
    assert rows["HalfCheetah-v5"][1:3] == [
        "5819.1 ± 663.5",
        "final return, mean over seeds; RL Baselines3 Zoo benchmark.md, HalfCheetah-v3, one agent",
    ]
    assert rows["HalfCheetah-v5"][4] == f"5500.00 [{low:.2f}, {high:.2f}]: below by 319.10"
    assert rows["HalfCheetah-v5"][3] == "6000.00 [6000.00, 6000.00]: at or above (1 of 2 seeds)"
    # Hopper has two figures. Tianshou's best point, 2609.3: the mean curve is 2000, 2700, 750, so 2700 at 2048
    # steps is above it. The zoo's final return, 2410.4: the final evaluations 1000 and 500 are below it.
    hopper = [row for row in table.rows if row[0] == "Hopper-v5"]
    assert [row[1] for row in hopper] == ["2609.3 ± 700.8", "2410.4"]
    assert [row[3:] for row in hopper] == [
        ["—", "2700.00 at 2,048 steps: at or above"],
        ["—", "750.00 [500.00, 1000.00]: below by 1660.40"],
    ]
    assert blocks[-1].text == (
        "grpo at or above 1 of 1 figures; ppo at or above 1 of 3 figures (below: HalfCheetah-v5 (final), Hopper-v5 "
        "(final))."
    )
    assert "## Against the published PPO figures" in build_report(bench)["markdown"].read_text()


def test_published_figures_refuse_malformed_entries(tmp_path: Path) -> None:
    path = tmp_path / "published.yaml"
    for text, why in (
        ("Hopper-v5: {score: 1}", "needs a list of figures"),
        ("Hopper-v5: [{score: 1, source: s}]", "needs a numeric 'score', a 'measure'"),
        ("Hopper-v5: [{score: 1, measure: best, source: s}]", "choose one of final, best_point"),
        ("Hopper-v5: [{score: null}]", "or a 'note' saying why"),
    ):
        path.write_text(text)
        with pytest.raises(BadInput, match=why):
            load_published(path)
    path.write_text(
        "Hopper-v5: [{score: null, note: none yet}]\nSwimmer-v5: [{score: 2, measure: final, source: s}, {score: 3, "
        "measure: best_point, source: t}]"
    )
    read = {env: [(f.score, f.measure, f.source) for f in figures] for env, figures in load_published(path).items()}
    assert read == {
        "Hopper-v5": [(None, None, "none yet")],
        "Swimmer-v5": [(2.0, "final", "s"), (3.0, "best_point", "t")],
    }


def test_the_wall_clock_sums_the_invocations_that_ended(tmp_path: Path) -> None:
    early = make_run(tmp_path / "a", "CartPole-v1", "ppo", 0, linear_evals(2))
    make_run(tmp_path / "b", "CartPole-v1", "ppo", 1, linear_evals(2))  # no meta.json: not placed in time
    (early / "meta.json").write_text(json.dumps({"start_time": "2026-12-01T09:00:00+0000"}))
    assert wall_clock_text(tmp_path, find_runs([tmp_path])) is None  # no bench.yaml: nothing recorded
    (tmp_path / "bench.yaml").write_text(
        yaml.safe_dump(
            {
                "invocations": [
                    {"start": "2026-12-01T10:00:00+0000", "end": "2026-12-01T11:30:00+0000", "workers": 2},
                    {"start": "2026-12-02T12:00:00+0000", "end": None, "workers": 1},  # killed outright
                    {"start": "2026-12-02T13:00:00+0000", "end": "2026-12-02T13:30:00+0000", "workers": 1},
                ]
            }
        )
    )
    assert wall_clock_text(tmp_path, find_runs([tmp_path])) == (
        "Wall-clock: 2 h in 2 invocations of `testbed bench`, and 1 invocation killed outright (no end), not counted; "
        "1 run started before the first invocation recorded here (2026-12-01 10:00 UTC): adopted from another bench, "
        "or trained before invocations were recorded, not counted"
    )
    # Runs between invocations were trained by a cell's own command; one after a killed invocation belongs to it.
    for name, seed, start in (("c", 2, "2026-12-01T12:00:00+0000"), ("d", 3, "2026-12-02T12:30:00+0000")):
        run = make_run(tmp_path / name, "CartPole-v1", "ppo", seed, linear_evals(2))
        (run / "meta.json").write_text(json.dumps({"start_time": start}))
    assert wall_clock_text(tmp_path, find_runs([tmp_path])).endswith(
        "; 1 run trained outside every invocation, by a cell's own `testbed train` command: in the core-hours, not in "
        "this wall-clock"
    )


def test_the_report_names_the_cpus_and_versions_the_runs_trained_under(tmp_path: Path) -> None:
    def meta(cpu: str | None, mujoco: str) -> str:
        return json.dumps(
            {"python": "3.11.7", "packages": {"torch": "2.13.0", "mujoco": mujoco}, **({"cpu": cpu} if cpu else {})}
        )

    first = make_run(tmp_path / "a", "Hopper-v5", "ppo", 0, linear_evals(2))
    second = make_run(tmp_path / "b", "Hopper-v5", "ppo", 1, linear_evals(2))
    make_run(tmp_path / "c", "Hopper-v5", "ppo", 2, linear_evals(2))  # no meta file: not counted
    (first / "meta.json").write_text(meta(None, "4.0.0"))  # written before the CPU was recorded
    (second / "meta.json").write_text(meta(None, "4.0.0"))
    assert machine_text(find_runs([tmp_path])) == "Machine and software: python 3.11.7; torch 2.13.0; mujoco 4.0.0"
    (second / "meta.resume1796000000.json").write_text(meta("Xeon", "4.0.1"))  # resumed on another machine
    assert machine_text(find_runs([tmp_path])) == (
        "Machine and software: cpu Xeon (1 run), not recorded (2 runs); python 3.11.7; torch 2.13.0; mujoco 4.0.0 (2 "
        "runs), 4.0.1 (1 run) (a run resumed under another counts under both; where the CPU model or the physics "
        "engine's version differs, runs of the same seed and settings differ too)"
    )


def test_a_report_over_several_envs_gives_the_probability_of_improvement_on_each(tmp_path: Path) -> None:
    # ppo beats grpo in every pairing on CartPole (500, 480 against 100, 90) and loses every one on Acrobot.
    finals = {
        ("CartPole-v1", "ppo"): (500.0, 480.0),
        ("CartPole-v1", "grpo"): (100.0, 90.0),
        ("Acrobot-v1", "ppo"): (-400.0, -380.0),
        ("Acrobot-v1", "grpo"): (-90.0, -100.0),
    }
    for (env_id, algo), values in finals.items():
        for seed, final in enumerate(values):
            make_run(tmp_path / env_id / algo / f"seed{seed}", env_id, algo, seed, linear_evals(2), final=final)
    markdown = build_report(tmp_path)["markdown"].read_text()
    assert "| grpo | ppo | 0.500 | [0.500, 0.500] |" in markdown  # the mean of 1 and 0
    assert "| Acrobot-v1 | grpo | ppo | 1.000 | [1.000, 1.000] |" in markdown
    assert "| CartPole-v1 | grpo | ppo | 0.000 | [0.000, 0.000] |" in markdown


def test_an_algo_that_has_only_begun_does_not_shrink_the_comparison_of_the_others(tmp_path: Path) -> None:
    # ppo and grpo completed CartPole and Acrobot; sb3-ppo only CartPole. Comparing all three would keep
    # CartPole alone: sb3-ppo is left out, and the others are compared on both envs.
    for env_id in ("CartPole-v1", "Acrobot-v1"):
        for algo in ("ppo", "grpo"):
            make_run(tmp_path / f"{env_id}-{algo}", env_id, algo, 0, linear_evals(2))
    make_run(tmp_path / "CartPole-v1-sb3", "CartPole-v1", "sb3-ppo", 0, linear_evals(2), final=475.0)
    refs = load_reference_scores()
    runs = find_runs([tmp_path])

    def normalize(run: Any, score: float) -> float | None:
        ref = reference_for(run, refs)
        return None if ref is None else ref.normalize(score)

    matrices = score_matrices(runs, normalize)
    assert sorted(matrices.scores) == ["grpo", "ppo"] and matrices.envs == ["Acrobot-v1", "CartPole-v1"]
    assert matrices.left_out == {"sb3-ppo": 1} and matrices.unshared == []
    # It is still measured where it ran: on CartPole, 475 normalizes to 1 and the others' 70 to
    # (70 − 22.15) / (475 − 22.15) = 0.106, so sb3-ppo beats each in every pairing.
    table, envs = left_out_pairs(runs, matrices, normalize)[1:]
    assert table.rows == [
        ["sb3-ppo", other, "1", "1, 1", "1.000 [1.000, 1.000]", "0.106 [0.106, 0.106]", "1.000 [1.000, 1.000]"]
        for other in ("grpo", "ppo")
    ]
    assert envs.items == ["sb3-ppo and grpo: CartPole-v1", "sb3-ppo and ppo: CartPole-v1"]
    # Once every algo has run both envs, all three are compared.
    make_run(tmp_path / "Acrobot-v1-sb3", "Acrobot-v1", "sb3-ppo", 0, linear_evals(2))
    matrices = score_matrices(find_runs([tmp_path]), normalize)
    assert sorted(matrices.scores) == ["grpo", "ppo", "sb3-ppo"] and matrices.left_out == {}
