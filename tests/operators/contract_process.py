"""A keyed process function for tests/operators/test_kind_contract.py: counts each key's
records in value state and emits the count from an event-time timer 5 s after the key's first
record (so state and timers cross a savepoint)."""

from __future__ import annotations

from typing import Any

from streamer.operators.process import KeyedProcessFunction, ValueState


class CountThenEmit(KeyedProcessFunction):
    """Per key: (auction, records) 5 s of event time after its first record."""

    output_schema = "auction bigint, records bigint"

    def open(self, ctx: Any) -> None:
        """Bind the count."""
        self.count = ctx.get_state(ValueState("count"))

    def process_element(self, row: dict[str, Any], ctx: Any) -> Any:
        """Count; the first record of a key sets the timer."""
        seen = self.count.value()
        if seen is None:
            ctx.register_event_timer(ctx.timestamp + 5_000)
        self.count.update((seen or 0) + 1)
        return []

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        """Emit the count and start over."""
        yield {"auction": ctx.key[0], "records": self.count.value()}
        self.count.clear()
