"""A keyed process function for tests/runtime/test_bad_records.py: per key, the number of
records it has seen, emitted with every record."""

from __future__ import annotations

from typing import Any

from streamer.operators.process import KeyedProcessFunction, ValueState


class CountPerKey(KeyedProcessFunction):
    """Emits (user, seen so far, the record's event time in ms) for every record."""

    output_schema = "user string, seen bigint, at bigint"

    def open(self, ctx: Any) -> None:
        """The key's count."""
        self.seen = ctx.get_state(ValueState("seen"))

    def process_element(self, row: dict[str, Any], ctx: Any) -> Any:
        """Count the record and emit the count."""
        seen = (self.seen.value() or 0) + 1
        self.seen.update(seen)
        yield {"user": row["user"], "seen": seen, "at": ctx.timestamp}
