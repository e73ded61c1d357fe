"""A brute-force reference of joins over a stream cut into epochs, written from the semantics in
docs/joins.md (not from streamer's code).

Model (times in epoch ms): one stream of records `{k, v, s, ts}`, `s` = "L" (left) or "R"
(right), cut into epochs 1..n; W_{i-1} is the watermark epoch i carries in (as in `oracle.py`:
max ts of the epochs before - ooo, -inf before any record).
- Interval join: a record of epoch i is late when ts <= W_{i-1}. Among the records that are
  not late, every left l and right r of one key with lower <= r.ts - l.ts <= upper give a row;
  with an outer side, each of its records that got no row gives one with nulls.
- Window join (windows [start, start + size), starts multiples of the slide): a record of
  epoch i takes part in each of its windows that is still open, start + size - 1 > W_{i-1};
  it is late when it has none. Per key and window, every left and right taking part in it
  give a row; with an outer side, each of its records in a window where the other side has
  none gives one.
- Table join (right records are upserts of their key's row; of two, the one with the later
  event time wins, then the later arrival):
  - processing time (`table: true`): each left record of epoch i joins its key's row after
    all right records of epochs 1..i (those of epoch i included); nothing is late;
  - temporal (`table: {as_of: event_time}`): a record of epoch i is late when ts <= W_{i-1};
    each non-late left record joins the row its key had at its event time: among the non-late
    right records of its key with ts <= its ts, the latest.
  A left record without a row gives nulls on the right (left join) or nothing (inner).
Late records come out with their side's columns, nulls for the other's, and `join_side`.
Output columns: k, v, s, ts (left), then r_v, r_s, r_ts (right, `right_prefix: r_`); a window
join's rows then the window they met in, window_start and window_end (late rows have none).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from oracle import iso

NEG_INF = -math.inf


def watermarks(epochs: Sequence[Sequence[dict[str, Any]]], ooo: int) -> list[float]:
    """W_{i-1} for each epoch i = 1..n."""
    out: list[float] = []
    wm, max_ts = NEG_INF, NEG_INF
    for recs in epochs:
        out.append(wm)
        if recs:
            max_ts = max(max_ts, *(r["ts"] for r in recs))
            wm = max(wm, max_ts - ooo)
    return out


def _left(r: dict[str, Any] | None) -> dict[str, Any]:
    if r is None:
        return {"v": None, "s": None, "ts": None}
    return {"v": r["v"], "s": r["s"], "ts": iso(r["ts"])}


def _right(r: dict[str, Any] | None) -> dict[str, Any]:
    if r is None:
        return {"r_v": None, "r_s": None, "r_ts": None}
    return {"r_v": r["v"], "r_s": r["s"], "r_ts": iso(r["ts"])}


def _row(k: str, left: dict[str, Any] | None, right: dict[str, Any] | None) -> dict[str, Any]:
    return {"k": k, **_left(left), **_right(right)}


def _late_row(r: dict[str, Any]) -> dict[str, Any]:
    left = r["s"] == "L"
    return {**_row(r["k"], r if left else None, None if left else r),
            "join_side": "left" if left else "right"}


def interval_join(epochs: Sequence[Sequence[dict[str, Any]]], *, ooo: int, lower: int,
                  upper: int, type: str) -> tuple[list[dict], list[dict]]:
    """(output rows, late rows) of an interval join."""
    wms = watermarks(epochs, ooo)
    live = [r for recs, wm in zip(epochs, wms, strict=True) for r in recs if r["ts"] > wm]
    late = [_late_row(r) for recs, wm in zip(epochs, wms, strict=True) for r in recs
            if r["ts"] <= wm]
    lefts = [r for r in live if r["s"] == "L"]
    rights = [r for r in live if r["s"] == "R"]
    out, matched = [], set()
    for i, left in enumerate(lefts):
        for j, right in enumerate(rights):
            if left["k"] == right["k"] and lower <= right["ts"] - left["ts"] <= upper:
                out.append(_row(left["k"], left, right))
                matched |= {("L", i), ("R", j)}
    if type in ("left", "full"):
        out += [_row(r["k"], r, None) for i, r in enumerate(lefts) if ("L", i) not in matched]
    if type in ("right", "full"):
        out += [_row(r["k"], None, r) for j, r in enumerate(rights) if ("R", j) not in matched]
    return out, late


def window_join(epochs: Sequence[Sequence[dict[str, Any]]], *, ooo: int, size: int,
                slide: int, type: str) -> tuple[list[dict], list[dict]]:
    """(output rows, late rows) of a window join."""
    wms = watermarks(epochs, ooo)
    members: dict[tuple[str, int], dict[str, list[dict]]] = {}
    late = []
    for recs, wm in zip(epochs, wms, strict=True):
        for r in recs:
            last = r["ts"] - r["ts"] % slide
            starts = [s for s in range(last, r["ts"] - size, -slide) if s + size - 1 > wm]
            if not starts:
                late.append(_late_row(r))
            for s in starts:
                members.setdefault((r["k"], s), {"L": [], "R": []})[r["s"]].append(r)
    out = []
    for (k, start), sides in members.items():
        pairs = [(left, right) for left in sides["L"] for right in sides["R"]]
        if type in ("left", "full") and not sides["R"]:
            pairs += [(left, None) for left in sides["L"]]
        if type in ("right", "full") and not sides["L"]:
            pairs += [(None, right) for right in sides["R"]]
        window = {"window_start": iso(start), "window_end": iso(start + size)}
        out += [{**_row(k, left, right), **window} for left, right in pairs]
    return out, late


def table_join(epochs: Sequence[Sequence[dict[str, Any]]], *, ooo: int, temporal: bool,
               type: str) -> tuple[list[dict], list[dict]]:
    """(output rows, late rows) of a table join (processing time or temporal)."""
    wms = watermarks(epochs, ooo) if temporal else [NEG_INF] * len(epochs)
    arrived = [(i, n, r) for i, (recs, wm) in enumerate(zip(epochs, wms, strict=True))
               for n, r in enumerate(recs) if not (temporal and r["ts"] <= wm)]
    late = [_late_row(r) for recs, wm in zip(epochs, wms, strict=True) for r in recs
            if temporal and r["ts"] <= wm]
    out = []
    for i, _n, left in arrived:
        if left["s"] != "L":
            continue
        versions = [(r["ts"], j, m, r) for j, m, r in arrived
                    if r["s"] == "R" and r["k"] == left["k"]
                    and (r["ts"] <= left["ts"] if temporal else j <= i)]
        row = max(versions, key=lambda v: v[:3])[3] if versions else None
        if row is not None or type == "left":
            out.append(_row(left["k"], left, row))
    return out, late
