"""The documentation site (mkdocs.yml, docs/): it builds in strict mode, loads nothing from the network, and its API
reference renders every module with its equations."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
PACKAGES = ("agents", "envs", "lab")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The site built as CI builds it: `mkdocs build --strict`, into a temporary folder; (folder, build log)."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # the theme's notice about its successor, not a build warning
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{log[-6000:]}"
    return out, log


def test_the_site_builds_in_strict_mode_without_a_warning(site: tuple[Path, str]) -> None:
    out, log = site
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert not warnings, "\n".join(warnings)
    for page in ["index.html", "ppo_and_grpo/index.html", "design/index.html", "reference/agents/index.html",
                 "search/search_index.json"]:  # fmt: skip
        assert (out / page).is_file(), f"the site lacks {page}"


def test_a_built_page_loads_nothing_from_the_network(site: tuple[Path, str]) -> None:
    # Scripts, stylesheets, fonts and images come from the site itself: it works offline.
    remote = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.IGNORECASE)
    offenders = [f"{page.relative_to(site[0])}: {match.group(0)[:120]}" for page in site[0].rglob("*.html")
                 for match in remote.finditer(page.read_text(encoding="utf-8"))]  # fmt: skip
    assert not offenders, "\n".join(offenders[:10])


def test_the_api_reference_renders_the_math_with_anchors_and_source(site: tuple[Path, str]) -> None:
    agents = (site[0] / "reference" / "agents" / "index.html").read_text(encoding="utf-8")
    for anchor in ["agents.advantages.gae", "agents.losses.clipped_surrogate", "agents.losses.k3_kl",
                   "agents.grpo.GRPOConfig.clip_high", "agents.training.Trainer"]:  # fmt: skip
        assert f'id="{anchor}"' in agents, f"no anchor {anchor} in the API reference"
    # GAE's equation, as its docstring writes it (Unicode; no math renderer needed), and its source one click away.
    assert "δ_t = r_t + γ · (1 − terminated_t) · V(s_{t+1}) − V(s_t)" in agents
    assert "Source code in" in agents
    # The math modules come first on the page.
    assert agents.index('id="agents.advantages"') < agents.index('id="agents.losses"') < agents.index('id="agents.ppo"')


def test_every_module_is_in_the_api_reference() -> None:
    directive = re.compile(r"^::: ([\w.]+)\s*$", re.MULTILINE)
    rendered = {m for page in REFERENCE.glob("*.md") for m in directive.findall(page.read_text())}
    on_disk = {".".join(path.relative_to(ROOT).with_suffix("").parts) for package in PACKAGES
               for path in (ROOT / package).glob("*.py") if path.stem not in ("__init__", "__main__")}  # fmt: skip
    missing = sorted(on_disk - rendered)
    assert not missing, f"add these modules to docs/reference/<package>.md as `::: module` lines: {missing}"
    gone = sorted(m for m in rendered - on_disk if m not in PACKAGES)
    assert not gone, f"docs/reference/ renders modules that no longer exist: {gone}"


def test_docstrings_become_markdown_that_keeps_their_blocks() -> None:
    """docs/hooks/docstrings.py, the Griffe extension the API reference renders docstrings through."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docstrings", ROOT / "docs" / "hooks" / "docstrings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = ("As :func:`normalize` does::\n\n    Â = (A − μ) / σ\n\nSymbols:\n    r_t   reward   ``rewards``\n"
            "What it estimates:\n- its value;\n- its gradient.\n 1. one;  2. two")  # fmt: skip
    assert module.to_markdown(text).splitlines() == [
        "As `normalize` does:", "", "    Â = (A − μ) / σ", "",
        "Symbols:", "", "    r_t   reward   rewards",
        "What it estimates:", "", "- its value;", "- its gradient.", " 1. one;  2. two",
    ]  # fmt: skip


def test_each_algorithm_reads_top_to_bottom_in_one_file_of_at_most_350_lines() -> None:
    # STYLE.md's limit: PPO, GRPO and the SB3 adapter each in one file a reader can hold.
    for name in ("ppo.py", "grpo.py", "sb3.py"):
        lines = len((ROOT / "agents" / name).read_text().splitlines())
        assert lines <= 350, f"agents/{name} has {lines} lines; move shared pure functions to their modules"
