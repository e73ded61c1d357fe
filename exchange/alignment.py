"""Barrier alignment: a keyed subtask's input of N channels, as in asynchronous barrier
snapshotting (Carbone et al., ../shared/seeds/000).

Each channel carries, in order, records, watermarks, idleness marks, checkpoint barriers
and at last its end of input. When barrier n arrives on a channel, that channel is blocked:
what it delivers after the barrier is held back (buffered here, or, by an input gate, left
in the exchange so its sender runs out of credit) until every channel has delivered barrier
n. Then the subtask is told to snapshot n, once, and the held messages are released in
their order. So the snapshot holds exactly the records before barrier n on every channel.

A channel's end of input counts as every later barrier: a source that finished sends no
more. The subtask's watermark is the minimum over its channels' watermarks, leaving out
channels marked idle by their source (a record or watermark on one makes it active again)
and channels that ended, as the epoch runtime's watermarks leave out idle and finished
splits (`runtime.watermarks`); it never goes back, stays where it is while every remaining
channel is idle, and is +inf once every channel has ended.

Only aligned checkpoints are here. Unaligned checkpoints (a barrier overtakes the buffered
records, which then become part of the snapshot) are out of scope: they need the in-flight
records in the checkpoint format, which the epoch mode's format has no place for.

The aligner is a pure state machine: `receive(channel, message)` returns the events for the
subtask, in the order it must act on them. It does no I/O and keeps no clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from streamer.exchange.exceptions import ExchangeError

#: The watermark's bounds, the same as the epoch runtime's (`runtime.watermarks`).
MIN_WATERMARK = -(2**62)
MAX_WATERMARK = 2**62


# ---------------------------------------------------------------------- what channels carry
@dataclass(frozen=True)
class Records:
    """A batch of records (an Arrow record batch, or anything a caller routes)."""

    payload: Any


@dataclass(frozen=True)
class Barrier:
    """Checkpoint barrier n: what came before it on the channel is in checkpoint n."""

    checkpoint: int


@dataclass(frozen=True)
class Watermark:
    """The channel's watermark, in epoch ms: no later record of it is older."""

    ms: int


@dataclass(frozen=True)
class Idle:
    """The channel's source has nothing to read: it no longer holds the watermark back."""


@dataclass(frozen=True)
class EndOfInput:
    """The channel's source finished: no message follows; it counts as every later barrier."""


Message = Records | Barrier | Watermark | Idle | EndOfInput


# ---------------------------------------------------------------------- what the subtask does
@dataclass(frozen=True)
class Deliver:
    """Apply these records (they came on `channel`)."""

    channel: int
    payload: Any


@dataclass(frozen=True)
class AdvanceWatermark:
    """The subtask's watermark advanced to `ms`: fire the event-time timers due."""

    ms: int


@dataclass(frozen=True)
class TakeSnapshot:
    """Every channel delivered barrier `checkpoint`: snapshot the state now, before any
    further record, and acknowledge the checkpoint."""

    checkpoint: int


@dataclass(frozen=True)
class InputFinished:
    """Every channel ended: fire every timer (the watermark is +inf) and finish."""


Event = Deliver | AdvanceWatermark | TakeSnapshot | InputFinished


@dataclass
class _Channel:
    watermark: int = MIN_WATERMARK
    idle: bool = False
    ended: bool = False
    #: The barrier it delivered and the subtask has not snapshotted yet (it is blocked).
    barrier: int | None = None
    held: deque[Message] = field(default_factory=deque)


