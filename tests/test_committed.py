"""Tests for lab/committed.py: committed results as DataFrames, and ``testbed report BENCH --against NAME``.

No training: benches and results are written by hand (``tests.test_report.make_run``), a result's runs kept
as a committed result keeps them (``lab.kept.keep_run``: config, meta, summary, progress.csv.gz), so every
number can be checked against the one written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from envs.errors import BadInput
from lab import committed
from lab.cli import main
from lab.kept import keep_run
from tests.conftest import REPO
from tests.test_report import linear_evals, make_run

COMMIT = "0123456789abcdef0123456789abcdef01234567"
FINALS = {0: 100.0, 1: 300.0, 2: 200.0}
"""Final returns by seed: distinct, so the probability of improvement of a set over itself is 0.5 by ties."""


def bench(folder: Path, env_id: str = "CartPole-v1", algo: str = "ppo", evaluations: int = 3, **config: object) -> Path:
    """A bench of three seeds of ``algo`` on ``env_id``, ``evaluations`` evaluations each 1,024 steps apart (the
    budget), their final returns :data:`FINALS`; ``config``: keys written over each run's config.yaml."""
    for seed, final in FINALS.items():
        run_dir = make_run(
            folder / env_id / algo / f"seed{seed}",
            env_id,
            algo,
            seed,
            linear_evals(evaluations, start=final),
            final=final,
        )
        path = run_dir / "config.yaml"
        written = {**yaml.safe_load(path.read_text()), "budget_seconds": None, "eval_interval": 1024, **config}
        path.write_text(yaml.safe_dump(written, sort_keys=False))
        meta = {"command": ["train"], "git_commit": COMMIT, "python": "3.11.7", "cpu": "a test CPU"}
        (run_dir / "meta.json").write_text(json.dumps(meta))
    return folder


def kept(source: Path, folder: Path) -> Path:
    """The runs of ``source`` as a committed result keeps them, at their paths under ``folder``."""
    for config in sorted(source.rglob("config.yaml")):
        keep_run(config.parent, folder / config.parent.relative_to(source))
    return folder


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ── the loader ───────────────────────────────────────────────────────────────────────────────────


