"""The contract every keyed state backend implements (`memory`, `rocksdb`).

One backend object is the state of one **subtask** of one keyed operator (`uid`) of one job, for
one task: the runtime opens it at the start of the subtask's work in an epoch and closes it at the
end (see `streamer.state.open_backend`). What it holds:

- **States**, declared up front by name with a `StateKind`: value, list, map, and reducing /
  aggregating (an opaque accumulator the caller merges; stored like a value). Every entry lives
  under a **key group**, a **key** (bytes, from `codec.encode_key`) and a **namespace** (bytes,
  e.g. `codec.encode_window`; `b""` when there is none). Map states add a user key (bytes).
- **TTL** per entry: a write may give an expiry time (ms). Reads given `now_ms` treat an entry
  with `expires_at_ms <= now_ms` as absent and schedule its deletion; `purge_expired(now_ms)`
  drops all of them. Every write sets the entry's expiry anew (None: never expires).
- **Timers** per time domain (event / processing), an ordered state stored under the key group:
  `due_timers(domain, t)` lists the timers with time <= t sorted by (time, key group, key,
  namespace), `next_timer(domain)` the earliest time.

**Epoch protocol.** Every write is buffered; reads see the buffered writes (read your writes).
`commit(version, outputs)` makes all of them durable at once, together with the version number
(the epoch) and the epoch's outputs, so a retried task that finds `version() == epoch` replays
`outputs(epoch)` instead of applying the epoch twice. `abort()` and `close()` drop uncommitted
writes. Reads and writes are bulk (`get_many`, `put_many`, ...): the runtime touches state once per
distinct (key group, key, namespace) per epoch.

**Enumeration.** `entries_of_key_group(kg)` yields every state entry and timer of a key group
(backend-independent `StateEntry` / `Timer` records) and `ingest(kg, entries)` writes them into
another backend: checkpoints, savepoints and rescaling stand on this pair.

Values handed to `put_many` and returned by `get_many` must be treated as immutable: the memory
backend keeps the very objects (as Flink's heap backend does), the rocksdb backend a pickled copy.
A backend is used by one thread; open it in a `with` block, so that an exception still closes it
and releases the subtask's lock for the next task in the same Python worker.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from streamer.state.exceptions import (
    CommitError,
    IncompatibleStateError,
    KeyGroupError,
    StateClosedError,
    StateError,
    StateLockedError,
    UnknownStateError,
)

#: (key group, key, namespace): the address of one value, list, map or accumulator.
StateKey = tuple[int, bytes, bytes]
#: (key group, key, namespace, value): one write of `put_many`.
ValueEntry = tuple[int, bytes, bytes, Any]
#: (key group, key, namespace, values to append): one write of `append_many`.
AppendEntry = tuple[int, bytes, bytes, Sequence[Any]]
#: (key group, key, namespace, user key): the address of one map entry.
MapKey = tuple[int, bytes, bytes, bytes]
#: (key group, key, namespace, user key, value): one write of `map_put_many`.
MapEntry = tuple[int, bytes, bytes, bytes, Any]
#: (key group, time in ms, key, namespace): one timer of `add_timers` / `delete_timers`.
TimerSpec = tuple[int, int, bytes, bytes]
#: An expiry for every entry of a bulk write, or one per entry (None: never expires).
Expiry = int | Sequence[int | None] | None
DomainLike = Literal["event", "processing"] | str


class StateKind(StrEnum):
    """What a named state holds per (key group, key, namespace)."""

    VALUE = "value"
    LIST = "list"
    MAP = "map"
    REDUCING = "reducing"
    AGGREGATING = "aggregating"


#: Kinds stored as one opaque value per (key group, key, namespace).
VALUE_KINDS = frozenset({StateKind.VALUE, StateKind.REDUCING, StateKind.AGGREGATING})

#: The name prefix of broadcast state (`operators.process`): not keyed; every subtask holds a
#: full copy in the first key group it owns (key and namespace b""), and a savepoint keeps
#: subtask 0's copy only (`savepoint.format`).
BROADCAST_STATE_PREFIX = "broadcast."


class TimeDomain(StrEnum):
    """The clock a timer follows: the watermark (event) or the wall clock (processing)."""

    EVENT = "event"
    PROCESSING = "processing"


class BackendStatus(StrEnum):
    """Where a backend is in its life: usable, committing, broken by a failed commit, closed."""

    OPEN = "open"
    COMMITTING = "committing"
    FAILED = "failed"
    CLOSED = "closed"


_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}$")


@dataclass(frozen=True)
class StateDescriptor:
    """A named state and its kind; names are identifiers (letters, digits, `_ . -`)."""

    name: str
    kind: StateKind

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            msg = (f"state name {self.name!r} is not valid; use 1-200 letters, digits, '_', '.' "
                   "or '-', not starting with '.' or '-'")
            raise StateError(msg)
        try:
            object.__setattr__(self, "kind", StateKind(self.kind))
        except ValueError as exc:
            kinds = ", ".join(k.value for k in StateKind)
            msg = f"state {self.name!r} has unknown kind {self.kind!r}; use one of {kinds}"
            raise StateError(msg) from exc


@dataclass(frozen=True, order=True, slots=True)
class Timer:
    """A registered timer; timers sort by (time, key group, key, namespace)."""

    time_ms: int
    key_group: int
    key: bytes
    namespace: bytes
    domain: TimeDomain


@dataclass(frozen=True, slots=True)
class StateEntry:
    """One entry of a state in a key group, in a backend-independent form: a value or
    accumulator, a whole list (as a Python list), or one map entry (with its `user_key`).
    """

    state: str
    key: bytes
    namespace: bytes
    value: Any
    user_key: bytes | None = None
    expires_at_ms: int | None = None


#: What `entries_of_key_group` yields and `ingest` accepts.
KeyGroupEntry = StateEntry | Timer


@dataclass(frozen=True)
class BackendOptions:
    """Tuning knobs shared by the backends; the defaults suit the epoch runtime."""

    #: How many most recent epochs keep their committed outputs for replay.
    keep_outputs: int = 4
    #: How long `open` waits for another holder of the subtask's lock before `StateLockedError`.
    lock_timeout_s: float = 5.0
    #: fsync at commit (survive a machine crash, not just a process crash). Local state is
    #: restored from checkpoints after a machine loss, so this is off by default.
    sync: bool = False
    #: memory: keep committed state in a per-process cache, so a later task of the same subtask
    #: in the same Python worker skips reading the files.
    process_cache: bool = True

    def __post_init__(self) -> None:
        if self.keep_outputs < 1:
            msg = f"keep_outputs must be at least 1, got {self.keep_outputs!r}"
            raise StateError(msg)
        if self.lock_timeout_s < 0:
            msg = f"lock_timeout_s must not be negative, got {self.lock_timeout_s!r}"
            raise StateError(msg)


_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class SubtaskLocation:
    """Where a subtask's local state lives: `<root_dir>/<job>/<uid>/subtask-<n>/`."""

    root_dir: str
    job: str
    uid: str
    subtask: int

    def __post_init__(self) -> None:
        for label, part in (("job", self.job), ("uid", self.uid)):
            if not isinstance(part, str) or not _PART.match(part):
                msg = (f"{label} {part!r} cannot name a state directory; use letters, digits, "
                       "'_', '.' or '-'")
                raise StateError(msg)
        if not isinstance(self.subtask, int) or self.subtask < 0:
            msg = f"subtask must be a non-negative int, got {self.subtask!r}"
            raise StateError(msg)

    @property
    def path(self) -> Path:
        """The subtask's directory."""
        return Path(self.root_dir) / self.job / self.uid / f"subtask-{self.subtask}"