class BarrierAligner:
    """The alignment of one subtask's input channels (see the module docstring).

    `last_checkpoint` is the checkpoint the subtask's state was restored from (0: none):
    every barrier must be later. Every channel carries the same barriers in the same order
    (the coordinator injects each at every source); a channel that delivers another barrier
    while one is being aligned breaks that rule and raises `ExchangeError`."""

    def __init__(self, channels: int, *, last_checkpoint: int = 0,
                 watermark: int = MIN_WATERMARK) -> None:
        if channels < 1:
            msg = f"a subtask needs at least one input channel, not {channels}"
            raise ValueError(msg)
        self._channels = [_Channel() for _ in range(channels)]
        self.last_snapshot = last_checkpoint
        self.watermark = watermark
        #: The barrier being aligned: some channel delivered it, not every one yet.
        self.aligning: int | None = None
        self.finished = False

    # ------------------------------------------------------------------ queries
    @property
    def channels(self) -> int:
        """How many input channels the subtask has."""
        return len(self._channels)

    def blocked(self, channel: int) -> bool:
        """Whether `channel` delivered the barrier being aligned: a caller that pulls from
        the exchange should leave its messages there until it is released."""
        return self._channels[channel].barrier is not None

    @property
    def blocked_channels(self) -> frozenset[int]:
        """The channels that delivered the barrier being aligned."""
        return frozenset(i for i, ch in enumerate(self._channels) if ch.barrier is not None)

    @property
    def held(self) -> int:
        """How many messages of blocked channels the aligner holds back now."""
        return sum(len(ch.held) for ch in self._channels)

    # ------------------------------------------------------------------ input
    def receive(self, channel: int, message: Message) -> list[Event]:
        """Take the next message of `channel`; return what the subtask must do, in order."""
        if not 0 <= channel < len(self._channels):
            msg = f"no input channel {channel} (the subtask has {len(self._channels)})"
            raise ExchangeError(msg)
        ch = self._channels[channel]
        if ch.ended or (ch.held and isinstance(ch.held[-1], EndOfInput)):
            msg = f"channel {channel} sent {message!r} after its end of input"
            raise ExchangeError(msg)
        events: list[Event] = []
        if ch.barrier is not None:
            ch.held.append(message)
            return events
        self._apply(channel, message, events)
        self._release(events)
        return events

    def _release(self, events: list[Event]) -> None:
        """Apply the held messages of every channel no longer blocked, in each channel's
        order, until none is left or every channel that holds some is blocked again."""
        progress = True
        while progress:
            progress = False
            for i, ch in enumerate(self._channels):
                while ch.barrier is None and ch.held:
                    self._apply(i, ch.held.popleft(), events)
                    progress = True

    def _apply(self, channel: int, message: Message, events: list[Event]) -> None:
        ch = self._channels[channel]
        if isinstance(message, Records):
            ch.idle = False
            events.append(Deliver(channel, message.payload))
        elif isinstance(message, Watermark):
            ch.idle = False
            ch.watermark = max(ch.watermark, message.ms)
            self._advance(events)
        elif isinstance(message, Idle):
            ch.idle = True
            self._advance(events)
        elif isinstance(message, Barrier):
            self._barrier(channel, message.checkpoint, events)
        elif isinstance(message, EndOfInput):
            ch.ended = True
            self._advance(events)
            self._complete(events)
            if all(c.ended for c in self._channels):
                self.finished = True
                events.append(InputFinished())
        else:
            msg = f"channel {channel} sent {message!r}, which is no channel message"
            raise ExchangeError(msg)

    def _barrier(self, channel: int, checkpoint: int, events: list[Event]) -> None:
        if checkpoint <= self.last_snapshot:
            msg = (f"channel {channel} delivered barrier {checkpoint}, but checkpoint "
                   f"{self.last_snapshot} is already taken: barriers must increase")
            raise ExchangeError(msg)
        if self.aligning is not None and checkpoint != self.aligning:
            msg = (f"channel {channel} delivered barrier {checkpoint} while barrier "
                   f"{self.aligning} is being aligned: every channel must carry the same "
                   "barriers in the same order")
            raise ExchangeError(msg)
        self.aligning = checkpoint
        self._channels[channel].barrier = checkpoint
        self._complete(events)

    def _complete(self, events: list[Event]) -> None:
        """Snapshot the barrier being aligned once every channel delivered it or ended."""
        if self.aligning is None or not all(
                ch.ended or ch.barrier == self.aligning for ch in self._channels):
            return
        events.append(TakeSnapshot(self.aligning))
        self.last_snapshot = self.aligning
        self.aligning = None
        for ch in self._channels:
            ch.barrier = None

    def _advance(self, events: list[Event]) -> None:
        """The minimum over active channels; +inf once all ended; unchanged while every
        channel left is idle. It never goes back."""
        active = [ch.watermark for ch in self._channels if not ch.idle and not ch.ended]
        if active:
            candidate = min(active)
        elif all(ch.ended for ch in self._channels):
            candidate = MAX_WATERMARK
        else:
            return
        if candidate > self.watermark:
            self.watermark = candidate
            events.append(AdvanceWatermark(candidate))
