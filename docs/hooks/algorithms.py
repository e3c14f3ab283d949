"""An mkdocs hook: the API reference renders every algorithm module the registry lists, with no line per algorithm.

``docs/reference/agents.md`` holds :data:`MARKER` where the algorithms go; this hook writes there one ``::: module``
line per module of ``agents.registry.MODULES``, in its order. A new algorithm, registered by its one line there,
appears in the reference with nothing else to edit.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- the algorithms: one `::: module` per module of agents.registry.MODULES (docs/hooks/algorithms.py) -->"


def algorithm_modules() -> list[str]:
    """``agents.registry.MODULES``, read from the registry's source (the docs build imports nothing of the project)."""
    tree = ast.parse((ROOT / "agents" / "registry.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MODULES" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise LookupError("agents/registry.py has no MODULES")


def on_page_markdown(markdown: str, page: Page, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, "\n\n".join(f"::: {module}" for module in algorithm_modules()))
