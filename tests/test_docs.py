"""The documentation site (mkdocs.yml, docs/): it builds in strict mode, loads nothing from the network, the guide's
equations are typeset by MathJax served from the site itself, no block of the guide is wider than the page, and the
API reference renders every module with its equations."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
GUIDE = ROOT / "docs" / "ppo_and_grpo.md"
PACKAGES = ("agents", "envs", "lab")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The site built as CI builds it: `mkdocs build --strict`, into a temporary folder; (folder, build log)."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # the theme's notice about its successor, not a build warning
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{log[-6000:]}"
    return out, log


def test_the_site_builds_in_strict_mode_without_a_warning(site: tuple[Path, str]) -> None:
    out, log = site
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert not warnings, "\n".join(warnings)
    for page in [
        "index.html",
        "ppo_and_grpo/index.html",
        "design/index.html",
        "reference/agents/index.html",
        "search/search_index.json",
    ]:
        assert (out / page).is_file(), f"the site lacks {page}"


def test_a_built_page_loads_nothing_from_the_network(site: tuple[Path, str]) -> None:
    # Scripts, stylesheets, fonts and images come from the site itself: it works offline.
    remote = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.IGNORECASE)
    offenders = [
        f"{page.relative_to(site[0])}: {match.group(0)[:120]}"
        for page in site[0].rglob("*.html")
        for match in remote.finditer(page.read_text(encoding="utf-8"))
    ]
    assert not offenders, "\n".join(offenders[:10])


def test_the_guide_typesets_its_equations_with_mathjax_served_from_the_site(site: tuple[Path, str]) -> None:
    out = site[0]
    page = (out / "ppo_and_grpo" / "index.html").read_text(encoding="utf-8")
    # arithmatex keeps the TeX in its own elements, which MathJax typesets: display blocks and inline spans.
    blocks = re.findall(r'<div class="arithmatex">(.*?)</div>', page, re.DOTALL)
    spans = re.findall(r'<span class="arithmatex">(.*?)</span>', page, re.DOTALL)
    assert len(blocks) >= 8 and len(spans) >= 100, (len(blocks), len(spans))
    math = "\n".join(blocks + spans)
    for objective in [
        r"\mathcal{L}_{\text{PPO}}",
        r"\mathcal{L}_{\text{GRPO}}",
        r"\delta_t &amp;= r_t",
        r"k_1 = -\log",
        r"k_2 = \frac{1}{2}",
        r"k_3 = \frac{q(x)}{p(x)}",
        r"\hat A_i^{\text{outcome}}",
        r"\text{step (DAPO)}",
        r"\nabla_\theta J(\theta)",
    ]:
        assert objective in math, f"the guide's page does not typeset {objective}"
    # The renderer: one script, by a relative URL, that resolves to a file of the site; its fonts beside it.
    scripts = re.findall(r'<script[^>]*\bsrc="([^"]*mathjax[^"]*)"', page)
    assert scripts == ["../assets/mathjax/tex-chtml-full.js"], scripts
    assert (out / "ppo_and_grpo" / scripts[0]).resolve().is_file()
    assert "window.MathJax" in page and 'processHtmlClass: "arithmatex"' in page
    fonts = out / "assets" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2"
    assert (fonts / "MathJax_Main-Regular.woff").is_file() and (fonts / "MathJax_Math-Italic.woff").is_file()
    assert (out / "assets" / "mathjax" / "LICENSE").is_file()
    # A page without an equation does not load it.
    assert "mathjax" not in (out / "index.html").read_text(encoding="utf-8").lower()


CODE_WIDTH = 100  # characters of a code line; about what the content column holds at the theme's default width
MATH_WIDTH = 72  # glyphs of one row of a display equation, estimated by glyph_width below


def glyph_width(row: str) -> int:
    """About how many glyphs one row of TeX renders as: a fraction as wide as its wider part, a subscript or a
    font command as its content, every other command one glyph, a relation or a binary operator two (its spacing),
    \\quad two and \\qquad four; TeX's own spaces count for nothing."""
    row = re.sub(r"\\(?:begin|end)\{[^{}]*\}|\\(?:left|right|[bB]igg?)\b|&", "", row)
    row = re.sub(r"\\(?:text|operatorname\*?|mathrm|mathcal|mathbb|hat|bar|tilde)\s*(?=\{|\w)", "", row)
    frac = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
    group = re.compile(r"(?<![}a-z])\{([^{}]*)\}")
    while True:
        simpler = group.sub(r"\1", frac.sub(lambda m: max(m[1], m[2], key=glyph_width), row))
        if simpler == row:
            break
        row = simpler
    row = re.sub(r"\\qquad\b", "~~~~", row)
    row = re.sub(r"\\quad\b", "~~", row)
    row = re.sub(r"\\[,;:! ]", "", row)
    row = re.sub(r"\\(?:le|ge|ne|mid|cdot|times|in|approx)\b|[=<>+-]", "~~", row)
    row = re.sub(r"\\[A-Za-z]+", "~", row)
    return len(re.sub(r"\s|[_^{}]", "", row))


