"""A brute-force reference of the keyed operators' semantics (windows, rolling aggregates,
dedupe) over a stream cut into epochs, written from the pipeline spec, not from streamer's code.

Model (times in epoch ms):
- Epochs are numbered 1..n; each is a list of records `{k, v, ts}` (ts in ms). A record's
  arrival order is (epoch, position in the epoch's list).
- W_0 = -inf; after epoch i, W_i = max(W_{i-1}, max ts of epochs 1..i - ooo) (an epoch without
  records leaves it unchanged). After the last data epoch one flush epoch runs with W = +inf.
- Epoch i first fires what the carried-in watermark W_{i-1} makes due, then processes its
  records against W_{i-1}.

Every function returns rows as the sinks show them: timestamps as ISO-8601 UTC strings
(`2026-01-01T00:01:00Z`, `...:00.5Z`), numbers as Python numbers.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

NEG_INF = -math.inf
POS_INF = math.inf


@dataclass(frozen=True)
class Rec:
    """One input record with its arrival position."""

    k: str
    v: int
    ts: int  # event time, ms
    epoch: int  # 1-based
    pos: int  # position in the epoch's list

    @property
    def order(self) -> tuple[int, int, int]:
        """(ts, arrival): the order of first/last/collect_list."""
        return (self.ts, self.epoch, self.pos)


@dataclass(frozen=True)
class Agg:
    """One aggregate of the output row, `name: fn(v)` (`count()` takes no argument)."""

    name: str
    fn: str  # count | sum | min | max | avg | first | last | collect_list | count_distinct


def iso(ms: int) -> str:
    """Epoch ms as the sinks' ISO-8601 UTC text."""
    seconds, millis = divmod(ms, 1000)
    text = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if millis:
        text += ("." + f"{millis:03d}").rstrip("0")
    return text + "Z"


def records(epochs: Sequence[Sequence[dict[str, Any]]]) -> list[list[Rec]]:
    """The epochs' rows `{k, v, ts}` (ts in ms) as records with arrival positions."""
    return [[Rec(r["k"], r["v"], r["ts"], i + 1, p) for p, r in enumerate(rows)]
            for i, rows in enumerate(epochs)]


def carried_watermarks(epochs: Sequence[Sequence[Rec]], ooo: int) -> list[float]:
    """W_{i-1} for epoch i = 1..n, then +inf for the flush epoch n+1 (list index i-1)."""
    out: list[float] = []
    wm: float = NEG_INF
    max_ts: float = NEG_INF
    for recs in epochs:
        out.append(wm)
        if recs:
            max_ts = max(max_ts, *(r.ts for r in recs))
            wm = max(wm, max_ts - ooo)
    out.append(POS_INF)
    return out


def aggregate(recs: Sequence[Rec], aggs: Sequence[Agg]) -> dict[str, Any]:
    """The aggregates over `recs` (non-empty), as output columns."""
    ordered = sorted(recs, key=lambda r: r.order)
    values = [r.v for r in recs]
    row: dict[str, Any] = {}
    for agg in aggs:
        if agg.fn == "count":
            row[agg.name] = len(recs)
        elif agg.fn == "sum":
            row[agg.name] = sum(values)
        elif agg.fn == "min":
            row[agg.name] = min(values)
        elif agg.fn == "max":
            row[agg.name] = max(values)
        elif agg.fn == "avg":
            row[agg.name] = sum(values) / len(values)
        elif agg.fn == "first":
            row[agg.name] = ordered[0].v
        elif agg.fn == "last":
            row[agg.name] = ordered[-1].v
        elif agg.fn == "collect_list":
            row[agg.name] = [r.v for r in ordered]
        elif agg.fn == "count_distinct":
            row[agg.name] = len(set(values))
        else:
            msg = f"unknown aggregate {agg.fn}"
            raise ValueError(msg)
    return row


def _window_row(key: str, start: int, end: int, recs: Sequence[Rec],
                aggs: Sequence[Agg]) -> dict[str, Any]:
    return {"k": key, "window_start": iso(start), "window_end": iso(end),
            **aggregate(recs, aggs)}


def record_row(r: Rec) -> dict[str, Any]:
    """A record as it reaches a sink unchanged (late output, dedupe)."""
    return {"k": r.k, "v": r.v, "ts": iso(r.ts)}


