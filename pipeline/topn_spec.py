"""The spec half of top-N (the keyed kind `operators.topn`; its YAML keys are
`operator_model.TopNModel`): the frozen spec and its builder.

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
from dataclasses import dataclass

from streamer.pipeline.operator_model import ORDER_PATTERN, TopNModel
from streamer.pipeline.yaml_model import as_tuple

_ORDER = re.compile(ORDER_PATTERN)


@dataclass(frozen=True)
class TopNSpec:
    """A top-N: `n` rows per key (and window) by `order_by`, ranked in `rank`."""

    n: int
    #: (column, descending) in order.
    order_by: tuple[tuple[str, bool], ...]
    rank: str = TopNModel.model_fields["rank"].default

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns that rank the rows."""
        return tuple(column for column, _ in self.order_by)


def build_top_n(model: TopNModel) -> TopNSpec:
    """The spec of a validated `top_n:` (`operator_model.TopNModel`)."""
    order = []
    for entry in as_tuple(model.order_by):
        assert _ORDER.fullmatch(entry)  # validated
        column, *direction = entry.split()
        order.append((column, bool(direction) and direction[0].lower() == "desc"))
    return TopNSpec(n=model.n, order_by=tuple(order), rank=model.rank)
