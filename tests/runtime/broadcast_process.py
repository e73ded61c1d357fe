"""A process function for tests/runtime/test_broadcast.py: each record reports the broadcast
rules its subtask had when it was processed, and its key group (which names the subtask)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from streamer.operators.process import Context, KeyedProcessFunction, MapState


class SeenRules(KeyedProcessFunction):
    """Broadcast state: rule name -> value; outputs (k, n, kg, rules seen, their total)."""

    output_schema = "k string, n bigint, kg int, rules string, total bigint"

    def open(self, ctx: Context) -> None:
        self.rules = ctx.broadcast_state(MapState("rules"))

    def process_broadcast_element(self, row: dict[str, Any], ctx: Context) -> Iterator[dict]:
        self.rules.put(row["name"], row["value"])
        return iter(())

    def process_element(self, row: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        items = self.rules.items()
        yield {"k": row["k"], "n": row["n"], "kg": ctx.key_group,
               "rules": ",".join(name for name, _ in items),
               "total": sum(value for _, value in items)}
