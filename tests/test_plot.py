"""Tests for ``testbed plot`` (lab/plot.py's learning curves and the command): where the figure goes, what
it says, and the training-return curve beside the evaluations, on run folders with known numbers and on a
short real run."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from matplotlib.figure import Figure

from lab import plot
from lab.cli import main
from lab.results import find_runs
from tests.conftest import read_progress

COLUMNS = ["global_step", "wall_time_s", "charts/episodic_return", "eval/return_mean", "eval/return_std"]
# One iteration of 256 steps a row. No episode ends in the first, so its training cell is empty; the
# only evaluation is the final one, as in a run shorter than its preset's eval_interval.
ROWS = [
    (256, 0.5, "", "", ""),
    (512, 1.0, 20.0, "", ""),
    (768, 1.5, 35.0, "", ""),
    (1024, 2.0, 50.0, 120.0, 4.0),
]


def write_run(run_dir: Path, rows: list[tuple[Any, ...]] = ROWS, algo: str = "ppo", seed: int = 0) -> Path:
    """A run folder as ``testbed train`` leaves it while running: config.yaml and progress.csv."""
    run_dir.mkdir(parents=True)
    config = {"algo": algo, "env_id": "CartPole-v1", "seed": seed, "total_steps": rows[-1][0]}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    with open(run_dir / "progress.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    return run_dir


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """Every figure ``lab.plot`` saves, kept for inspection; the files are still written."""
    saved: list[Figure] = []
    original = plot.save_figure

    def keep(fig: Figure, out: Path) -> list[Path]:
        saved.append(fig)
        return original(fig, out)

    monkeypatch.setattr(plot, "save_figure", keep)
    return saved


def line_points(ax: Any) -> tuple[list[float], list[float]]:
    """The points of the panel's only line."""
    [line] = ax.get_lines()
    return list(map(float, line.get_xdata())), list(map(float, line.get_ydata()))