def expiries(expires_at_ms: Expiry, count: int) -> Sequence[int | None]:
    """One expiry per entry of a bulk write of `count` entries."""
    if expires_at_ms is None or isinstance(expires_at_ms, int):
        return [expires_at_ms] * count
    if len(expires_at_ms) != count:
        msg = f"got {len(expires_at_ms)} expiry times for {count} entries"
        raise StateError(msg)
    return expires_at_ms


_T = TypeVar("_T")


def wait_for_lock(attempt: Callable[[], _T], is_lock_error: Callable[[Exception], bool],
                  timeout_s: float, path: Path) -> _T:
    """Call `attempt` until it stops failing with a lock error, for at most `timeout_s` seconds
    (every 3 ms for the first 100 ms, as a holder that was asked releases within a few ms; then
    exponential back-off), then raise `StateLockedError`.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    delay = 0.003
    while True:
        try:
            return attempt()
        except Exception as exc:
            if not is_lock_error(exc):
                raise
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                msg = (f"the state of {str(path)!r} is open in another task or process (waited "
                       f"{timeout_s:g} s for its lock); let that attempt finish or close it, "
                       "then retry")
                raise StateLockedError(msg) from exc
            time.sleep(min(delay, remaining))
            if time.monotonic() - started > 0.1:
                delay = min(delay * 2, 0.25)


def as_domain(domain: DomainLike) -> TimeDomain:
    """The `TimeDomain` of 'event' / 'processing' (or a `TimeDomain`)."""
    try:
        return TimeDomain(domain)
    except ValueError as exc:
        msg = f"unknown time domain {domain!r}; use 'event' or 'processing'"
        raise StateError(msg) from exc


class KeyedStateBackend(ABC):
    """The keyed state of one subtask: named states, timers, and a versioned atomic commit."""

    #: The name `open_backend` knows the backend by.
    name: ClassVar[str]

    def __init__(self, location: SubtaskLocation, key_groups: range,
                 options: BackendOptions) -> None:
        if not isinstance(key_groups, range) or key_groups.step != 1 or len(key_groups) == 0:
            msg = f"key_groups must be a non-empty contiguous range, got {key_groups!r}"
            raise KeyGroupError(msg)
        if key_groups.start < 0 or key_groups.stop > 1 << 15:
            msg = f"key_groups {key_groups!r} exceed the key-group space [0, 32768)"
            raise KeyGroupError(msg)
        self.location = location
        self.key_groups = key_groups
        self.options = options
        self.status = BackendStatus.OPEN

    # ------------------------------------------------------------------ helpers for backends
    @property
    def path(self) -> Path:
        """The subtask's local state directory."""
        return self.location.path

    def _check_open(self) -> None:
        if self.status is BackendStatus.OPEN:
            return
        if self.status is BackendStatus.CLOSED:
            msg = f"the state backend of {str(self.path)!r} is closed; open it again"
            raise StateClosedError(msg)
        msg = (f"the state backend of {str(self.path)!r} is {self.status.value} after an error; "
               "close it and open it again")
        raise StateError(msg)

    def _check_key_group(self, key_group: int) -> None:
        if key_group not in self.key_groups:
            msg = (f"key group {key_group!r} is not owned by subtask {self.location.subtask} of "
                   f"{self.location.uid!r} (it owns {self.key_groups.start}.."
                   f"{self.key_groups.stop - 1}); the rows were routed to the wrong subtask")
            raise KeyGroupError(msg)

    def _check_write(self, key_group: int, key: object, namespace: object,
                     user_key: object = b"") -> None:
        """Check the address of a write: an owned key group, and bytes for the rest."""
        self._check_key_group(key_group)
        if type(key) is not bytes or type(namespace) is not bytes or type(user_key) is not bytes:
            msg = (f"state keys, namespaces and map user keys are bytes (encode them with "
                   f"streamer.state.codec), got {type(key).__name__}, "
                   f"{type(namespace).__name__} and {type(user_key).__name__}")
            raise StateError(msg)

    def _kind_of(self, state: str, *allowed: StateKind) -> StateKind:
        """The kind of a declared `state`, checked against the kinds an operation accepts."""
        descriptor = self.states().get(state)
        if descriptor is None:
            msg = (f"state {state!r} of operator {self.location.uid!r} is not declared; declare "
                   "it with StateDescriptor(name, kind) first")
            raise UnknownStateError(msg)
        if allowed and descriptor.kind not in allowed:
            wanted = " or ".join(k.value for k in allowed)
            msg = (f"state {state!r} is a {descriptor.kind.value} state, but this operation "
                   f"needs a {wanted} state")
            raise IncompatibleStateError(msg)
        return descriptor.kind

    def _check_declare(self, descriptor: StateDescriptor) -> bool:
        """True when `descriptor` is new; raise if it clashes with an existing declaration."""
        self._check_open()
        existing = self.states().get(descriptor.name)
        if existing is None:
            return True
        if existing.kind is not descriptor.kind:
            msg = (f"state {descriptor.name!r} of operator {self.location.uid!r} exists as a "
                   f"{existing.kind.value} state and cannot be re-declared as "
                   f"{descriptor.kind.value}; keep the kind or use a new state name")
            raise IncompatibleStateError(msg)
        return False

    # ------------------------------------------------------------------ declaration
    @abstractmethod
    def declare(self, descriptor: StateDescriptor) -> None:
        """Declare a state (idempotent); a name keeps its kind for the life of the state."""

    @abstractmethod
    def states(self) -> dict[str, StateDescriptor]:
        """The declared states by name (committed or declared since the last commit)."""

    # ------------------------------------------------------------------ values, lists, maps
    @abstractmethod
    def get_many(self, state: str, keys: Sequence[StateKey], *,
                 now_ms: int | None = None) -> list[Any]:
        """The current value of each (key group, key, namespace), None where absent or expired.
        A list state gives a list, a map state a dict {user key: value}.
        """

    def get_many_shared(self, state: str, keys: Sequence[StateKey], *,
                        now_ms: int | None = None) -> list[Any]:
        """`get_many` for a caller that only reads the values (never mutates them, nor
        anything in them): a backend may then hand the same objects to other readers (rocksdb
        decodes equal stored bytes once per process)."""
        return self.get_many(state, keys, now_ms=now_ms)

    @abstractmethod
    def put_many(self, state: str, entries: Sequence[ValueEntry], *,
                 expires_at_ms: Expiry = None) -> None:
        """Set the value of each entry (a list for list states, a dict for map states); None,
        an empty list or an empty dict deletes the entry, as Flink's `update(null)` does.
        """

    @abstractmethod
    def delete_many(self, state: str, keys: Sequence[StateKey]) -> None:
        """Remove each (key group, key, namespace) entirely (a whole list or map included)."""

    @abstractmethod
    def append_many(self, state: str, entries: Sequence[AppendEntry], *,
                    expires_at_ms: Expiry = None, now_ms: int | None = None) -> None:
        """Append values to lists (an expired list, given `now_ms`, starts empty)."""

    @abstractmethod
    def map_get_many(self, state: str, keys: Sequence[MapKey], *,
                     now_ms: int | None = None) -> list[Any]:
        """The value of each map entry, None where absent or expired."""

    @abstractmethod
    def map_put_many(self, state: str, entries: Sequence[MapEntry], *,
                     expires_at_ms: Expiry = None) -> None:
        """Set map entries, each user key with its own expiry; a None value deletes the entry."""

    @abstractmethod
    def map_delete_many(self, state: str, keys: Sequence[MapKey]) -> None:
        """Remove map entries."""

    @abstractmethod
    def map_items(self, state: str, key_group: int, key: bytes, namespace: bytes = b"", *,
                  now_ms: int | None = None) -> list[tuple[bytes, Any]]:
        """The entries of one map, sorted by user key."""

    # ------------------------------------------------------------------ single-entry shortcuts
    def get(self, state: str, key_group: int, key: bytes, namespace: bytes = b"", *,
            now_ms: int | None = None) -> Any:
        """`get_many` of one entry."""
        return self.get_many(state, [(key_group, key, namespace)], now_ms=now_ms)[0]

    def put(self, state: str, key_group: int, key: bytes, namespace: bytes, value: Any, *,
            expires_at_ms: int | None = None) -> None:
        """`put_many` of one entry."""
        self.put_many(state, [(key_group, key, namespace, value)], expires_at_ms=expires_at_ms)

    def delete(self, state: str, key_group: int, key: bytes, namespace: bytes = b"") -> None:
        """`delete_many` of one entry."""
        self.delete_many(state, [(key_group, key, namespace)])

    def append(self, state: str, key_group: int, key: bytes, namespace: bytes, value: Any, *,
               expires_at_ms: int | None = None, now_ms: int | None = None) -> None:
        """Append one value to one list."""
        self.append_many(state, [(key_group, key, namespace, [value])],
                         expires_at_ms=expires_at_ms, now_ms=now_ms)

    def map_get(self, state: str, key_group: int, key: bytes, namespace: bytes, user_key: bytes,
                *, now_ms: int | None = None) -> Any:
        """`map_get_many` of one entry."""
        return self.map_get_many(state, [(key_group, key, namespace, user_key)], now_ms=now_ms)[0]

    def map_put(self, state: str, key_group: int, key: bytes, namespace: bytes, user_key: bytes,
                value: Any, *, expires_at_ms: int | None = None) -> None:
        """`map_put_many` of one entry."""
        self.map_put_many(state, [(key_group, key, namespace, user_key, value)],
                          expires_at_ms=expires_at_ms)

    def map_delete(self, state: str, key_group: int, key: bytes, namespace: bytes,
                   user_key: bytes) -> None:
        """`map_delete_many` of one entry."""
        self.map_delete_many(state, [(key_group, key, namespace, user_key)])

    # ------------------------------------------------------------------ enumeration
    @abstractmethod
    def iterate(self, state: str, key_group: int, *,
                now_ms: int | None = None) -> Iterator[tuple[bytes, bytes, Any]]:
        """(key, namespace, value) of every entry of `state` in a key group, in no set order;
        list states give lists, map states dicts.
        """

    @abstractmethod
    def entries_of_key_group(self, key_group: int, *,
                             now_ms: int | None = None) -> Iterator[KeyGroupEntry]:
        """Every state entry (all states, by state name) and then every timer of a key group."""

    def ingest(self, key_group: int, entries: Iterable[KeyGroupEntry]) -> int:
        """Write entries from `entries_of_key_group` (of any backend) into this one, as buffered
        writes that `commit` makes durable; declare the states first. Returns the entry count.
        """
        self._check_key_group(key_group)
        values: dict[str, tuple[list[ValueEntry], list[int | None]]] = {}
        maps: dict[str, tuple[list[MapEntry], list[int | None]]] = {}
        timers: dict[TimeDomain, list[TimerSpec]] = {}
        count = 0
        for entry in entries:
            count += 1
            if isinstance(entry, Timer):
                if entry.key_group != key_group:
                    msg = (f"a timer of key group {entry.key_group} cannot be ingested into key "
                           f"group {key_group}")
                    raise KeyGroupError(msg)
                timers.setdefault(entry.domain, []).append(
                    (key_group, entry.time_ms, entry.key, entry.namespace))
            elif self._kind_of(entry.state) is StateKind.MAP:
                if entry.user_key is None:
                    msg = f"an entry of map state {entry.state!r} has no user key"
                    raise StateError(msg)
                batch, expiry = maps.setdefault(entry.state, ([], []))
                batch.append((key_group, entry.key, entry.namespace, entry.user_key, entry.value))
                expiry.append(entry.expires_at_ms)
            else:
                vbatch, expiry = values.setdefault(entry.state, ([], []))
                vbatch.append((key_group, entry.key, entry.namespace, entry.value))
                expiry.append(entry.expires_at_ms)
        for state, (vbatch, expiry) in values.items():
            self.put_many(state, vbatch, expires_at_ms=expiry)
        for state, (batch, expiry) in maps.items():
            self.map_put_many(state, batch, expires_at_ms=expiry)
        for domain, specs in timers.items():
            self.add_timers(domain, specs)
        return count

    @abstractmethod
    def purge_expired(self, now_ms: int) -> int:
        """Schedule the deletion of every entry expired at `now_ms`; returns how many."""

    # ------------------------------------------------------------------ timers
    @abstractmethod
    def add_timers(self, domain: DomainLike, timers: Iterable[TimerSpec]) -> None:
        """Register timers (key group, time, key, namespace); registering twice is one timer."""

    @abstractmethod
    def delete_timers(self, domain: DomainLike, timers: Iterable[TimerSpec]) -> None:
        """Remove timers; removing an absent timer does nothing."""

    @abstractmethod
    def due_timers(self, domain: DomainLike, up_to_ms: int, *,
                   remove: bool = False) -> list[Timer]:
        """Timers with time <= `up_to_ms`, sorted by (time, key group, key, namespace); with
        `remove`, they are also deleted (a buffered write, like any other).
        """

    @abstractmethod
    def next_timer(self, domain: DomainLike) -> int | None:
        """The earliest registered time in `domain`, or None when there is no timer."""

    def add_timer(self, domain: DomainLike, key_group: int, time_ms: int, key: bytes,
                  namespace: bytes = b"") -> None:
        """Register one timer."""
        self.add_timers(domain, [(key_group, time_ms, key, namespace)])

    def delete_timer(self, domain: DomainLike, key_group: int, time_ms: int, key: bytes,
                     namespace: bytes = b"") -> None:
        """Remove one timer."""
        self.delete_timers(domain, [(key_group, time_ms, key, namespace)])

    # ------------------------------------------------------------------ snapshots
    @abstractmethod
    def local_checkpoint(self, directory: Path) -> list[Path]:
        """Write a consistent copy of the committed state (never the buffered writes) into
        `directory`, which must not exist yet, and return the files written. A backend opened on
        a directory holding just these files sees the same version, state, timers and outputs.
        Checkpoints (`streamer.state.snapshot`) upload these files.
        """

    @abstractmethod
    def key_counts(self) -> dict[str, int]:
        """The number of committed entries per state (a map counts one per user key), for
        checkpoint statistics; a backend may estimate (rocksdb does).
        """

    @classmethod
    def immutable_file(cls, name: str) -> bool:
        """Whether a file of `local_checkpoint` named `name` never changes once written, so
        successive checkpoints may share one uploaded copy of it (rocksdb's SST files).
        """
        return False

    # ------------------------------------------------------------------ epochs
    @abstractmethod
    def version(self) -> int | None:
        """The last committed version (epoch), or None before the first commit."""

    @abstractmethod
    def outputs(self, version: int) -> bytes | None:
        """The outputs committed with `version`, if it is among the last `keep_outputs`."""

    @abstractmethod
    def commit(self, version: int, outputs: bytes | None = None) -> None:
        """Atomically make every buffered write durable, with `version` (above the last one)
        and the epoch's `outputs`.
        """

    @abstractmethod
    def abort(self) -> None:
        """Drop every buffered write; the backend stays open at the last committed version."""

    @abstractmethod
    def close(self) -> None:
        """Drop buffered writes and release the subtask (its lock, files and handles)."""

    def park(self) -> None:
        """The task is done with the subtask: like `close`, but a backend may keep it open for
        the next task of this process (`rocksdb` does, until another process asks for it)."""
        self.close()

    def __enter__(self) -> KeyedStateBackend:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    def _check_version(self, version: int) -> None:
        current = self.version()
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            msg = f"commit version must be a non-negative int, got {version!r}"
            raise CommitError(msg)
        if current is not None and version <= current:
            msg = (f"cannot commit version {version} of {str(self.path)!r}: version {current} is "
                   "already committed; a retried task should replay outputs(version) instead")
            raise CommitError(msg)
