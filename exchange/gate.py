"""A continuous subtask's input gate: the exchange's channels read through the barrier
aligner.

The gate takes the next message only from channels the aligner has not blocked, so a
blocked channel's messages stay in the exchange, within its bound: its sender runs out of
credit and waits, instead of the subtask buffering without limit (the aligner's own buffer
stays empty). The subtask acts on the events in the order `poll` returns them: records to
apply, watermarks to fire timers at, snapshots to take, the end of its input.
"""

from __future__ import annotations

from streamer.exchange.alignment import BarrierAligner, Event
from streamer.exchange.flight import ExchangeServer


class InputGate:
    """The input of one subtask: its exchange server's channels and their aligner."""

    def __init__(self, server: ExchangeServer, aligner: BarrierAligner) -> None:
        if server.channels != aligner.channels:
            msg = (f"the exchange serves {server.channels} channels, the aligner aligns "
                   f"{aligner.channels}")
            raise ValueError(msg)
        self.server = server
        self.aligner = aligner

    def poll(self, timeout_s: float | None = None) -> list[Event]:
        """The events of the next message of an unblocked channel, or [] after `timeout_s`
        without one. Raises `ExchangeError` when a channel's sender broke."""
        channel = self.server.wait_ready(self.aligner.blocked_channels, timeout_s)
        if channel is None:
            return []
        return self.aligner.receive(channel, self.server.take(channel))
