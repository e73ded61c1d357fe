"""The spec half of top-N (the keyed kind `operators.topn`): its YAML keys and the frozen spec.

    key_by: [auction]
    top_n: {n: 10, order_by: [price desc], rank: rank_number}
    window: {tumbling: 10s}      # optional: a top N per key and window

As Flink SQL's `ROW_NUMBER() OVER (PARTITION BY key ORDER BY ...) <= n`: per key (and
window), the n rows first by `order_by`; ties go to the earlier record (event time, then
arrival). Without a window the top rows change as records arrive: the output is an update
stream, one row per rank that changed (the old row taken back, the new one after it). With
a window, each window's top rows once, when it closes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streamer.pipeline.model import Field, Int, Obj, OneOrList, Str
from streamer.pipeline.schema_base import COLUMN_HINT, COLUMN_PATTERN

#: One `order_by` entry: a column, then optionally asc or desc.
ORDER_PATTERN = r"\s*[A-Za-z_][A-Za-z0-9_]*(\s+(?i:asc|desc))?\s*"
_ORDER = re.compile(ORDER_PATTERN)

TOP_N = Obj(
    {
        "n": Field(Int("How many rows per key (and window): ranks 1 to n.", minimum=1),
                   required=True),
        "order_by": Field(OneOrList(Str(pattern=ORDER_PATTERN,
                                        pattern_hint="'column' or 'column desc'"),
                                    "The columns that rank the rows, each asc (the default) "
                                    "or desc; ties go to the earlier record.",
                                    noun="column"), required=True),
        "rank": Field(Str("The output column of each row's rank, 1 to n (default rank).",
                          pattern=COLUMN_PATTERN, pattern_hint=COLUMN_HINT)),
    },
    "The first n rows per key (and window), as ROW_NUMBER() OVER (PARTITION BY key ORDER "
    "BY ...) <= n: an update stream without a window, each window's rows once with one.",
)


@dataclass(frozen=True)
class TopNSpec:
    """A top-N: `n` rows per key (and window) by `order_by`, ranked in `rank`."""

    n: int
    #: (column, descending) in order.
    order_by: tuple[tuple[str, bool], ...]
    rank: str = "rank"

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns that rank the rows."""
        return tuple(column for column, _ in self.order_by)


def build_top_n(raw: Mapping[str, Any]) -> TopNSpec:
    """The spec of a validated `top_n:` mapping."""
    entries = raw["order_by"] if isinstance(raw["order_by"], list) else [raw["order_by"]]
    order = []
    for entry in entries:
        assert _ORDER.fullmatch(entry)  # validated
        column, *direction = entry.split()
        order.append((column, bool(direction) and direction[0].lower() == "desc"))
    return TopNSpec(n=int(raw["n"]), order_by=tuple(order), rank=raw.get("rank", "rank"))
