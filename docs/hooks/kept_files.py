"""An mkdocs hook: the site carries only the kept files its result pages link to.

``docs/results/files`` links to ``benchmarks/results``, so that a result page's links work on the
repository's own pages too; ``mkdocs.yml`` excludes that folder from the build, and this hook includes back
each file a page of ``docs/results/`` links to (its plots, its CSVs). Runs' kept curves and anything else no
page shows stay out of the site.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from mkdocs.structure.files import Files, InclusionLevel

LINK = re.compile(r"\]\((files/[^)\s#]+)")


def on_files(files: Files, config: Any) -> Files:
    pages = Path(config["docs_dir"]) / "results"
    linked = {f"results/{unquote(match)}" for page in pages.glob("*.md") for match in LINK.findall(page.read_text())}
    for file in files:
        if file.src_uri.startswith("results/files/") and file.src_uri in linked:
            file.inclusion = InclusionLevel.INCLUDED
    return files
