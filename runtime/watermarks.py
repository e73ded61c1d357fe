"""Event-time watermarks: per source split, max event time - max_out_of_orderness; the job's
watermark is the minimum over active splits, never goes back, and is +inf once every
event-time source is exhausted. A split with no new records for `idle_timeout` leaves the
minimum until it produces again.

Keyed operators that read another keyed operator's output (a window over a window, a join
of a window) run with a watermark of their own, as a Flink operator does with the watermark
its input forwarded. An operator fires what it holds at or before the watermark it runs
with, and what it fires carries an event time at or before it (a window's result: the
window end - 1 ms). So in the epoch in which an upstream operator fires, a downstream one
must judge those results against the watermark from before the firing, or they would all
be late: a downstream operator runs epoch e with the upstream's *output* watermark after
epoch e - 1, which is the watermark the upstream ran with then, less what the upstream may
still emit behind it (`OperatorChain.hold_ms`: a window's allowed lateness, an interval
join's bound). An operator whose input comes straight from sources (through stateless
operators only) runs with the job's watermark, as before. The output watermarks are kept
in checkpoints and savepoints with the tracker (`to_json`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streamer.pipeline.spec import SourceSpec

MIN_WATERMARK = -(2**62)
MAX_WATERMARK = 2**62


@dataclass
class _Split:
    max_ts: int | None = None
    last_active_ms: int = 0


@dataclass(frozen=True)
class OperatorChain:
    """Where a keyed operator's watermark comes from: the keyed operators whose output it
    reads (through stateless operators), whether some of its input comes from sources
    without a keyed operator between, and how far its own output watermark stays behind the
    watermark it ran with (what it may still emit behind it)."""

    upstream: tuple[str, ...] = ()
    from_sources: bool = True
    hold_ms: int = 0


def operator_chains(spec: Any) -> dict[str, OperatorChain]:
    """The `OperatorChain` of every keyed operator of the pipeline `spec`."""
    chains = {}
    for op in spec.operators:
        if not op.stateful:
            continue
        upstream: set[str] = set()
        sourced = False
        for i in op.inputs:
            keyed, from_source = spec.keyed_behind(i)
            upstream |= keyed
            sourced |= from_source
        chains[op.id] = OperatorChain(tuple(sorted(upstream)), sourced or not upstream,
                                      op.watermark_hold_ms)
    return chains


@dataclass
class WatermarkTracker:
    """Tracks split maxima across epochs; `current` is the job watermark in epoch ms."""

    sources: Mapping[str, SourceSpec]
    splits: dict[tuple[str, str], _Split] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    current: int = MIN_WATERMARK
    #: Keyed node id -> where its watermark comes from (`operator_chains`).
    chains: Mapping[str, OperatorChain] = field(default_factory=dict)
    #: Keyed node id -> its output watermark after the epochs run so far.
    outputs: dict[str, int] = field(default_factory=dict)

    def for_operators(self) -> dict[str, int]:
        """The watermark each keyed operator runs the next epoch with: the job's for those
        fed by sources alone, else the least output watermark of the keyed operators (and
        sources) they read."""
        out = {}
        for node_id, chain in self.chains.items():
            marks = [self.outputs.get(u, MIN_WATERMARK) for u in chain.upstream]
            if chain.from_sources:
                marks.append(self.current)
            out[node_id] = min(marks)
        return out

    def operators_ran(self, watermarks: Mapping[str, int]) -> None:
        """Keyed operators ran an epoch with these watermarks (`for_operators`): their
        output watermarks follow, never going back."""
        for node_id, wm in watermarks.items():
            chain = self.chains.get(node_id)
            if chain is None:
                continue
            out = wm if wm in (MIN_WATERMARK, MAX_WATERMARK) else wm - chain.hold_ms
            self.outputs[node_id] = max(self.outputs.get(node_id, MIN_WATERMARK), out)

    def observe(self, source: str, maxima: Mapping[str, int | None], now_ms: int) -> None:
        """Record the epoch's max event time per split of `source` (None: no records)."""
        for split, ts in maxima.items():
            state = self.splits.setdefault((source, split), _Split(last_active_ms=now_ms))
            if ts is not None:
                state.max_ts = ts if state.max_ts is None else max(state.max_ts, ts)
                state.last_active_ms = now_ms

    def finish(self, source: str) -> None:
        """A bounded source is exhausted: it no longer holds the watermark back."""
        self.finished.add(source)

    def advance(self, now_ms: int) -> int:
        """Recompute the job watermark after an epoch; returns it."""
        candidates: list[int] = []
        for sid, spec in self.sources.items():
            if not spec.event_time or sid in self.finished:
                continue
            wm = spec.watermark
            ooo = wm.max_out_of_orderness_ms if wm else 0
            idle = wm.idle_timeout_ms if wm else None
            active = [s for (src, _), s in self.splits.items() if src == sid and not (
                idle is not None and now_ms - s.last_active_ms >= idle)]
            if not active and any(src == sid for src, _ in self.splits):
                continue  # every split idle: the source does not hold the watermark back
            if not active or any(s.max_ts is None for s in active):
                candidates.append(MIN_WATERMARK)  # a split has not produced yet
                continue
            candidates.append(min(s.max_ts for s in active if s.max_ts is not None) - ooo)
        has_event_sources = any(s.event_time for s in self.sources.values())
        if candidates:
            self.current = max(self.current, min(candidates))
        elif has_event_sources and all(sid in self.finished for sid, s in self.sources.items()
                                       if s.event_time):
            self.current = MAX_WATERMARK
        return self.current

    # ------------------------------------------------------------------ checkpoints
    def to_json(self) -> dict[str, Any]:
        """The tracker's state for a checkpoint: per split its max event time and last
        activity, the finished sources and the current watermark."""
        return {"current": self.current, "finished": sorted(self.finished),
                "splits": [[src, split, s.max_ts, s.last_active_ms]
                           for (src, split), s in sorted(self.splits.items())],
                "operators": dict(sorted(self.outputs.items()))}

    def restore(self, data: Mapping[str, Any], now_ms: int) -> None:
        """Continue from a checkpoint's tracker state (sources by their current ids). An
        idle clock restarts at `now_ms`: the downtime does not make a split idle."""
        self.current = int(data.get("current", MIN_WATERMARK))
        self.finished = {str(s) for s in data.get("finished", [])
                         if s in self.sources}
        # (Written before operators had watermarks of their own: a chained operator starts
        # from the least, so the first epoch judges nothing of its input late.)
        self.outputs = {str(k): int(v) for k, v in data.get("operators", {}).items()
                        if k in self.chains}
        self.splits = {}
        for src, split, max_ts, _ in data.get("splits", []):
            if src in self.sources:
                self.splits[(src, split)] = _Split(max_ts=max_ts, last_active_ms=now_ms)
