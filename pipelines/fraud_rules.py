"""Dynamic fraud thresholds for pipelines/fraud_rules.yaml: the thresholds arrive on a
broadcast input (`broadcast: thresholds`) and may change mid-stream; every subtask keeps them
all in broadcast state, and a transaction above its tier's threshold raises an alert.

A threshold record `{tier, threshold, ts}` takes effect at its event time `ts`; tier `*` is the
global threshold, for tiers without one of their own. Each tier keeps the history of its
thresholds, so a transaction is judged by the threshold in effect at its own event time,
whichever epoch the two records arrive in (the broadcast records of an epoch are applied
before its transactions).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from streamer.operators.process import Context, KeyedProcessFunction, MapState

GLOBAL = "*"


class TierThresholds(KeyedProcessFunction):
    """Alert on a transaction above the threshold of its account's tier."""

    output_schema = ("account string, tier string, amount double, threshold double, "
                     "alert string")

    def open(self, ctx: Context) -> None:
        """Broadcast state: tier -> [[effective from (ms), threshold], ...], sorted."""
        self.thresholds = ctx.broadcast_state(MapState("thresholds"))

    def process_broadcast_element(self, row: dict[str, Any], ctx: Context) -> Iterator[dict]:
        """Record a tier's new threshold from its event time on (the history grows by one
        entry per change: thresholds change rarely)."""
        assert ctx.timestamp is not None
        history = [h for h in self.thresholds.get(row["tier"]) or [] if h[0] != ctx.timestamp]
        self.thresholds.put(row["tier"],
                            sorted([*history, [ctx.timestamp, float(row["threshold"])]]))
        return iter(())

    def process_element(self, row: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        """Compare the amount with the tier's threshold at the record's event time."""
        assert ctx.timestamp is not None
        threshold = self._in_effect(row["tier"], ctx.timestamp)
        if threshold is None:
            threshold = self._in_effect(GLOBAL, ctx.timestamp)
        if threshold is not None and row["amount"] > threshold:
            yield {"account": row["account"], "tier": row["tier"], "amount": row["amount"],
                   "threshold": threshold, "alert": "above-threshold"}

    def _in_effect(self, tier: str, at_ms: int) -> float | None:
        found = [value for since, value in self.thresholds.get(tier) or [] if since <= at_ms]
        return found[-1] if found else None
