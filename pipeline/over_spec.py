"""The spec half of OVER windows (the keyed kind `operators.over`; its YAML keys are
`operator_model.OverModel`): the frozen spec and its builder.

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

from dataclasses import dataclass

from streamer.pipeline.operator_model import OverModel
from streamer.pipeline.yaml_model import as_tuple


@dataclass(frozen=True)
class OverSpec:
    """`rows` records, or `range_ms` of event time, up to and including the current one."""

    rows: int | None = None
    range_ms: int | None = None
    #: What orders records of one event time (then arrival).
    order_by: tuple[str, ...] = ()


def build_over(model: OverModel) -> OverSpec:
    """The spec of a validated `over:` (`operator_model.OverModel`)."""
    order_by = as_tuple(model.order_by)
    if model.rows is not None:
        return OverSpec(rows=model.rows, order_by=order_by)
    return OverSpec(range_ms=model.range, order_by=order_by)
