"""The README: short, the two set-up commands on its first screen, its numbers in generated blocks, and links that
resolve on the repository page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCKS = ("first-screen-bench", "first-screen-tests", "results-table", "results-figure")
BENCH = "python3.11 -m venv .venv && . .venv/bin/activate && pip install -e . && testbed bench --suite quick"
TESTS = 'python3.11 -m venv .venv && . .venv/bin/activate && pip install -e ".[dev]" && pytest'


def block(text: str, name: str) -> str:
    """The text between ``<!-- BEGIN generated: name -->`` and its END marker; each marker appears once."""
    begin, end = f"<!-- BEGIN generated: {name} -->", f"<!-- END generated: {name} -->"
    assert text.count(begin) == 1 and text.count(end) == 1, f"README: one {begin} … {end} block"
    return text[text.index(begin) + len(begin) : text.index(end)]


def test_the_readme_is_at_most_150_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move the detail into docs/ (the site)"


def test_the_first_screen_sets_up_and_runs_the_bench_and_the_tests() -> None:
    first_screen = README.read_text().splitlines()[:40]
    assert BENCH in first_screen and TESTS in first_screen
    text = README.read_text()
    for name in ("first-screen-bench", "first-screen-tests"):
        timing = block(text, name)
        assert text.index(timing) < text.index("\n## "), f"{name} belongs on the first screen"
        assert "busy" in timing.lower(), f"{name}: a timing names its machine and says that a busy machine is slower"


def test_every_number_lives_in_a_generated_block_in_order() -> None:
    text = README.read_text()
    positions = [text.index(f"<!-- BEGIN generated: {name} -->") for name in BLOCKS]
    assert positions == sorted(positions)
    for name in BLOCKS:
        block(text, name)
    assert "|---|" in block(text, "results-table")
    assert re.search(r"!\[[^\]]+\]\([^)]+\.(png|svg)\)", block(text, "results-figure"))


def test_every_relative_link_resolves_and_the_site_is_explained() -> None:
    text = README.read_text()
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not t.startswith(("http://", "https://", "#"))]
    missing = [t for t in targets if not (ROOT / t.partition("#")[0]).exists()]
    assert not missing, f"README links to missing files: {missing}"
    assert any(t.startswith("docs/") and t.endswith(".md") for t in targets)
    assert "mkdocs serve" in text
