"""The guide (docs/ppo_and_grpo.md): its figure command in quick mode, and every link it makes, code links included
(through the API reference's anchors)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from agents import losses, registry
from lab import guide
from lab import guide_experiments as ex
from lab.cli import main

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "ppo_and_grpo.md"
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def links(path: Path) -> list[tuple[str, str]]:
    """(text, target) of every Markdown link in ``path`` that points inside the repository."""
    return [
        (text, target)
        for text, target in LINK.findall(path.read_text())
        if not target.startswith(("http://", "https://", "#"))
    ]


@pytest.fixture(scope="module")
def quick_figures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs")
    out = root / "figures"
    assert main(["docs", "--quick", "--out", str(out), "--runs", str(root / "runs"), "--workers", "2"]) == 0
    return out


def test_quick_mode_writes_every_file_the_guide_links(quick_figures: Path) -> None:
    figures = [
        target.removeprefix("figures/")
        for _, target in links(GUIDE)
        if target.startswith("figures/") and target != "figures/"
    ]
    assert len(set(figures)) >= 12  # the six experiments the issue names, their tables, the cost table
    missing = [name for name in figures if not (quick_figures / name).is_file()]
    assert not missing, f"the guide links files that `testbed docs --quick` did not write: {missing}"
    assert sorted(p.name for p in quick_figures.iterdir()) == sorted(guide.FIGURES)
    # Every linked figure is also committed beside the guide, from the full mode.
    assert all((GUIDE.parent / "figures" / name).is_file() for name in figures)
    assert "(quick mode)" in (quick_figures / "HOW_MADE.md").read_text()


def test_the_cost_and_dynamic_sampling_tables_count_steps_per_iteration_alike(quick_figures: Path) -> None:
    # The same GRPO CartPole runs appear in both tables: their env steps per iteration must be one number.
    cost = next(
        line
        for line in (quick_figures / "cost.md").read_text().splitlines()
        if line.startswith("| CartPole-v1 | grpo |")
    )
    plain = next(
        line
        for line in (quick_figures / "dynamic_sampling.md").read_text().splitlines()
        if line.startswith("| without |")
    )
    assert cost.split(" | ")[4] == plain.split(" | ")[6]


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


# Rewards (1, 1, 0, 0): mean 0.5, deviations ±0.5; Bessel's variance (4 · 0.25) / 3 = 1/3, std 1/√3 = 0.577350;
# group_outcome's Â = ±0.5 / (0.577350 + 1e-6) = ±0.866024 (ε moves only the seventh digit). M = 4 responses.
A_HAND = 0.5 / (3**-0.5 + 1e-6)


def test_quick_length_bias_table_holds_the_hand_computed_pushes(quick_figures: Path) -> None:
    table = (quick_figures / "length_bias.md").read_text()
    # The experiment has no budget and no seed: the committed table, which the guide shows, is this one.
    assert table == (GUIDE.parent / "figures" / "length_bias.md").read_text()
    # Correct 20 tokens, wrong 200. Per response (trajectory): a correct token gets Â/(M·20) = 0.866024/80 =
    # 0.01083, a wrong token Â/(M·200) = 0.866024/800 = 0.001083; in all, each response gets Â/M = 0.2165: the
    # long wrong response costs no more than the short correct one earns.
    assert "| correct short, wrong long | trajectory | 0.01083 | 0.001083 | 0.2165 | 0.2165 |" in table
    # Per token (step): every weight is 1/ΣL = 1/440, so a token gets 0.866024/440 = 0.001968 either way; in all
    # 20 · 0.001968 = 0.03936 for a correct response and 200 · 0.001968 = 0.3936 for a wrong one.
    assert "| correct short, wrong long | step | 0.001968 | 0.001968 | 0.03936 | 0.3936 |" in table
    # Constant, H = 200: every weight 1/(M·H) = 1/800, a token 0.001083; in all 20 · that = 0.02165,
    # 200 · that = 0.2165.
    assert "| correct short, wrong long | constant | 0.001083 | 0.001083 | 0.02165 | 0.2165 |" in table
    # Swapped: the per-response mean now favours the short wrong response's tokens (Â/(M·20) = 0.01083 each);
    # per token and constant make the long correct response earn ten times the short wrong one's penalty.
    assert "| correct long, wrong short | trajectory | 0.001083 | 0.01083 | 0.2165 | 0.2165 |" in table
    assert "| correct long, wrong short | step | 0.001968 | 0.001968 | 0.3936 | 0.03936 |" in table
    assert "| correct long, wrong short | constant | 0.001083 | 0.001083 | 0.2165 | 0.02165 |" in table
    assert "Â = ±0.8660" in table


@pytest.mark.parametrize(
    ("mode", "per_token"),
    [
        ("trajectory", [1 / 80, 1 / 80, -1 / 800, -1 / 800]),  # 1/(M·L_i), M = 4, L = 20, 20, 200, 200
        ("step", [1 / 440] * 2 + [-1 / 440] * 2),  # 1/ΣL, ΣL = 440
        ("constant", [1 / 800] * 2 + [-1 / 800] * 2),  # 1/(M·H), H = 200
    ],
)
def test_token_push_is_the_advantage_times_the_aggregation_weight(mode: str, per_token: list[float]) -> None:
    lengths = [20, 20, 200, 200]
    push = ex.token_push([1.0, 1.0, 0.0, 0.0], lengths, mode, 200)
    assert push.tolist() == pytest.approx([A_HAND * w for w in per_token], rel=1e-9)
    mask = torch.arange(200).unsqueeze(1) < torch.tensor(lengths)
    # The testbed's closed-form weights agree (float32 there, so to about 1e-6).
    weights = losses.aggregation_weights(mask, mode, 200)[0].double()  # (M,): one token of each response
    assert push.tolist() == pytest.approx((A_HAND * torch.tensor([1.0, 1.0, -1.0, -1.0]) * weights).tolist(), rel=1e-6)


def test_a_wrong_response_costs_the_same_at_any_length_only_under_the_per_response_mean() -> None:
    # The figure's sweep: three responses of 20 tokens, one wrong one of L, H = 500. Its total penalty |Â|·w·L:
    # trajectory |Â|/M = |Â|/4 at every L; step |Â|·L/(60 + L); constant |Â|·L/(M·H) = |Â|·L/2000.
    for L in (10, 100, 500):
        total = {
            mode: -float(ex.token_push([1.0, 1.0, 0.0, 0.0], [20, 20, L, 20], mode, 500)[2]) * L
            for mode in losses.AGGREGATIONS
        }
        assert total["trajectory"] == pytest.approx(A_HAND / 4, rel=1e-9)
        assert total["step"] == pytest.approx(A_HAND * L / (60 + L), rel=1e-9)
        assert total["constant"] == pytest.approx(A_HAND * L / 2000, rel=1e-9)


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


def defined_names(node: ast.AST) -> set[str]:
    """The names ``node``'s source defines: assignment targets (tuple unpacking, ``for`` and ``with`` targets,
    augmented and annotated assignments, a dataclass's fields included), functions and classes defined inside it, and
    its arguments and theirs. Attributes (``self.x = …``) and names only read do not count."""
    names: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
            names.add(child.id)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(child.name)
        elif isinstance(child, ast.arg):
            names.add(child.arg)
    return names


def test_every_link_from_the_guide_resolves_and_names_its_target() -> None:
    """Code is linked through the API reference, `reference/<package>.md#<module>.<object>`, whose anchors
    mkdocstrings makes from the objects' paths: the page must render the module, the object must exist with a
    docstring, and the link's text must be the object's name or a name the object defines (a local variable such as
    `kl_ref` links to the function that assigns it, a field to its class); a name the object only reads or mentions
    belongs to another object."""
    checked = 0
    failures = []
    for text, target in links(GUIDE):
        path, _, anchor = target.partition("#")
        assert not path.endswith(".py"), f"{target}: link code through the API reference, reference/<package>.md#<path>"
        file = (GUIDE.parent / path).resolve()
        assert file.exists(), f"{target} does not exist"
        if not path.startswith("reference/"):
            continue
        assert anchor, f"{target}: name the object, e.g. reference/agents.md#agents.losses.k3_kl"
        parts = anchor.split(".")
        module = next(
            (parts[:i] for i in range(len(parts), 0, -1) if (ROOT / Path(*parts[:i])).with_suffix(".py").is_file()),
            None,
        )
        assert module is not None, f"{target}: no module of {anchor!r} in the repository"
        name = ".".join(module)
        assert path == f"reference/{module[0]}.md", f"{target}: {name} is documented in reference/{module[0]}.md"
        # the algorithm modules are added to the page when the site is built (docs/hooks/algorithms.py)
        rendered = name in registry.MODULES or re.search(rf"^::: {re.escape(name)}\s*$", file.read_text(), re.MULTILINE)
        assert rendered, f"{target}: {path} lacks {name}"
        source_file = (ROOT / Path(*module)).with_suffix(".py")
        node = documented(source_file, parts[len(module) :])
        assert node is not None, f"{target}: {anchor} is not a documented object of {source_file.name}"
        symbol = text.strip("`").removesuffix("()").split(".")[-1]
        if symbol != parts[-1] and symbol not in defined_names(node):
            failures.append(
                f"[{text}]({target}): {anchor} neither is nor defines {symbol!r}; link the object that defines it"
            )
        checked += 1
    assert not failures, "\n".join(failures)
    assert checked >= 20


def test_defined_names_counts_what_an_object_defines_not_what_it_reads() -> None:
    source = """
