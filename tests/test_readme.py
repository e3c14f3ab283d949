"""The README: short, the two set-up commands on its first screen, its numbers in generated blocks, and links that
resolve on the repository page."""

from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCKS = ("first-screen-bench", "first-screen-tests", "speed", "results-table", "results-figure")
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


# ── the figures typed into the README's prose, each against the committed result it comes from ─────────────

RESULTS = ROOT / "benchmarks" / "results"


def prose() -> str:
    """The README without its generated blocks (rewritten from their results by `testbed results pages`), its
    code blocks and its link targets: the text a person typed, figures included."""
    text = re.sub(
        r"<!-- BEGIN generated: ([\w-]+) -->.*?<!-- END generated: \1 -->", "", README.read_text(), flags=re.DOTALL
    )
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return re.sub(r"\]\([^)]*\)", "]", text)


def figure(pattern: str) -> float:
    """The figure that ``pattern``'s group captures in the README's prose, which must still say it."""
    found = re.search(pattern, prose())
    assert found, f"README no longer says {pattern!r}: update this test with the sentence"
    return float(found.group(1).replace("−", "-"))


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def test_the_speed_sentence_gives_the_committed_median_and_total_times() -> None:
    speed = block(README.read_text(), "speed")
    # benchmarks/speed.py's ratio: the median SB3 process time over our median, of the runs that exited 0.
    rows = read_csv(RESULTS / "speed" / "speed.csv")
    for case, label in (("cartpole", "CartPole"), ("halfcheetah", "HalfCheetah")):
        walls = {
            impl: [
                float(r["wall_s"]) for r in rows if r["case"] == case and r["impl"] == impl and r["returncode"] == "0"
            ]
            for impl in ("ours", "sb3")
        }
        assert len(walls["ours"]) >= 3 and len(walls["sb3"]) >= 3
        ratio = statistics.median(walls["sb3"]) / statistics.median(walls["ours"])
        assert f"{ratio:.2f}× ({label})" in speed, case
    # benchmarks/stacking.py's ratio: all 8 SB3 processes' wall time over the one stacked process's.
    for folder, case, label in (
        ("lunarlander-halfcheetah", "halfcheetah", "HalfCheetah"),
        ("cartpole", "cartpole", "CartPole"),
    ):
        rows = [
            r
            for r in read_csv(RESULTS / "stacking" / folder / "stacking.csv")
            if r["case"] == case and r["returncode"] == "0"
        ]
        stacked = [float(r["wall_s"]) for r in rows if r["impl"] == "stacked"]
        sb3 = [float(r["wall_s"]) for r in rows if r["impl"] == "sb3"]
        assert len(stacked) == 1 and len(sb3) == 8 and [r["seeds"] for r in rows if r["impl"] == "stacked"] == ["8"]
        assert f"{sum(sb3) / stacked[0]:.2f}× on {label}" in speed, case


def audit_rho(name: str) -> dict[tuple[str, str, str, str], float]:
    """Spearman's ρ of each (env, algo, checkpoint, estimator) of an audit over all its samples, the mean over
    seeds (as its audit.md reports it), from the committed scores.csv."""
    by: dict[tuple[str, str, str, str], list[float]] = {}
    for r in read_csv(RESULTS / name / "scores.csv"):
        if r["steps_left"] == "all" and r["rank_correlation"] not in ("", "nan"):
            key = (r["env"], r["algo"], r["checkpoint"], r["estimator"])
            by.setdefault(key, []).append(float(r["rank_correlation"]))
    return {key: statistics.fmean(values) for key, values in by.items()}


GROUP_ESTIMATORS = ("outcome", "process", "rloo", "step_alive", "step_baseline")