def test_finals_and_curves_hold_the_numbers_of_the_kept_runs(tmp_path: Path) -> None:
    result = kept(bench(tmp_path / "made"), tmp_path / "result")
    assert not list(result.rglob("progress.csv")) and len(list(result.rglob("progress.csv.gz"))) == 3
    before = files(result)

    finals = committed.finals(result)
    assert list(finals.columns) == list(committed.FINALS_COLUMNS)
    assert finals[["algo", "env", "seed", "status"]].values.tolist() == [
        ["ppo", "CartPole-v1", seed, "completed"] for seed in (0, 1, 2)
    ]
    assert finals.final_return.tolist() == [FINALS[0], FINALS[1], FINALS[2]]
    assert finals.budget.tolist() == [3 * 1024] * 3 and finals.eval_episodes.tolist() == [10] * 3
    assert set(finals.result) == {"result"} and set(finals.commit) == {COMMIT}
    assert finals.run.tolist() == [f"CartPole-v1/ppo/seed{seed}" for seed in (0, 1, 2)]

    curves = committed.curves(result)
    assert list(curves.columns) == list(committed.CURVES_COLUMNS)
    seed1 = curves[curves.seed == 1]
    # linear_evals: an evaluation every 1,024 steps, one second apart, returns rising by 50 from the start.
    np.testing.assert_array_equal(seed1.global_step, [1024, 2048, 3072])
    np.testing.assert_array_equal(seed1.wall_time_s, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(seed1.eval_return, [300.0, 350.0, 400.0])
    assert len(curves) == 9 and len(committed.runs(result)) == 3
    assert files(result) == before  # reading never writes


def test_a_manifest_name_reads_its_folder_and_not_the_results_inside_it(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    kept(bench(tmp_path / "made"), root / "benchmarks/results/one")
    (root / "benchmarks").mkdir(exist_ok=True)
    entries = [
        {
            "name": name,
            "title": name,
            "about": "-",
            "command": "testbed bench",
            "folder": folder,
            "keep": [],
            "seeds": "0-2",
            "budget": "3,072",
            "cost": "cheap",
        }
        for name, folder in (("one", "benchmarks/results/one"), ("every", "benchmarks/results"))
    ]
    (root / "benchmarks/manifest.yaml").write_text(yaml.safe_dump({"code_version": 1, "results": entries}))

    finals = committed.finals("one", root=root)
    assert set(finals.result) == {"one"} and finals.final_return.tolist() == [100.0, 300.0, 200.0]
    # "every"'s folder holds "one"'s: those runs are one's, and "every" keeps none of its own.
    with pytest.raises(BadInput, match="every keeps no runs"):
        committed.finals("every", root=root)
    with pytest.raises(BadInput, match=r"'onee' is neither a committed result nor a folder \(did you mean one\?\)"):
        committed.curves("onee", root=root)


# ── testbed report BENCH --against NAME ──────────────────────────────────────────────────────────


def _improvement(markdown: str, x: str, y: str) -> float:
    """P(X > Y) from the report's table of probabilities of improvement."""
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[:2] == [x, y] and len(cells) == 4:
            return float(cells[2])
    raise AssertionError(f"no P({x} > {y}) row in the report")


def test_equal_runs_against_a_result_give_a_probability_of_improvement_of_one_half(tmp_path: Path) -> None:
    mine = bench(tmp_path / "mine")
    made = bench(bench(tmp_path / "made"), "Acrobot-v1")  # an env the bench lacks: left out
    result = kept(made, tmp_path / "baseline")
    before = files(result)

    assert main(["report", str(mine), "--against", str(result)]) == 0
    out = mine / "against-baseline"
    markdown = (out / "report.md").read_text()
    assert _improvement(markdown, "ppo", "ppo@baseline") == 0.5
    assert _improvement(markdown, "ppo@baseline", "ppo") == 0.5
    assert "Left out, as only one side ran them: Acrobot-v1 (baseline)" in markdown
    assert f"Runs: 3 runs of the bench, 3 of baseline, trained at commit {COMMIT[:7]}." in markdown
    summary = (out / "summary.csv").read_text().splitlines()
    assert len(summary) == 1 + 6 and "ppo@baseline,CartPole-v1,1,completed,300.0" in summary[5]
    assert summary[5].endswith(f"{result}/CartPole-v1/ppo/seed1")
    assert (out / "plots" / "CartPole-v1-steps.png").exists() and (out / "report.html").exists()
    assert files(result) == before and not (mine / "report.md").exists()  # only against-baseline/ was written


def test_another_env_is_refused_in_one_line_through_the_command_line(tmp_path: Path) -> None:
    mine = bench(tmp_path / "mine", "Acrobot-v1")
    result = kept(bench(tmp_path / "made"), tmp_path / "baseline")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "lab.cli", "report", str(mine), "--against", str(result)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr == (
        f"testbed report: error: {mine} and baseline share no env: {mine} has Acrobot-v1; baseline has CartPole-v1. "
        "Run your bench on one of baseline's envs\n"
    )
    assert not (mine / "against-baseline").exists()


@pytest.mark.parametrize(
    ("evaluations", "config", "message"),
    [
        (
            4,
            {},
            (
                "budgets differ on the envs both hold (CartPole-v1: total_steps 4,096 in {mine}, 3,072 in baseline): "
                "rerun the bench with baseline's (--total-steps 3072) to compare like with like"
            ),
        ),
        (
            3,
            {"budget_seconds": 60.0},
            (
                "budgets differ on the envs both hold (CartPole-v1: budget_seconds 60.0 in {mine}, None in baseline): "
                "rerun the bench with baseline's (no --budget-seconds) to compare like with like"
            ),
        ),
        (
            3,
            {"eval_episodes": 5, "eval_interval": 2048},
            (
                "evaluation differs on the envs both hold (CartPole-v1: eval_episodes 5 in {mine}, 10 in baseline; "
                "CartPole-v1: eval_interval 2,048 in {mine}, 1,024 in baseline): rerun the bench with baseline's "
                "(--set eval_episodes=10, --set eval_interval=1024) to compare like with like"
            ),
        ),
    ],
)
def test_another_budget_or_evaluation_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], evaluations: int, config: dict[str, object], message: str
) -> None:
    mine = bench(tmp_path / "mine", evaluations=evaluations, **config)
    result = kept(bench(tmp_path / "made"), tmp_path / "baseline")
    assert main(["report", str(mine), "--against", str(result)]) == 2
    err = capsys.readouterr().err
    assert err == f"testbed report: error: {message.format(mine=mine)}\n"
    assert not (mine / "against-baseline").exists()


def test_a_name_that_is_no_result_and_a_result_without_runs_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = bench(tmp_path / "mine")
    assert main(["report", str(mine), "--against", "no-such-result"]) == 2
    assert "'no-such-result' is neither a committed result nor a folder" in capsys.readouterr().err
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "report.md").write_text("# a result that keeps only its report\n")
    assert main(["report", str(mine), "--against", str(tmp_path / "pages")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pages keeps no runs" in err
    # A bench inside the result's folder would have its comparison written there.
    assert main(["report", str(mine), "--against", str(tmp_path)]) == 2
    assert "lies inside" in capsys.readouterr().err and not (mine / f"against-{tmp_path.name}").exists()
