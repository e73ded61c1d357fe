"""A fraud rule for pipelines/fraud_detection.yaml: a tiny transaction followed within a minute
(event time) by a large one on the same account is suspicious (Flink's classic example)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from streamer.operators.process import Context, KeyedProcessFunction, ValueState

SMALL, LARGE, WINDOW_MS = 1.00, 500.00, 60_000


class SmallThenLarge(KeyedProcessFunction):
    """Alert on a large transaction that follows a small one within a minute."""

    output_schema = "account string, amount double, small_amount double, alert string"
    side_output_schemas = {"small": "account string, amount double"}

    def open(self, ctx: Context) -> None:
        """State: the pending small transaction (amount, time), and its timer."""
        self.small = ctx.get_state(ValueState("small"))
        self.timer = ctx.get_state(ValueState("timer"))

    def process_element(self, row: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        """Remember small transactions for a minute; flag a large one that follows.

        The watermark moves at epoch boundaries, so the timer alone cannot tell whether a
        record of the same epoch came within the minute: compare event times too.
        """
        assert ctx.timestamp is not None
        pending = self.small.value()
        if (pending is not None and row["amount"] > LARGE
                and ctx.timestamp - pending[1] <= WINDOW_MS):
            yield {"account": row["account"], "amount": row["amount"],
                   "small_amount": pending[0], "alert": "small-then-large"}
            self._reset(ctx)
        if row["amount"] < SMALL:
            ctx.output("small", {"account": row["account"], "amount": row["amount"]})
            if self.timer.value() is not None:
                ctx.delete_event_timer(self.timer.value())
            fire = ctx.timestamp + WINDOW_MS
            self.small.update((row["amount"], ctx.timestamp))
            self.timer.update(fire)
            ctx.register_event_timer(fire)

    def on_timer(self, timestamp: int, ctx: Context) -> Iterator[dict[str, Any]]:
        """The minute passed without a large transaction: forget the small one."""
        self.small.clear()
        self.timer.clear()
        return iter(())

    def _reset(self, ctx: Context) -> None:
        if self.timer.value() is not None:
            ctx.delete_event_timer(self.timer.value())
        self.small.clear()
        self.timer.clear()
