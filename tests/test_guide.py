"""The guide (docs/ppo_and_grpo.md): its figure command in quick mode, and every link it makes, code links included
(through the API reference's anchors)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from lab import guide
from lab import guide_experiments as ex
from lab.cli import main

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "ppo_and_grpo.md"
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def links(path: Path) -> list[tuple[str, str]]:
    """(text, target) of every Markdown link in ``path`` that points inside the repository."""
    return [(text, target) for text, target in LINK.findall(path.read_text())
            if not target.startswith(("http://", "https://", "#"))]  # fmt: skip


@pytest.fixture(scope="module")
def quick_figures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs")
    out = root / "figures"
    assert main(["docs", "--quick", "--out", str(out), "--runs", str(root / "runs"), "--workers", "2"]) == 0
    return out


def test_quick_mode_writes_every_file_the_guide_links(quick_figures: Path) -> None:
    figures = [target.removeprefix("figures/") for _, target in links(GUIDE)
               if target.startswith("figures/") and target != "figures/"]  # fmt: skip
    assert len(set(figures)) >= 12  # the six experiments the issue names, their tables, the cost table
    missing = [name for name in figures if not (quick_figures / name).is_file()]
    assert not missing, f"the guide links files that `testbed docs --quick` did not write: {missing}"
    assert sorted(p.name for p in quick_figures.iterdir()) == sorted(guide.FIGURES)
    # Every linked figure is also committed beside the guide, from the full mode.
    assert all((GUIDE.parent / "figures" / name).is_file() for name in figures)
    assert "(quick mode)" in (quick_figures / "HOW_MADE.md").read_text()


def test_quick_tables_hold_the_measured_facts(quick_figures: Path) -> None:
    tied = (quick_figures / "tied_group.md").read_text().splitlines()
    # β = 0 and no entropy bonus: a wholly tied batch has no gradient at all, and the policy stays put.
    assert tied[4].startswith("| 0.0 | 0.0 | 0 | 0.0000 |")
    # With β > 0 something moves: the KL penalty alone pulls π_θ toward π_ref.
    assert not tied[5].startswith("| 0.04 | 0.0 | 0 | 0.0000 |")
    weights = (quick_figures / "aggregation_weights.md").read_text()
    # Lengths 20, 100, 500 (Σ L = 620, M = 3, H = 500). Per trajectory: a step weighs 1/(M·L) = 1/60, 1/300,
    # 1/1500; per step: 1/620 each; constant: 1/(M·H) = 1/1500 each.
    assert "| trajectory | 0.01667 / 0.333 | 0.00333 / 0.333 | 0.00067 / 0.333 |" in weights
    assert "| step | 0.00161 / 0.032 | 0.00161 / 0.161 | 0.00161 / 0.806 |" in weights
    assert "| constant | 0.00067 / 0.013 | 0.00067 / 0.067 | 0.00067 / 0.333 |" in weights


def documented(path: Path, dotted: list[str]) -> ast.AST | None:
    """The definition ``dotted`` (``["Class", "field"]``, ``["function"]``) in the module at ``path``, if it and every
    parent have a docstring, which is what gives it an anchor in the API reference (mkdocstrings renders only
    documented objects); None otherwise."""
    node: ast.AST = ast.parse(path.read_text())
    for name in dotted:
        body = list(getattr(node, "body", []))
        found = None
        for i, child in enumerate(body):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == name:
                found = child if ast.get_docstring(child) else None
            elif isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name) and child.target.id == name:
                # A field's docstring is the string literal that follows it.
                after = body[i + 1] if i + 1 < len(body) else None
                has_doc = isinstance(after, ast.Expr) and isinstance(getattr(after, "value", None), ast.Constant)
                found = child if has_doc else None
            if found is not None:
                break
        if found is None:
            return None
        node = found
    return node


def test_every_link_from_the_guide_resolves_and_names_its_target() -> None:
    """Code is linked through the API reference, `reference/<package>.md#<module>.<object>`, whose anchors
    mkdocstrings makes from the objects' paths: the page must render the module, the object must exist with a
    docstring, and the link's text must name the object or something its source holds (a local variable such as
    `kl_ref` links to the function that computes it)."""
    checked = 0
    for text, target in links(GUIDE):
        path, _, anchor = target.partition("#")
        assert not path.endswith(".py"), f"{target}: link code through the API reference, reference/<package>.md#<path>"
        file = (GUIDE.parent / path).resolve()
        assert file.exists(), f"{target} does not exist"
        if not path.startswith("reference/"):
            continue
        assert anchor, f"{target}: name the object, e.g. reference/agents.md#agents.losses.k3_kl"
        parts = anchor.split(".")
        module = next((parts[:i] for i in range(len(parts), 0, -1)
                       if (ROOT / Path(*parts[:i])).with_suffix(".py").is_file()), None)  # fmt: skip
        assert module is not None, f"{target}: no module of {anchor!r} in the repository"
        name = ".".join(module)
        assert path == f"reference/{module[0]}.md", f"{target}: {name} is documented in reference/{module[0]}.md"
        rendered = re.search(rf"^::: {re.escape(name)}\s*$", file.read_text(), re.MULTILINE)
        assert rendered, f"{target}: {path} lacks {name}"
        source_file = (ROOT / Path(*module)).with_suffix(".py")
        node = documented(source_file, parts[len(module) :])
        assert node is not None, f"{target}: {anchor} is not a documented object of {source_file.name}"
        symbol = text.strip("`").removesuffix("()").split(".")[-1]
        source = ast.get_source_segment(source_file.read_text(), node) or ""
        assert symbol == parts[-1] or re.search(rf"\b{re.escape(symbol)}\b", source), (
            f"{target}: {anchor} neither is nor holds {symbol!r}"
        )
        checked += 1
    assert checked >= 20


def test_the_readme_links_the_guide_from_its_top() -> None:
    top = "\n".join((ROOT / "README.md").read_text().splitlines()[:30])
    assert "(docs/ppo_and_grpo.md)" in top


def test_clip_only_has_no_gradient_outside_the_clip_but_the_minimum_pulls_back() -> None:
    # Â = +1, ρ = 0.5: the policy moved against the advantage, beyond 1 − ε. The clipped term alone is flat
    # there (gradient 0); the minimum keeps −ρÂ, whose gradient −1 pushes ρ back up.
    ratio = torch.tensor([0.5], requires_grad=True)
    ex.clip_only(ratio, torch.ones(1)).sum().backward()
    assert ratio.grad.tolist() == [0.0]
    ratio.grad = None
    ex.ppo_min(ratio, torch.ones(1)).sum().backward()
    assert ratio.grad.tolist() == [-1.0]


def test_docs_refuses_bad_workers(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["docs", "--quick", "--workers", "0", "--out", str(tmp_path / "f"), "--runs", str(tmp_path / "r")]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "f").exists() and not (tmp_path / "r").exists()


def test_read_series_keeps_the_rows_that_hold_the_column(tmp_path: Path) -> None:
    from lab.results import read_series

    path = tmp_path / "progress.csv"
    path.write_text("global_step,wall_time_s,losses/explained_variance,eval/return_mean\n"
                    "256,0.1,0.5,\n512,0.2,,20.0\n768,0.3,-0.25,\nbad,0.4,0.9,\n")  # fmt: skip
    steps, values = read_series(path, "losses/explained_variance")
    assert steps.tolist() == [256, 768] and values.tolist() == [0.5, -0.25]
    assert read_series(path, "grpo/frac_zero_std_groups")[0].size == 0
    assert read_series(tmp_path / "missing.csv", "eval/return_mean")[0].size == 0
