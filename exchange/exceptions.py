"""Errors of the exchange between continuous subtasks."""

from __future__ import annotations

from streamer.exceptions import StreamerError


class ExchangeError(StreamerError):
    """Raised when a channel between two subtasks breaks: its receiver or sender went away,
    or a peer broke the protocol (a message after end of input, barriers out of order, more
    bytes than its credit). A continuous job fails its gang of tasks on it and restarts from
    the last completed checkpoint; nothing for the user to fix unless it repeats, in which case
    the message names the channel and the peer."""


class ExchangeTimeoutError(ExchangeError):
    """Raised when a peer did not answer within the exchange's timeout: a receiver that gave
    no credit, a server that could not be reached. A receiver that is only slow holds its
    senders back without this error for as long as the timeout allows; raise the timeout if
    a job's subtasks legitimately stall longer (a long snapshot, a long garbage collection)."""