def test_one_run_is_plotted_into_its_folder_with_both_returns(
    tmp_path: Path, figures: list[Figure], capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = write_run(tmp_path / "run")
    assert main(["plot", str(run_dir)]) == 0
    png = run_dir / "plots" / "curves-steps.png"
    assert capsys.readouterr().out.splitlines() == [f"wrote {png}"]  # one format: no SVG beside it
    assert png.read_bytes().startswith(b"\x89PNG") and not png.with_suffix(".svg").exists()
    assert not (tmp_path / "plots").exists(), "nothing lands in the working directory"

    [fig] = figures
    evaluation, training = [ax for ax in fig.axes if ax.get_visible()]
    assert (evaluation.get_title(), training.get_title()) == ("CartPole-v1: evaluation", "CartPole-v1: training")
    assert evaluation.get_ylabel() == "eval return (deterministic)"
    assert training.get_ylabel() == "training return (episodes ended)"
    assert line_points(evaluation) == ([1024.0], [120.0])
    assert evaluation.get_lines()[0].get_marker() == "o", "a single evaluation is drawn as a dot"
    # The rows where some episode ended, at their steps; the first row has none.
    assert line_points(training) == ([512.0, 768.0, 1024.0], [20.0, 35.0, 50.0])
    assert training.get_shared_x_axes().joined(evaluation, training), "both on the same steps"
    assert training.get_shared_y_axes().joined(evaluation, training), "both on one y scale"


def test_training_return_on_the_wall_clock_and_averaged_over_runs(tmp_path: Path) -> None:
    write_run(tmp_path / "bench" / "seed0")
    other = [(512, 1.2, 40.0, "", ""), (1024, 2.4, 10.0, 100.0, 0.0)]  # seed 1: no row at step 768
    write_run(tmp_path / "bench" / "seed1", other, seed=1)
    runs = find_runs([tmp_path / "bench"])
    xs, ys = plot.run_xy(runs[0], "time", "train")
    assert xs.tolist() == [1.0, 1.5, 2.0] and ys.tolist() == [20.0, 35.0, 50.0]
    curve = plot.mean_curve(runs, "steps", metric="train")
    assert curve is not None and curve.n_runs == 2
    assert curve.x.tolist() == [512, 768, 1024]
    # seed 1 interpolates to 25 at 768: means (20+40)/2, (35+25)/2, (50+10)/2.
    np.testing.assert_allclose(curve.mean, [30.0, 30.0, 30.0])


@pytest.mark.parametrize(
    ("metric", "name", "titles"),
    [
        ("eval", "curves-eval-time", ["CartPole-v1"]),
        ("train", "curves-train-time", ["CartPole-v1"]),
    ],
)
def test_one_metric_is_one_panel_named_for_it(
    tmp_path: Path,
    figures: list[Figure],
    capsys: pytest.CaptureFixture[str],
    metric: str,
    name: str,
    titles: list[str],
) -> None:
    run_dir = write_run(tmp_path / "run")
    assert main(["plot", str(run_dir), "--metric", metric, "--x", "time"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote {run_dir / 'plots' / name}.png"]
    [fig] = figures
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == titles
    assert panels[0].get_ylabel() == plot.Y_LABELS[metric]


def test_several_paths_need_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = write_run(tmp_path / "a"), write_run(tmp_path / "b", algo="grpo")
    assert main(["plot", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert "2 paths" in err and "--out FILE" in err
    assert not (a / "plots").exists() and not (b / "plots").exists(), "the error comes before any file"
    out = tmp_path / "compare" / "ab.png"
    assert main(["plot", str(a), str(b), "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote {out}"]
    svg = tmp_path / "compare" / "ab.svg"  # SVG when asked for by name
    assert main(["plot", str(a), str(b), "--out", str(svg)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote {svg}"] and b"<svg" in svg.read_bytes()


def test_a_short_real_run_gives_a_training_curve(tmp_path: Path, figures: list[Figure]) -> None:
    """1,024 steps of PPO on CartPole: one evaluation (at the end), and a training point per iteration in
    which some episode ended, at the numbers progress.csv holds."""
    run_dir = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--algo",
                "ppo",
                "--env",
                "CartPole-v1",
                "--total-steps",
                "1024",
                "--set",
                "eval_episodes=2",
                "--run-dir",
                str(run_dir),
            ]
        )
        == 0
    )
    rows = [r for r in read_progress(run_dir) if r["charts/episodic_return"]]
    assert len(rows) >= 2
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "curves.png")]) == 0
    [fig] = figures
    evaluation, training = [ax for ax in fig.axes if ax.get_visible()]
    assert len(line_points(evaluation)[0]) == 1
    assert line_points(training) == (
        [float(r["global_step"]) for r in rows],
        [float(r["charts/episodic_return"]) for r in rows],
    )


def test_coinciding_profile_lines_stay_distinguishable(tmp_path: Path, figures: list[Figure]) -> None:
    # Three algos at the top of a performance profile draw one line: each gets its own dash and markers, shifted,
    # and the legend says which lines lie on which.
    x = np.linspace(0.0, 1.0, 17)
    top = np.ones_like(x)
    lines = {"grpo": top.copy(), "ppo": top.copy(), "sb3-ppo": top.copy(), "a2c": 1.0 - x}
    assert plot.coinciding(lines) == {"ppo": ["grpo"], "sb3-ppo": ["grpo", "ppo"]}
    assert plot.coinciding({"a": np.array([1.0, np.nan]), "b": np.array([1.0, 1.0])}) == {}  # one ends early
    bands = {algo: np.vstack([y, y]) for algo, y in lines.items()}
    plot.plot_bands(x, lines, bands, "τ", "fraction", tmp_path / "p.png", title="profiles")
    [ax] = figures[-1].axes
    drawn = ax.get_lines()
    assert len({line.get_linestyle() for line in drawn}) == 4 and len({line.get_marker() for line in drawn}) == 4
    assert len({str(line.get_markevery()) for line in drawn[:3]}) == 3  # markers of coinciding lines do not overlap
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels == ["grpo", "ppo (same line as grpo)", "sb3-ppo (same line as grpo, ppo)", "a2c"]
