"""The grammar of an aggregate call in a pipeline file: `count()`, `sum(amount)`,
`max_by(bid, price)`; which functions exist and how many arguments each takes."""

from __future__ import annotations

import re

AGGREGATES = {  # name -> number of arguments
    "count": 0, "sum": 1, "min": 1, "max": 1, "avg": 1, "first": 1, "last": 1,
    "collect_list": 1, "count_distinct": 1, "max_by": 2, "min_by": 2,
}
_AGG_CALL = re.compile(r"^\s*([A-Za-z_]\w*)\s*\(", re.S)


def split_arguments(text: str) -> list[str]:
    """A call's argument text split at its top-level commas (`x, f(a, b)` -> two)."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"`":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def parse_aggregate(text: str) -> tuple[str, str | None] | None:
    """`sum(amount)` -> ("sum", "amount"); `count()` -> ("count", None); None unless the text
    is exactly one call (`max(x) - min(x)` is two).
    """
    match = _AGG_CALL.match(text)
    if not match:
        return None
    depth, quote = 0, ""
    for i in range(match.end() - 1, len(text)):
        ch = text[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                if text[i + 1:].strip():
                    return None
                arg = text[match.end():i].strip()
                return match.group(1).lower(), (arg or None if arg != "*" else None)
    return None