def test_audit_figures_are_the_committed_rank_correlations() -> None:
    # LunarLander at 1e5 steps: GAE(0) with PPO's critic ranks best, the group estimators at most 0.11.
    lunar = {k: v for k, v in audit_rho("audit-lunarlander-sharp").items() if k[2] == "checkpoint-at-100000.pt"}
    best = max(lunar, key=lambda k: lunar[k])
    assert best[1:] == ("ppo", "checkpoint-at-100000.pt", "gae(0)")
    assert figure(r"ranks best on LunarLander at 1e5 steps \(ρ ([\d.]+)") == round(lunar[best], 2)
    groups = max(v for k, v in lunar.items() if k[3] in GROUP_ESTIMATORS)
    assert groups <= figure(r"groups ≤ ([\d.]+)") and round(groups, 2) == figure(r"groups ≤ ([\d.]+)")
    # Hopper: nothing ranks well, every estimator of every checkpoint within |ρ| ≤ 0.24.
    hopper = max(abs(v) for v in audit_rho("audit-hopper-sharp").values())
    assert hopper <= figure(r"\(\|ρ\| ≤ ([\d.]+)") and round(hopper, 2) == figure(r"\(\|ρ\| ≤ ([\d.]+)")
    # HalfCheetah with delayed rewards (20 and 100 steps; a delay of 1 is none): |ρ| < 0.3 but for GAE(0) with
    # PPO's early critic.
    cheetah = {k: v for k, v in audit_rho("audit-halfcheetah-sharp").items() if "reward_delay=1]" not in k[0]}
    assert {k[0] for k in cheetah} == {"HalfCheetah-v5[reward_delay=20]", "HalfCheetah-v5[reward_delay=100]"}
    first, second, *rest = sorted(cheetah, key=lambda k: -abs(cheetah[k]))
    assert first[1:] == ("ppo", "checkpoint-at-30000.pt", "gae(0)")  # the earliest of PPO's checkpoints
    assert second[1:] == ("ppo", "checkpoint-at-30000.pt", "gae(0.5)")
    assert figure(r"GAE\(0\)'s ([\d.]+)\s+and") == round(cheetah[first], 2)
    assert figure(r"GAE\(0\.5\)'s ([\d.]+) with PPO's early critic") == round(cheetah[second], 2)
    assert max(abs(cheetah[k]) for k in rest) < figure(r"\(\|ρ\| < ([\d.]+) but")


def test_the_hopper_ablation_and_walker_settings_are_the_committed_ones() -> None:
    # grpo-ablation/hopper.md's table: each bench's final eval; one setting alone each, the offset apart.
    table = (RESULTS / "grpo-ablation" / "hopper.md").read_text()
    finals = {
        name: float(value)
        for name, value in re.findall(r"^\| `abl-hop-([\w-]+)` \|.*?\*\*([\d.]+)\*\*", table, re.MULTILINE)
    }
    alone = [finals[name] for name in ("preset", "alive", "branch", "vine")]
    assert figure(r"stood still \(([\d.]+) to") == round(min(alone)) and figure(
        r"stood still \([\d.]+ to ([\d.]+)\)"
    ) == round(max(alone))
    assert figure(r"which did worse \(([\d.]+);") == round(finals["offset"])
    # The settings of the run that walks, from its committed bench.yaml.
    overrides = dict(
        item.split("=", 1)
        for item in yaml.safe_load((RESULTS / "grpo-hopper-walker-best" / "bench.yaml").read_text())["overrides"][
            "grpo"
        ]
    )
    assert overrides["advantage"] == "rloo" and float(overrides["reward_offset"]) == 1.0
    assert float(overrides["gamma"]) == figure(r"γ = ([\d.]+),")
    assert round(float(overrides["log_std_init"]), 1) == figure(r"σ = e\^(−[\d.]+)\)")


CHECKED = {
    "1.72",
    "1.34",
    "2.68",
    "3.30",
    "0.58",
    "0.11",
    "0.24",
    "0.3",
    "0.44",
    "0.35",
    "997",
    "1016",
    "361",
    "1.6",
    "1",
}
"""Every figure of a result in the README's prose, each compared with its result by a test above."""
NOT_RESULTS = {"3.11", "3", "8", "1e5", "150"}
"""Numbers that are settings, not results: Python's version, 3 seeds, 8 seeds, a budget of 1e5 steps."""


def test_every_figure_in_the_prose_is_checked_against_its_result() -> None:
    # A new hand-typed figure fails here until a test compares it with the result it comes from, or it moves into
    # a generated block.
    names = re.sub(r"GAE\([\d.]+\)|\[\d\]", "", prose())  # an estimator's λ, a link numbered [1]
    typed = set(re.findall(r"(?<![\w.\-/])(\d+(?:\.\d+)?(?:e\d+)?)(?![\w.]*[\w/])", names))
    unchecked = sorted(typed - CHECKED - NOT_RESULTS)
    assert not unchecked, f"README figures that no test compares with a committed result: {unchecked}"
