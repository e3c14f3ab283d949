"""An mkdocs hook: equations typeset by MathJax, served from the site itself.

The pages write TeX between ``\\(`` ``\\)`` (inline) and ``\\[`` ``\\]`` or ``$$`` (display); arithmatex
(pymdown-extensions, generic mode) keeps it in ``<span class="arithmatex">`` and ``<div class="arithmatex">``, and
MathJax 3 typesets it in the reader's browser. MathJax's files come from a PyPI package,
``django-static-mathjax`` (the ``dev`` extra; a copy of MathJax's own distribution, nothing of Django is used):
this hook adds to the site the one combined component it needs, TeX input with every extension and CommonHTML
output (``tex-chtml-full.js``, so that no extension is fetched later), the web fonts that component loads from
beside itself, and MathJax's licence. Only the pages that hold an equation get the scripts. Nothing comes from the
network and nothing of MathJax is kept in the repository.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page
from mkdocs.utils import get_relative_url

SITE_FOLDER = "assets/mathjax"  # where the files land in the site
COMPONENT = "tex-chtml-full.js"
FONTS = "output/chtml/fonts/woff-v2"  # relative to the component: MathJax looks for its fonts there
MARKER = 'class="arithmatex"'

# arithmatex's generic mode writes \( \) and \[ \]; MathJax typesets only inside its elements.
CONFIG = """<script>
window.MathJax = {
  tex: {inlineMath: [["\\\\(", "\\\\)"]], displayMath: [["\\\\[", "\\\\]"]], processEscapes: true,
        processEnvironments: true},
  options: {ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex"}
};
</script>"""


def mathjax_root() -> Path:
    """The folder of MathJax's distribution that the package installs."""
    spec = find_spec("mathjax")
    root = Path(next(iter(spec.submodule_search_locations or []), "")) / "static" / "mathjax" if spec else None
    if root is None or not (root / "es5" / COMPONENT).is_file():
        raise PluginError("MathJax is not installed: pip install -e '.[dev]' (it brings django-static-mathjax)")
    return root


def on_files(files: Files, config: Any) -> Files:
    root = mathjax_root()
    sources = [(root / "es5" / COMPONENT, COMPONENT), (root / "LICENSE", "LICENSE")]
    sources += [(font, f"{FONTS}/{font.name}") for font in sorted((root / "es5" / FONTS).glob("*.woff"))]
    for path, name in sources:
        files.append(File.generated(config, f"{SITE_FOLDER}/{name}", abs_src_path=str(path)))
    return files


def on_post_page(output: str, page: Page, config: Any) -> str:
    if MARKER not in output:
        return output
    script = get_relative_url(f"{SITE_FOLDER}/{COMPONENT}", page.url)
    tags = f'{CONFIG}\n<script defer src="{script}"></script>\n'
    return output.replace("</head>", tags + "</head>", 1)
