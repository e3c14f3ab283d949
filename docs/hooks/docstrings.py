"""A Griffe extension for the API reference: the project's docstrings, written for `help()` and editors, rendered
faithfully as Markdown.

The docstrings write equations and symbol tables as indented Unicode blocks, sometimes right under a line such as
"Symbols:", sometimes after an RST "::", and cross-reference with RST roles (:func:`gae`). Markdown would fold an
indented block that follows a line of text into that paragraph, and print the roles as they are. This extension
only changes how the pages show a docstring, never the code:

- an indented block right under a line of text gets the blank line that makes it a code block, so its columns stay
  aligned;
- a bulleted list right under a line of text gets the blank line Markdown needs to see a list;
- an RST "::" becomes ":" (or goes, alone on its line);
- :func:`x`, :class:`x`, :meth:`x`, … become `x`;
- inside an indented block, which shows as code, ``name`` becomes name.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:func|class|meth|attr|data|mod|obj|exc|const|py:\w+):`~?([^`]+)`")
LITERAL = re.compile(r"``([^`]+)``")
BULLET = re.compile(r"^\s*[-*+]\s")


def indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def to_markdown(text: str) -> str:
    """The docstring ``text`` with its indented blocks set apart, its "::" markers dropped and its roles as code."""
    lines = ROLE.sub(r"`\1`", text).splitlines()
    out: list[str] = []
    fence = False
    block = False  # inside an indented block, which Markdown shows as code
    for line in lines:
        if line.lstrip().startswith("```"):
            fence = not fence
        stripped = line.rstrip()
        if not fence:
            if stripped.strip() == "::":
                stripped = ""
            elif stripped.endswith("::"):
                stripped = stripped[:-1]
            previous = out[-1] if out else ""
            if (
                stripped.strip()
                and previous.strip()
                and indent(stripped) >= indent(previous) + 4
                and not previous.lstrip().startswith(("-", "*"))
                and indent(previous) < 4
            ):
                out.append("")
                previous = ""
            if (
                BULLET.match(stripped)
                and previous.strip()
                and not BULLET.match(previous)
                and indent(previous) == 0
                and indent(stripped) < 4
            ):
                out.append("")
                previous = ""
            if not previous.strip() and indent(stripped) >= 4 and stripped.strip():
                block = block or not out or not out[-1].strip()
            elif stripped.strip() and indent(stripped) < 4:
                block = False
            if block:
                stripped = LITERAL.sub(r"\1", stripped)
        out.append(stripped)
    return "\n".join(out)


class MarkdownDocstrings(griffe.Extension):
    """Rewrites each docstring's text as above, once the object tree is complete."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