@dataclass
class Config:
    horizon: int = 5
    \"\"\"A field.\"\"\"

def loss(ratio, *extra, clip=0.2, **options):
    a, (b, c) = ratio, (1, 2)
    for step in range(3):
        total += step
    kept = [item for item in extra]
    def inner(x): return x
    self.attribute = mentioned_only
    return {"grpo/tag": a}
"""
    tree = ast.parse(source)
    assert defined_names(tree.body[0]) == {"Config", "horizon"}
    assert defined_names(tree.body[1]) == {
        "loss",
        "ratio",
        "extra",
        "clip",
        "options",
        "a",
        "b",
        "c",
        "step",
        "total",
        "kept",
        "item",
        "inner",
        "x",
    }


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
    path.write_text(
        "global_step,wall_time_s,losses/explained_variance,eval/return_mean\n"
        "256,0.1,0.5,\n512,0.2,,20.0\n768,0.3,-0.25,\nbad,0.4,0.9,\n"
    )
    steps, values = read_series(path, "losses/explained_variance")
    assert steps.tolist() == [256, 768] and values.tolist() == [0.5, -0.25]
    assert read_series(path, "grpo/frac_zero_std_groups")[0].size == 0
    assert read_series(tmp_path / "missing.csv", "eval/return_mean")[0].size == 0
