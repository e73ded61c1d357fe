"""Event-time watermarks: per source split, max event time - max_out_of_orderness; the job's
watermark is the minimum over active splits, never goes back, and is +inf once every
event-time source is exhausted. A split with no new records for `idle_timeout` leaves the
minimum until it produces again."""

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


@dataclass
class WatermarkTracker:
    """Tracks split maxima across epochs; `current` is the job watermark in epoch ms."""

    sources: Mapping[str, SourceSpec]
    splits: dict[tuple[str, str], _Split] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    current: int = MIN_WATERMARK

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
                           for (src, split), s in sorted(self.splits.items())]}

    def restore(self, data: Mapping[str, Any], now_ms: int) -> None:
        """Continue from a checkpoint's tracker state (sources by their current ids). An
        idle clock restarts at `now_ms`: the downtime does not make a split idle."""
        self.current = int(data.get("current", MIN_WATERMARK))
        self.finished = {str(s) for s in data.get("finished", [])
                         if s in self.sources}
        self.splits = {}
        for src, split, max_ts, _ in data.get("splits", []):
            if src in self.sources:
                self.splits[(src, split)] = _Split(max_ts=max_ts, last_active_ms=now_ms)