def test_no_code_or_math_block_of_the_guide_is_wider_than_the_page() -> None:
    text = GUIDE.read_text()
    code = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    # An indented code block: lines of four spaces after a blank line that does not continue a list item.
    indented = re.findall(r"(?:^|\n)[^-\d\s][^\n]*\n\n((?: {4}[^\n]*\n)+)", text)
    long_code = [line for block in code + indented for line in block.splitlines() if len(line) > CODE_WIDTH]
    assert not long_code, f"code lines over {CODE_WIDTH} characters: break them, or typeset them as math: {long_code}"
    displays = re.findall(r"^\$\$\n(.*?)\n\$\$$", text, re.DOTALL | re.MULTILINE)
    assert len(displays) >= 8
    long_source = [line for block in displays for line in block.splitlines() if len(line) > CODE_WIDTH]
    assert not long_source, f"display math lines over {CODE_WIDTH} characters: {long_source}"
    wide = [
        (glyph_width(row), row.strip()[:80])
        for block in displays
        for row in block.split("\\\\")
        if glyph_width(row) > MATH_WIDTH
    ]
    assert not wide, f"display rows wider than {MATH_WIDTH} glyphs: break them at a \\\\ (aligned): {wide}"


def test_glyph_width_counts_what_renders() -> None:
    assert glyph_width(r"\frac{\pi_\theta(a)}{\pi_{\text{old}}(a)}") == len("πold(a)")  # the wider part
    assert glyph_width(r"x = y") == 4
    assert glyph_width(r"\hat A_{i,t} \qquad k") == len("Ai,t") + 4 + 1


def test_the_api_reference_renders_the_math_with_anchors_and_source(site: tuple[Path, str]) -> None:
    agents = (site[0] / "reference" / "agents" / "index.html").read_text(encoding="utf-8")
    for anchor in [
        "agents.advantages.gae",
        "agents.losses.clipped_surrogate",
        "agents.losses.k3_kl",
        "agents.grpo.GRPOConfig.clip_high",
        "agents.training.Trainer",
    ]:
        assert f'id="{anchor}"' in agents, f"no anchor {anchor} in the API reference"
    # GAE's equation, as its docstring writes it (Unicode; no math renderer needed), and its source one click away.
    assert "δ_t = r_t + γ · (1 − terminated_t) · V(s_{t+1}) − V(s_t)" in agents
    assert "Source code in" in agents
    # The math modules come first on the page.
    assert agents.index('id="agents.advantages"') < agents.index('id="agents.losses"') < agents.index('id="agents.ppo"')


def hook(name: str) -> Any:
    """The mkdocs hook ``docs/hooks/<name>.py``, imported as the build imports it (by its path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "hooks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_module_is_in_the_api_reference() -> None:
    # A page's `::: module` lines, and the algorithm modules the registry lists, which the algorithms hook writes
    # where the page holds its marker: a new algorithm needs no line of its own here.
    directive = re.compile(r"^::: ([\w.]+)\s*$", re.MULTILINE)
    algorithms = hook("algorithms")
    pages = [page.read_text() for page in REFERENCE.glob("*.md")]
    assert sum(algorithms.MARKER in text for text in pages) == 1, "docs/reference/agents.md lost the algorithms' marker"
    rendered = {m for text in pages for m in directive.findall(text)} | set(algorithms.algorithm_modules())
    on_disk = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for package in PACKAGES
        for path in (ROOT / package).glob("*.py")
        if path.stem not in ("__init__", "__main__")
    }
    missing = sorted(on_disk - rendered)
    assert not missing, f"add these modules to docs/reference/<package>.md as `::: module` lines: {missing}"
    gone = sorted(m for m in rendered - on_disk if m not in PACKAGES)
    assert not gone, f"docs/reference/ renders modules that no longer exist: {gone}"


def test_docstrings_become_markdown_that_keeps_their_blocks() -> None:
    """docs/hooks/docstrings.py, the Griffe extension the API reference renders docstrings through."""
    module = hook("docstrings")
    text = (
        "As :func:`normalize` does::\n\n    Â = (A − μ) / σ\n\nSymbols:\n    r_t   reward   ``rewards``\n"
        "What it estimates:\n- its value;\n- its gradient.\n 1. one;  2. two"
    )
    assert module.to_markdown(text).splitlines() == [
        "As `normalize` does:",
        "",
        "    Â = (A − μ) / σ",
        "",
        "Symbols:",
        "",
        "    r_t   reward   rewards",
        "What it estimates:",
        "",
        "- its value;",
        "- its gradient.",
        " 1. one;  2. two",
    ]
