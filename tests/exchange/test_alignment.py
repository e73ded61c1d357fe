"""Barrier alignment (`exchange.alignment`): random interleavings of per-channel streams, and
the rules one at a time.

In the random streams each record is tagged with the checkpoint it belongs to (the first
barrier after it on its channel; the records after the last barrier belong to the next
one), and each watermark a channel sends in checkpoint e lies in [e * 1000, e * 1000 + 999].
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.exchange.alignment import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    AdvanceWatermark,
    Barrier,
    BarrierAligner,
    Deliver,
    EndOfInput,
    Idle,
    InputFinished,
    Message,
    Records,
    TakeSnapshot,
    Watermark,
)
from streamer.exchange.exceptions import ExchangeError
from streamer.runtime import watermarks


@dataclass(frozen=True)
class Tag:
    channel: int
    seq: int
    checkpoint: int


@st.composite
def channel_stream(draw: st.DrawFn, channel: int, barriers: int) -> list[Message]:
    """One channel's messages: records, watermarks and idleness between `barriers` barriers,
    and maybe an early or a final end of input."""
    ends_after = draw(st.one_of(st.none(), st.integers(0, barriers)))
    last = barriers if ends_after is None else ends_after
    out: list[Message] = []
    seq = 0
    mark = 0
    for checkpoint in range(1, last + 2):
        for kind in draw(st.lists(st.sampled_from(["rec", "rec", "wm", "idle"]), max_size=5)):
            if kind == "rec":
                out.append(Records(Tag(channel, seq, checkpoint)))
                seq += 1
            elif kind == "wm":
                mark = max(mark, checkpoint * 1000 + draw(st.integers(0, 999)))
                out.append(Watermark(mark))
            else:
                out.append(Idle())
        if checkpoint <= last:
            out.append(Barrier(checkpoint))
    if ends_after is not None:  # where barrier ends_after + 1 would have been
        out.append(EndOfInput())
    return out


@st.composite
def interleaving(draw: st.DrawFn) -> tuple[int, list[list[Message]], list[tuple[int, Message]]]:
    channels = draw(st.integers(1, 4))
    barriers = draw(st.integers(0, 4))
    streams = [draw(channel_stream(c, barriers)) for c in range(channels)]
    cursors = [0] * channels
    order: list[tuple[int, Message]] = []
    while any(cursors[c] < len(streams[c]) for c in range(channels)):
        open_channels = [c for c in range(channels) if cursors[c] < len(streams[c])]
        c = draw(st.sampled_from(open_channels))
        order.append((c, streams[c][cursors[c]]))
        cursors[c] += 1
    return barriers, streams, order


@settings(max_examples=100, deadline=None)
@given(interleaving())
def test_random_interleavings_align_exactly(
        case: tuple[int, list[list[Message]], list[tuple[int, Message]]]) -> None:
    barriers, streams, order = case
    aligner = BarrierAligner(len(streams))
    snapshots: list[int] = []
    delivered: list[Tag] = []
    marks: list[int] = []
    finished = 0
    for channel, message in order:
        for event in aligner.receive(channel, message):
            if isinstance(event, TakeSnapshot):
                snapshots.append(event.checkpoint)
            elif isinstance(event, Deliver):
                tag = event.payload
                assert tag.channel == event.channel
                # Processed after snapshot tag.checkpoint - 1 and before snapshot tag.checkpoint.
                assert len(snapshots) == tag.checkpoint - 1, (tag, snapshots)
                delivered.append(tag)
            elif isinstance(event, AdvanceWatermark):
                # A watermark of checkpoint n + 1 or later never takes effect before snapshot n.
                assert event.ms == MAX_WATERMARK or event.ms < (len(snapshots) + 2) * 1000
                marks.append(event.ms)
            else:
                assert isinstance(event, InputFinished)
                finished += 1
    # Each snapshot once, in order, and every one some channel delivered the barrier of (a
    # channel that ended early counts as every later barrier; a barrier injected after every
    # source had finished reaches no channel, and the coordinator knows they finished).
    injected = max(sum(isinstance(m, Barrier) for m in s) for s in streams)
    assert injected == barriers or all(isinstance(s[-1], EndOfInput) for s in streams)
    assert snapshots == list(range(1, injected + 1))
    sent = [m.payload for s in streams for m in s if isinstance(m, Records)]
    assert Counter(delivered) == Counter(sent) and len(delivered) == len(sent)
    for c in range(len(streams)):
        seqs = [t.seq for t in delivered if t.channel == c]
        assert seqs == sorted(seqs)
    assert marks == sorted(set(marks))  # strictly increasing
    assert aligner.held == 0 and not aligner.blocked_channels
    ended = [any(isinstance(m, EndOfInput) for m in s) for s in streams]
    assert finished == (1 if all(ended) else 0)
    if all(ended):
        assert aligner.watermark == MAX_WATERMARK
    elif not any(isinstance(m, Idle) for s in streams for m in s):
        last = [max([m.ms for m in s if isinstance(m, Watermark)], default=MIN_WATERMARK)
                for s, e in zip(streams, ended, strict=True) if not e]
        assert aligner.watermark == min(last)


def test_a_blocked_channel_is_held_until_every_channel_delivers_the_barrier() -> None:
    a = BarrierAligner(2)
    assert a.receive(0, Barrier(1)) == []
    assert a.blocked(0) and not a.blocked(1) and a.aligning == 1
    assert a.receive(0, Records("after")) == []
    assert a.receive(0, Barrier(2)) == []
    assert a.receive(0, Records("after 2")) == []
    assert a.held == 3
    assert a.receive(1, Records("before")) == [Deliver(1, "before")]
    # Barrier 1 on the last channel: snapshot 1, then channel 0's records up to its barrier
    # 2, which blocks it again.
    assert a.receive(1, Barrier(1)) == [TakeSnapshot(1), Deliver(0, "after")]
    assert a.blocked_channels == {0} and a.aligning == 2 and a.held == 1
    assert a.receive(1, Barrier(2)) == [TakeSnapshot(2), Deliver(0, "after 2")]
    assert a.last_snapshot == 2 and a.held == 0


def test_end_of_input_counts_as_every_later_barrier() -> None:
    a = BarrierAligner(2)
    assert a.receive(1, EndOfInput()) == []
    assert a.receive(0, Barrier(1)) == [TakeSnapshot(1)]
    assert a.receive(0, Barrier(2)) == [TakeSnapshot(2)]
    assert a.receive(0, EndOfInput()) == [AdvanceWatermark(MAX_WATERMARK), InputFinished()]
    assert a.finished


def test_the_last_channel_ending_completes_the_alignment_before_finishing() -> None:
    a = BarrierAligner(2)
    a.receive(0, Barrier(3))
    a.receive(0, EndOfInput())  # held behind the barrier
    assert a.receive(1, EndOfInput()) == [TakeSnapshot(3), AdvanceWatermark(MAX_WATERMARK),
                                          InputFinished()]


def test_the_watermark_is_the_minimum_over_active_channels() -> None:
    a = BarrierAligner(3)
    assert a.receive(0, Watermark(10)) == []
    assert a.receive(1, Watermark(20)) == []
    assert a.receive(2, Watermark(5)) == [AdvanceWatermark(5)]
    assert a.receive(2, Idle()) == [AdvanceWatermark(10)]  # an idle channel leaves the min
    assert a.receive(0, Idle()) == [AdvanceWatermark(20)]
    assert a.receive(1, Idle()) == []  # every channel idle: it stays where it is
    # A record makes channel 2 active again: its watermark (5) is behind, the subtask's
    # does not go back, and the next advance waits for channel 2.
    assert a.receive(2, Records("late")) == [Deliver(2, "late")]
    assert a.watermark == 20
    assert a.receive(1, Watermark(40)) == []
    assert a.receive(2, Watermark(30)) == [AdvanceWatermark(30)]
    assert a.receive(2, EndOfInput()) == [AdvanceWatermark(40)]  # only channel 1 is active


def test_a_blocked_channels_watermark_waits_with_its_records() -> None:
    a = BarrierAligner(2)
    a.receive(0, Watermark(1))
    a.receive(1, Watermark(1))
    a.receive(0, Barrier(1))
    assert a.receive(0, Watermark(50)) == []
    assert a.receive(1, Watermark(60)) == []
    assert a.receive(1, Barrier(1)) == [TakeSnapshot(1), AdvanceWatermark(50)]


def test_broken_streams_are_errors() -> None:
    a = BarrierAligner(2, last_checkpoint=4)
    with pytest.raises(ExchangeError, match="already taken"):
        a.receive(0, Barrier(4))
    a.receive(0, Barrier(5))
    with pytest.raises(ExchangeError, match="same barriers"):
        a.receive(1, Barrier(6))
    b = BarrierAligner(1)
    b.receive(0, EndOfInput())
    with pytest.raises(ExchangeError, match="after its end of input"):
        b.receive(0, Records(1))
    with pytest.raises(ExchangeError, match="no input channel 3"):
        b.receive(3, Records(1))
    c = BarrierAligner(2)
    c.receive(0, Barrier(1))
    c.receive(0, EndOfInput())
    with pytest.raises(ExchangeError, match="after its end of input"):
        c.receive(0, Records(1))


def test_watermark_bounds_are_the_epoch_runtimes() -> None:
    assert (MIN_WATERMARK, MAX_WATERMARK) == (watermarks.MIN_WATERMARK,
                                              watermarks.MAX_WATERMARK)
