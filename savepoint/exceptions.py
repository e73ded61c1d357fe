"""Errors raised while writing, reading, restoring or exporting savepoints."""

from __future__ import annotations

from streamer.exceptions import StreamerError


class SavepointError(StreamerError):
    """Raised when a savepoint cannot be written, read or restored (storage unreachable, a
    malformed file list, state that does not fit the new job); the message names the savepoint,
    the operator uid and what to change, and the cause is chained.
    """


class CorruptSavepointError(SavepointError):
    """Raised when a file of a savepoint is missing, does not have the size and sha256 its
    `_metadata` records, or cannot be read as a savepoint state file; the message names the
    savepoint, operator uid, key group and file. The savepoint cannot be restored as it is:
    use another savepoint or checkpoint (or restore the damaged file from a copy).
    """


class IncompatibleSavepointError(SavepointError):
    """Raised when a savepoint file was written in another format version or value encoding than
    this streamer reads; restore it with the streamer version that wrote it, or rewrite it.
    """
