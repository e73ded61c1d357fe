"""A keyed process function for tests/runtime/test_chained_keyed.py: forwards every record,
so the window after it sees the records with their event time."""

from __future__ import annotations

from typing import Any

from streamer.operators.process import KeyedProcessFunction


class Forward(KeyedProcessFunction):
    """Emits (auction, price) for every record."""

    output_schema = "auction bigint, price bigint"

    def process_element(self, row: dict[str, Any], ctx: Any) -> Any:
        """Forward the record."""
        yield {"auction": row["auction"], "price": row["price"]}
