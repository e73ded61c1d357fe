"""The spec half of OVER windows (the keyed kind `operators.over`): YAML keys and spec.

    key_by: [seller]
    over: {rows: 10}             # or {range: 1h}
    aggregate: {avg_price: avg(price)}

As Flink SQL's `avg(price) OVER (PARTITION BY seller ORDER BY rowtime ROWS BETWEEN 9
PRECEDING AND CURRENT ROW)` (or `RANGE BETWEEN INTERVAL '1' HOUR PRECEDING AND CURRENT
ROW`): every record comes out once, in event-time order per key once the watermark passes
it, with each aggregate over its key's last `rows` records up to it (or those within
`range` before it), itself included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streamer.pipeline.model import Duration, Field, Int, Obj, OneOrList, Str
from streamer.pipeline.schema_base import COLUMN_HINT, COLUMN_PATTERN

#: The aggregate functions an OVER window computes.
OVER_FUNCTIONS = ("count", "sum", "avg", "min", "max")

OVER = Obj(
    {
        "rows": Field(Int("The aggregates cover the key's last this many records, the current "
                          "one included (ROWS BETWEEN n - 1 PRECEDING AND CURRENT ROW).",
                          minimum=1)),
        "range": Field(Duration("The aggregates cover the key's records at most this long "
                                "before the current one's event time, and it (RANGE BETWEEN "
                                "... PRECEDING AND CURRENT ROW).")),
        "order_by": Field(OneOrList(Str(pattern=COLUMN_PATTERN, pattern_hint=COLUMN_HINT),
                                    "Columns that order records of the same event time "
                                    "(ascending; then arrival), so ties come out the same in "
                                    "every run.", noun="column")),
    },
    "An OVER window per key: each record with aggregates over the records before it; exactly "
    "one of rows, range.",
)


@dataclass(frozen=True)
class OverSpec:
    """`rows` records, or `range_ms` of event time, up to and including the current one."""

    rows: int | None = None
    range_ms: int | None = None
    #: What orders records of one event time (then arrival).
    order_by: tuple[str, ...] = ()


def build_over(raw: Mapping[str, Any], ms: Any) -> OverSpec:
    """The spec of a validated `over:` mapping (`ms` parses a duration)."""
    order = raw.get("order_by")
    order_by = () if order is None else tuple(order) if isinstance(order, list) else (order,)
    if "rows" in raw:
        return OverSpec(rows=int(raw["rows"]), order_by=order_by)
    return OverSpec(range_ms=ms(raw["range"], None), order_by=order_by)
