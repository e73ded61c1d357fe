"""Errors raised by sources and sinks."""

from __future__ import annotations

from streamer.exceptions import StreamerError


class ConnectorError(StreamerError):
    """Raised when a source or sink cannot do its work (missing files, unreadable schema,
    unsupported option); the message names the source or sink id and what to change.
    """


class DecodeError(StreamerError):
    """Raised when a source without `on_error` meets a record it cannot decode; the message
    names the source, split and offset. Add `on_error: <sink id>` to route such records to a
    dead-letter sink instead of failing the job.
    """


class ReadFailed(ConnectorError):
    """Raised when a source could not read a planned slice on the driver (the broker or the
    storage failed while reading); like a failed Spark task, the epoch fails and the job
    restarts from its last checkpoint (`job.restart`)."""
