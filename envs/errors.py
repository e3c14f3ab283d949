"""The one error type for bad input, and how its messages quote what the user gave."""

from __future__ import annotations

import reprlib
from typing import Any

QUOTE_LIMIT = 200
"""The most characters of a user's value that an error message quotes."""


class BadInput(ValueError):
    """Input the user can fix: an unknown id, a missing extra, an invalid setting.

    The message always says how to fix the problem.
    """


def brief(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` cut to at most ``limit`` characters, built without expanding the whole value: a
    nested or aliased structure (a YAML alias bomb) is quoted by its first few levels and items."""
    quoter = reprlib.Repr()
    quoter.maxlevel, quoter.maxdict, quoter.maxlist, quoter.maxtuple, quoter.maxset = 3, 6, 6, 6, 6
    quoter.maxstring = quoter.maxother = quoter.maxlong = limit
    text = quoter.repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
