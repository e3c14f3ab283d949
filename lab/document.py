"""A document as one list of blocks, rendered as Markdown and as standalone HTML, and numbers as the reports
print them. The bench, credit and tuning reports build such lists, so that their Markdown and HTML always
say the same thing."""

from __future__ import annotations

import base64
import csv
import html
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

DASH = "—"


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Para:
    text: str
    """Plain text; `backticks` mark code."""


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Image:
    path: str
    """Relative to the bench directory."""
    alt: str
    caption: str = ""
    """Shown under the image: what it shows (statistic, CI, runs). Empty: the alt text is shown."""

    @property
    def shown_caption(self) -> str:
        return self.caption or self.alt


@dataclass
class Code:
    text: str
    language: str = ""


Block = Heading | Para | Bullets | Table | Image | Code


def _md_cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_markdown(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append(f"{'#' * block.level} {block.text}")
        elif isinstance(block, Para):
            out.append(block.text)
        elif isinstance(block, Bullets):
            out.append("\n".join(f"- {item}" for item in block.items))
        elif isinstance(block, Table):
            lines = ["| " + " | ".join(map(_md_cell, block.header)) + " |"]
            lines.append("|" + "|".join("---" for _ in block.header) + "|")
            lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in block.rows]
            out.append("\n".join(lines))
        elif isinstance(block, Image):
            caption = " ".join(block.shown_caption.split()).replace("*", "\\*")
            out.append(f"![{block.alt}]({quote(block.path)})\n\n*{caption}*")
        elif isinstance(block, Code):
            out.append(f"```{block.language}\n{block.text.rstrip()}\n```")
    return "\n\n".join(out) + "\n"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """One table as :func:`render_markdown` writes it, with no closing newline, for text written around it."""
    return render_markdown([Table(header, rows)]).rstrip("\n")


def _html_text(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


HTML_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 70em; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f3f3f3; }
img { max-width: 100%; }
code { background: #f3f3f3; padding: 0 0.2em; }
figure { margin: 1em 0 2em; }
figcaption { color: #555; font-size: 0.92em; margin-top: 0.3em; }
"""


def render_html(blocks: Sequence[Block], title: str, base_dir: Path) -> str:
    """The same document as HTML; PNGs inline as base64 data URIs, so the file stands alone."""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{HTML_STYLE}</style></head><body>",
    ]
    for block in blocks:
        if isinstance(block, Heading):
            out.append(f"<h{block.level}>{_html_text(block.text)}</h{block.level}>")
        elif isinstance(block, Para):
            out.append(f"<p>{_html_text(block.text)}</p>")
        elif isinstance(block, Bullets):
            out.append("<ul>" + "".join(f"<li>{_html_text(item)}</li>" for item in block.items) + "</ul>")
        elif isinstance(block, Table):
            head = "".join(f"<th>{_html_text(cell)}</th>" for cell in block.header)
            body = "".join(
                "<tr>" + "".join(f"<td>{_html_text(cell)}</td>" for cell in row) + "</tr>" for row in block.rows
            )
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif isinstance(block, Image):
            data = base64.b64encode((base_dir / block.path).read_bytes()).decode("ascii")
            out.append(
                f'<figure><img alt="{html.escape(block.alt)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{_html_text(block.shown_caption)}</figcaption></figure>"
            )
        elif isinstance(block, Code):
            out.append(f"<pre><code>{html.escape(block.text.rstrip())}</code></pre>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# ── numbers as the report prints them ────────────────────────────────────────────────────────────


def fmt_return(value: float | None) -> str:
    return DASH if value is None or not math.isfinite(value) else f"{value:.2f}"


def fmt_ci(low: float, high: float) -> str:
    return f"[{low:.2f}, {high:.2f}]"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 seed``, ``3 seeds``, ``1 process``, ``2 processes``: the count and its noun, plural unless n is 1."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def fmt_steps(value: float | None) -> str:
    return DASH if value is None else f"{round(value):,}"


def fmt_seconds(value: float | None) -> str:
    return DASH if value is None else f"{value:.1f} s"


def fmt_duration(seconds: float) -> str:
    """``45s``, ``1m20s``, ``2h05m``: an elapsed time or an ETA, at the precision a person reads one."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def fmt_sig(value: float | None, digits: int = 4) -> str:
    """A number to ``digits`` significant digits, as a report prints a tuned value (0.000123456789 → 0.0001235,
    1e-08 → 1e-8); the files that hold the values keep them in full."""
    if value is None or not math.isfinite(value):
        return DASH
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{value:.{digits}g}")


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """A CSV file of ``rows``, its columns those of the first row."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def safe_name(env_id: str) -> str:
    """An env id as a file name: ids may contain '/', which benches write as '_'."""
    return env_id.replace("/", "_")
