"""The watermark tracker: per split max event time - bound, minimum over active splits."""

from __future__ import annotations

import textwrap

from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.watermarks import MAX_WATERMARK, MIN_WATERMARK, WatermarkTracker


def tracker(idle: str | None = None) -> WatermarkTracker:
    wm = "{max_out_of_orderness: 5s" + (f", idle_timeout: {idle}" if idle else "") + "}"
    spec = load_pipeline_text(textwrap.dedent(f"""
        name: t
        sources:
          - id: a
            type: datagen
            splits: 2
            fields: {{ts: "timestamp_millis(offset)"}}
            event_time: ts
            watermark: {wm}
          - id: b
            type: datagen
            fields: {{n: "offset"}}
        sinks:
          - id: out
            type: console
            input: [a]
          - id: out2
            type: console
            input: b
        """))
    return WatermarkTracker({s.id: s for s in spec.sources})


def test_minimum_over_splits_minus_the_bound_and_never_backwards() -> None:
    t = tracker()
    t.observe("a", {"0": 100_000, "1": None}, now_ms=0)
    assert t.advance(0) == MIN_WATERMARK  # split 1 has not produced yet
    t.observe("a", {"0": 90_000, "1": 60_000}, now_ms=1)
    assert t.advance(1) == 60_000 - 5_000  # split 1 holds it back; split 0 keeps its max
    t.observe("a", {"0": None, "1": 50_000}, now_ms=2)  # older data does not move it back
    assert t.advance(2) == 55_000
    t.observe("a", {"1": 200_000}, now_ms=3)
    assert t.advance(3) == 100_000 - 5_000


def test_an_idle_split_stops_holding_the_watermark_back() -> None:
    t = tracker(idle="10s")
    t.observe("a", {"0": 100_000, "1": 20_000}, now_ms=0)
    assert t.advance(0) == 15_000
    t.observe("a", {"0": 150_000, "1": None}, now_ms=11_000)
    assert t.advance(11_000) == 145_000  # split 1 idle for 11 s: left out
    t.observe("a", {"1": 30_000}, now_ms=12_000)  # it produces again: back in, but no regress
    assert t.advance(12_000) == 145_000


def test_sources_without_event_time_do_not_count_and_the_end_is_infinity() -> None:
    t = tracker()
    t.observe("a", {"0": 10_000, "1": 10_000}, now_ms=0)
    assert t.advance(0) == 5_000
    t.finish("b")
    assert t.advance(0) == 5_000
    t.finish("a")
    assert t.advance(0) == MAX_WATERMARK