def _floor(x: int, m: int) -> int:
    return (x // m) * m


def window_starts(ts: int, size: int, slide: int) -> list[int]:
    """Starts of the windows [s, s + size) holding `ts`: multiples of `slide`, s <= ts."""
    return [s for s in range(_floor(ts - size, slide), ts + 1, slide) if s <= ts < s + size]


def window_is_due(start: int, wm: float, *, size: int, lateness: int) -> bool:
    """A time window fires (and is late for records) once end - 1 + lateness <= wm."""
    return start + size - 1 + lateness <= wm


def time_record_is_late(ts: int, wm: float, *, size: int, slide: int, lateness: int) -> bool:
    """A record is late when every window holding it is due."""
    return all(window_is_due(s, wm, size=size, lateness=lateness)
               for s in window_starts(ts, size, slide))


def session_record_is_late(ts: int, wm: float, *, gap: int, lateness: int) -> bool:
    """A session record is late when its own session [ts, ts + gap) would be due."""
    return ts + gap - 1 + lateness <= wm


def time_windows(epochs: Sequence[Sequence[Rec]], *, size: int, slide: int, ooo: int,
                 lateness: int, aggs: Sequence[Agg], emit: str = "final",
                 keep: Callable[[Rec], bool] | None = None
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Tumbling (slide == size) or sliding event-time windows: (output rows, late rows).

    `keep`: a filter between the source and the window; every source record moves the
    watermark (it is the source's), only kept records reach the window.
    """
    wms = carried_watermarks(epochs, ooo)
    if keep is not None:
        epochs = [[r for r in recs if keep(r)] for recs in epochs]
    open_windows: dict[tuple[str, int], list[Rec]] = {}
    out: list[dict[str, Any]] = []
    late: list[dict[str, Any]] = []

    def is_due(start: int, wm: float) -> bool:
        return window_is_due(start, wm, size=size, lateness=lateness)

    for i, wm in enumerate(wms):
        for (key, start) in sorted(open_windows):
            if is_due(start, wm):
                out.append(_window_row(key, start, start + size, open_windows.pop((key, start)),
                                       aggs))
        if i == len(epochs):
            break
        touched: set[tuple[str, int]] = set()
        for r in epochs[i]:
            starts = window_starts(r.ts, size, slide)
            live = [s for s in starts if not is_due(s, wm)]
            if not live:
                late.append(record_row(r))
                continue
            for s in live:
                open_windows.setdefault((r.k, s), []).append(r)
                touched.add((r.k, s))
        if emit == "updates":
            for key, start in sorted(touched):
                out.append(_window_row(key, start, start + size, open_windows[(key, start)],
                                       aggs))
    assert not open_windows
    return out, late


def sessions(epochs: Sequence[Sequence[Rec]], *, gap: int, ooo: int, lateness: int,
             aggs: Sequence[Agg], emit: str = "final"
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Event-time session windows: (output rows, late rows)."""
    wms = carried_watermarks(epochs, ooo)
    # key -> list of open sessions [start, end, records]
    open_sessions: dict[str, list[tuple[int, int, list[Rec]]]] = {}
    out: list[dict[str, Any]] = []
    late: list[dict[str, Any]] = []
    for i, wm in enumerate(wms):
        for key in sorted(open_sessions):
            keep = []
            for start, end, recs in open_sessions[key]:
                if end - 1 + lateness <= wm:
                    out.append(_window_row(key, start, end, recs, aggs))
                else:
                    keep.append((start, end, recs))
            open_sessions[key] = keep
        if i == len(epochs):
            break
        arrived: dict[str, set[Rec]] = {}  # key -> its on-time records of this epoch
        for r in epochs[i]:
            if session_record_is_late(r.ts, wm, gap=gap, lateness=lateness):
                late.append(record_row(r))
                continue
            current = [*open_sessions.get(r.k, []), (r.ts, r.ts + gap, [r])]
            # Merge transitively: repeat until no two sessions overlap or touch (Flink's
            # TimeWindow.intersects and Spark's session_window: [0, 10) and [10, 20) merge).
            merged = True
            while merged:
                merged = False
                for a in range(len(current)):
                    for b in range(a + 1, len(current)):
                        sa, ea, ra = current[a]
                        sb, eb, rb = current[b]
                        if sa <= eb and sb <= ea:
                            new = (min(sa, sb), max(ea, eb), ra + rb)
                            current = [c for j, c in enumerate(current) if j not in (a, b)]
                            current.append(new)
                            merged = True
                            break
                    if merged:
                        break
            open_sessions[r.k] = current
            arrived.setdefault(r.k, set()).add(r)
        if emit == "updates":
            for key in sorted(arrived):
                for start, end, recs in open_sessions[key]:
                    if arrived[key].intersection(recs):
                        out.append(_window_row(key, start, end, recs, aggs))
    assert not any(open_sessions.values())
    return out, late


def count_windows(epochs: Sequence[Sequence[Rec]], *, count: int, aggs: Sequence[Agg]
                  ) -> list[dict[str, Any]]:
    """Count windows per key: every `count` records in (epoch, ts, position) order."""
    out: list[dict[str, Any]] = []
    pending: dict[str, list[Rec]] = {}
    for recs in epochs:
        for r in sorted(recs, key=lambda r: (r.ts, r.pos)):
            chunk = pending.setdefault(r.k, [])
            chunk.append(r)
            if len(chunk) == count:
                out.append(_window_row(r.k, chunk[0].ts, chunk[-1].ts, chunk, aggs))
                pending[r.k] = []
    return out


def rolling(epochs: Sequence[Sequence[Rec]], *, aggs: Sequence[Agg]) -> list[dict[str, Any]]:
    """Rolling aggregate per key: after each epoch, the new value of every key it touched."""
    out: list[dict[str, Any]] = []
    seen: dict[str, list[Rec]] = {}
    for recs in epochs:
        touched = []
        for r in recs:
            if r.k not in touched:
                touched.append(r.k)
            seen.setdefault(r.k, []).append(r)
        for key in touched:
            out.append({"k": key, **aggregate(seen[key], aggs)})
    return out


def dedupe(epochs: Sequence[Sequence[Rec]], *, within: int, ooo: int) -> list[dict[str, Any]]:
    """Dedupe per key: forward the key's first record; forget it once the carried-in
    watermark reaches first ts + within."""
    wms = carried_watermarks(epochs, ooo)
    remembered: dict[str, int] = {}  # key -> ts of the forwarded record
    out: list[dict[str, Any]] = []
    for i, recs in enumerate(epochs):
        wm = wms[i]
        for key in [k for k, ts in remembered.items() if wm >= ts + within]:
            del remembered[key]
        by_key: dict[str, list[Rec]] = {}
        for r in recs:
            by_key.setdefault(r.k, []).append(r)
        for key, group in by_key.items():
            if key in remembered:
                continue
            first = min(group, key=lambda r: r.order)
            out.append(record_row(first))
            remembered[key] = first.ts
    return out
