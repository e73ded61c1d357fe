"""Errors raised by the state backends, key-group helpers and state codecs."""

from __future__ import annotations

from streamer.exceptions import StreamerError


class StateError(StreamerError):
    """Raised when keyed state cannot be read, written or committed; the message names the
    subtask directory or state and says what to change. The subclasses below are the cases a
    caller may want to handle on their own.
    """


class StateLockedError(StateError):
    """Raised when a subtask's state is still open elsewhere (another task attempt, another
    Python worker, or an unclosed backend in this process) after the bounded wait of
    `BackendOptions.lock_timeout_s`. Close the other backend, or let Spark retry the task once the
    other attempt has ended; never delete the LOCK file of a directory that is in use.
    """


class StateClosedError(StateError):
    """Raised when a backend is used after `close()`; open a new one with `open_backend`."""


class UnknownStateError(StateError):
    """Raised when an operation names a state that was never declared; declare it first with
    `KeyedStateBackend.declare(StateDescriptor(name, kind))` or pass it to `open_backend`.
    """


class IncompatibleStateError(StateError):
    """Raised when a state is used or declared with a kind other than the one it was created
    with (e.g. `append` on a value state, or a map state re-declared as a list); keep the kind,
    or give the new state a new name.
    """


class KeyGroupError(StateError):
    """Raised for an invalid parallelism / max_parallelism pair, or when a subtask touches a key
    group it does not own; the latter means rows were routed to the wrong subtask (compute the
    key group with `key_group_sql` and route with `assign_subtask`).
    """


class KeyEncodingError(StateError):
    """Raised when a key or time cannot be encoded (unsupported type, time out of the 64-bit
    range) or bytes cannot be decoded as a key; use str, int, float, bool, None, bytes, date,
    datetime or Decimal key columns.
    """


class CommitError(StateError):
    """Raised when `commit(version)` is not above the last committed version; a retried task
    should call `version()` first and replay `outputs(version)` instead of applying an epoch twice.
    """


class CorruptStateError(StateError):
    """Raised when local state files cannot be read (truncated, foreign format, unknown format
    version); delete the subtask directory named in the message and restore from a checkpoint.
    """


class SnapshotError(StateError):
    """Raised when a subtask's state cannot be snapshotted to checkpoint storage or restored
    from it (an upload or download failed, a handle is malformed or does not fit the backend);
    the cause is chained. A failed snapshot declines that checkpoint only: the working state is
    untouched and earlier checkpoints stay restorable.
    """


class SnapshotTimeoutError(SnapshotError):
    """Raised when a snapshot's uploads run past the deadline the coordinator gave; the
    checkpoint is declined. Give checkpoints more time (or checkpoint less state per subtask).
    """


class CorruptSnapshotError(SnapshotError):
    """Raised when a file of a checkpoint in storage is missing or does not match the size and
    sha256 its handle records; the message names the checkpoint, operator, subtask and file.
    Restore from an earlier checkpoint (or a savepoint).
    """
