"""The grammar of an aggregate call in a pipeline file: `count()`, `sum(amount)`,
`max_by(bid, price)`, `count(distinct bidder)`, each optionally followed by a Flink SQL
`filter (where <condition>)`; which functions exist and how many arguments each takes."""

from __future__ import annotations

import re
from dataclasses import dataclass

AGGREGATES = {  # name -> number of arguments (-1: one or more)
    "count": 0, "sum": 1, "min": 1, "max": 1, "avg": 1, "first": 1, "last": 1,
    "collect_list": 1, "count_distinct": -1, "max_by": 2, "min_by": 2,
}
_AGG_CALL = re.compile(r"^\s*([A-Za-z_]\w*)\s*\(", re.S)
_DISTINCT = re.compile(r"^distinct\b\s*", re.I)
_FILTER = re.compile(r"^filter\s*\(\s*where\b", re.I)


@dataclass(frozen=True)
class AggregateCall:
    """One parsed call: `count(distinct x) filter (where p > 0)` is function "count",
    distinct, arg "x", filter "p > 0"."""

    function: str
    arg: str | None
    #: Written with SQL's DISTINCT keyword (`count(distinct x)`).
    distinct: bool = False
    #: The condition of a `filter (where ...)` clause, as written.
    filter: str | None = None

    @property
    def resolved(self) -> str:
        """The function the spec runs: `count(distinct x)` is `count_distinct(x)`."""
        return "count_distinct" if self.distinct and self.function == "count" else self.function


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


def _closing(text: str, opening: int) -> int | None:
    """The index of the parenthesis that closes the one at `opening`, outside quotes."""
    depth, quote = 0, ""
    for i in range(opening, len(text)):
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
                return i
    return None


def parse_call(text: str) -> AggregateCall | None:
    """`sum(amount)` -> AggregateCall("sum", "amount"); `count()` and `count(*)` have no
    argument; None unless the text is exactly one call (`max(x) - min(x)` is two), with at
    most a `filter (where ...)` clause after it."""
    match = _AGG_CALL.match(text)
    if not match:
        return None
    end = _closing(text, match.end() - 1)
    if end is None:
        return None
    arg = text[match.end():end].strip()
    distinct = _DISTINCT.match(arg)
    if distinct:
        arg = arg[distinct.end():].strip()
    rest, condition = text[end + 1:].strip(), None
    if rest:
        clause = _FILTER.match(rest)
        if not clause:
            return None
        close = _closing(rest, rest.index("("))
        if close is None or rest[close + 1:].strip():
            return None
        condition = rest[clause.end():close].strip()
        if not condition:
            return None
    return AggregateCall(match.group(1).lower(), arg or None if arg != "*" else None,
                         bool(distinct), condition)


def parse_aggregate(text: str) -> tuple[str, str | None] | None:
    """`sum(amount)` -> ("sum", "amount"); `count()` -> ("count", None); `count(distinct x)`
    -> ("count_distinct", "x"); None unless the text is one call (see `parse_call`)."""
    call = parse_call(text)
    return None if call is None else (call.resolved, call.arg)
