"""Durations (`250ms`, `10s`, `5m`, `2h`, `1d`) as pipeline files write them."""

from __future__ import annotations

import re
from decimal import Decimal

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

DURATION_HINT = "a duration like '250ms', '10s', '5m', '2h' or '1d'"
#: A duration's JSON Schema pattern (the reference shows a key with it as "duration").
DURATION_PATTERN = r"^\s*\d+(\.\d+)?\s*(ms|s|m|h|d)\s*$"


def parse_duration_ms(text: object, *, whole: bool = True) -> int | None:
    """Milliseconds in a duration string, or None when it is not one (or, with `whole`,
    when it is not a whole number of milliseconds, like `0.5ms`).
    """
    if not isinstance(text, str):
        return None
    match = _DURATION.match(text)
    if not match:
        return None
    exact = Decimal(match.group(1)) * _DURATION_MS[match.group(2)]
    if whole and exact != exact.to_integral_value():
        return None
    return int(exact)


def parse_signed_duration_ms(text: object) -> int | None:
    """Like `parse_duration_ms`, with an optional leading `-` (a join's `between` bounds)."""
    if isinstance(text, str) and text.strip().startswith("-"):
        ms = parse_duration_ms(text.strip()[1:])
        return None if ms is None else -ms
    return parse_duration_ms(text)


def format_duration_ms(ms: int) -> str:
    """The shortest exact duration string for `ms` (inverse of `parse_duration_ms`, and of
    `parse_signed_duration_ms` for a negative `ms`)."""
    if ms < 0:
        return "-" + format_duration_ms(-ms)
    for unit in ("d", "h", "m", "s"):
        size = _DURATION_MS[unit]
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
