"""Tests for lab/pages.py's result pages: what a reader came for first (scores, then the report), then how it
was produced, then the prose; the compute the runs spent, not the last invocation's time; kept files as links."""

from __future__ import annotations

from pathlib import Path

import yaml

from lab import manifest, pages

REPORT = """# Bench report: toy

## What was run

- Envs: CartPole-v1
- Compute: 12,288 env steps in 2.5 core-hours: the wall time of 2 trainer processes of one thread each
- Wall-clock: 1.75 h in 3 invocations of `testbed bench`

## CartPole-v1

| algo | seeds completed | final return (mean) |
|---|---|---|
| ppo | 2/2 | 450.00 |

## Plots

![CartPole-v1: curve](plots/CartPole-v1-steps.png)
"""
SUMMARY = """algo,env_id,seed,status,final_eval_return_mean,final_eval_return_std,total_steps,wall_time_s,sps,run_dir
ppo,CartPole-v1,0,completed,400.0,0,4096,3600,1000,CartPole-v1/ppo/seed0
ppo,CartPole-v1,1,completed,500.0,0,4096,3600,1000,CartPole-v1/ppo/seed1
sb3-ppo,CartPole-v1,0,completed,300.0,0,4096,1800,1000,CartPole-v1/sb3-ppo/seed0
sb3-ppo,CartPole-v1,1,completed,310.0,0,4096,1800,1000,CartPole-v1/sb3-ppo/seed1
sb3-ppo,CartPole-v1,2,completed,320.0,0,4096,1800,1000,CartPole-v1/sb3-ppo/seed2
"""


def _result(root: Path, report: str = REPORT) -> manifest.Manifest:
    """A produced bench result whose last invocation took 18 s, reusing the runs of earlier ones."""
    folder = root / "benchmarks/results/toy"
    (folder / "plots").mkdir(parents=True)
    (folder / "plots/CartPole-v1-steps.png").write_bytes(b"png")
    (folder / "report.md").write_text(report)
    (folder / "summary.csv").write_text(SUMMARY)
    (folder / "bench.yaml").write_text("name: toy\n")
    produced = {
        "commit": "abc1234",
        "code_version": 3,
        "date": "2026-12-01",
        "machine": "a machine",
        "wall_s": 18.0,
        "reused_runs": True,
    }
    entry = {
        "name": "toy",
        "title": "Toy",
        "about": "What the toy result is, at length.",
        "command": "testbed bench",
        "folder": "benchmarks/results/toy",
        "keep": ["report.md", "summary.csv", "bench.yaml", "plots"],
        "page": "report.md",
        "seeds": "0–2",
        "budget": "4,096 env steps",
        "cost": "cheap",
        "produced": produced,
    }
    (root / manifest.MANIFEST).write_text(yaml.safe_dump({"code_version": 3, "results": [entry]}))
    return manifest.load(root)


def test_a_page_opens_with_the_scores_then_the_report_then_how_it_was_made_then_the_prose(tmp_path: Path) -> None:
    found = _result(tmp_path)
    page = pages.result_page(tmp_path, found, found.entry("toy"))
    order = [
        "# Toy",
        "## Final return by task and algo",
        "## The report",
        "### CartPole-v1",
        "### Plots",
        "## How it was made",
        "| command | `testbed bench` |",
        "### What was run",
        "## About this result",
        "What the toy result is",
    ]
    assert [page.index(part) for part in order] == sorted(page.index(part) for part in order)
    # Scores by task and algo: ppo's two seeds give a marked CI with its footnote, sb3-ppo's three do not.
    assert "| CartPole-v1 | 450.00 [400.00, 500.00] † | 310.00 [300.00, 320.00] |" in page
    assert "† CI from 2 seeds, fewer than 3" in page
    assert page.count("### What was run") == 1 and "- Envs: CartPole-v1" in page  # moved, not lost


def test_the_page_states_the_compute_the_runs_spent_and_labels_the_last_invocation(tmp_path: Path) -> None:
    found = _result(tmp_path)
    page = pages.result_page(tmp_path, found, found.entry("toy"))
    assert "| compute | 2.5 core-hours for 12,288 env steps, all its runs |" in page
    assert "| wall-clock | 1.75 h in 3 invocations of `testbed bench`, start to end |" in page
    assert (
        "| last run's wall time | 18 s (the whole command, as last run; it reused runs an earlier invocation had "
        "finished) |"
    ) in page
    assert "| wall time |" not in page
    # A report that states no compute: the runs' wall times of summary.csv add up, 3 × 1800 + 2 × 3600 s = 3.5 h.
    found = _result(tmp_path / "older", REPORT.replace("- Compute", "- Spent").replace("- Wall-clock", "- Took"))
    page = pages.result_page(tmp_path / "older", found, found.entry("toy"))
    assert "| runs' wall time | 3.5 h, the sum over its 5 runs" in page and "| compute |" not in page


def test_kept_files_are_links_where_the_site_carries_them(tmp_path: Path) -> None:
    found = _result(tmp_path)
    page = pages.result_page(tmp_path, found, found.entry("toy"))
    assert (
        "Kept files, in `benchmarks/results/toy/`: `report.md` (this page), [summary.csv](files/toy/summary.csv), "
        "[bench.yaml](files/toy/bench.yaml), `plots/`."
    ) in page
    assert "![CartPole-v1: curve](files/toy/plots/CartPole-v1-steps.png)" in page
