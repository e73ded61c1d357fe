"""The rocksdb state backend: one RocksDB (rocksdict) per subtask, column families per state.

Layout: `<root>/<job>/<uid>/subtask-<n>/` is one RocksDB with a column family `state:<name>` per
declared state, `_timers` for timers of both domains, and `_meta` for the committed version, the
last outputs and the declared state kinds. Every key in a state or timer column family starts
with the 2-byte key group (`codec.state_key`, `codec.timer_key`), so a key group is one key
range: enumerable per key group, and due timers are one range scan per owned key group. Values
are a 1-byte tag, an optional 8-byte expiry, then the pickled value (lists: length-prefixed
pickled elements, so appending never decodes the list).

**Commit.** Writes of an epoch are buffered in Python (read-your-writes through the buffer) and
written by `commit` as ONE `WriteBatch` together with the version and outputs: atomic through
RocksDB's write-ahead log, with no partial epoch visible after a crash.

**Parked between tasks, released on request.** PySpark's Python workers are not pinned to
partitions, so the next epoch of a subtask may run in another worker process; an Rdict simply
cached open in a worker holds RocksDB's LOCK and the other process fails (the measured trap in
ARCHITECTURE.md §4: 82 of 160 tasks). Opening and closing the DB in every task avoided that but
cost 20-55 ms per task (flush, close, open), most of a near-empty keyed epoch. So a task of a
small epoch (`KeyedConfig.park`) that ends well *parks* the backend (`park`): it stays open in
this process, idle, and the next task of the same subtask here takes it back without opening
anything (~0.4 ms per task instead of ~40 ms, measured at load 6). Big epochs close it: there a
handoff to another worker costs more than the open it saves. A process that finds the DB locked
leaves a `RELEASE-REQUEST` file in the subtask directory; a watcher thread of the holding
process closes its parked handle (flushing, as below) within `_WATCH_S` and removes the request,
and the waiter's lock retry then succeeds. A parked handle is also closed when its directory is
gone or was replaced (a restore), and after `_PARK_IDLE_S` unused. It is only ever reused while
this process held the LOCK throughout, so it cannot be stale. The cost of the old way, measured
on the 2-core CI machine kind: opening an
existing DB costs ~7-10 ms for a small DB and ~16-24 ms with 1 M keys (bench/state_backends.py),
an empty epoch (open, commit, close) ~20 ms, against ~0.3 ms for the memory backend's cached
dicts; for a 100 k-key epoch (~420 ms in all) the open is about 5 %. What must not be paid at open
is a write-ahead-log replay: a DB closed right after a 100 k-entry commit without a flush took
~70 ms to reopen (replay + flush of the recovered memtable). So `close()` flushes the column
families written in the task (~20-70 ms for 100 k entries; rocksdict also flushes a column
family when its handle is dropped), and the next open, in whichever process, is back to the
plain open cost. A second opener of a DB that is still open gets RocksDB's lock error ("lock
hold by current process" in the same process, "While lock file ... Resource temporarily
unavailable" from another); it is retried with exponential back-off for `lock_timeout_s` and then
raised as `StateLockedError`.

Iteration never keeps a RocksDB iterator across a `yield` (scans read bounded chunks into
lists): a live iterator would keep the DB, and its LOCK, alive after `close()`.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import shutil
import struct
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from rocksdict import (
    BlockBasedOptions,
    Checkpoint,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from streamer.state.base import (
    AppendEntry,
    BackendOptions,
    BackendStatus,
    DomainLike,
    Expiry,
    KeyedStateBackend,
    KeyGroupEntry,
    MapEntry,
    MapKey,
    StateDescriptor,
    StateEntry,
    StateKey,
    StateKind,
    SubtaskLocation,
    TimeDomain,
    Timer,
    TimerSpec,
    ValueEntry,
    as_domain,
    expiries,
    wait_for_lock,
)
from streamer.state.codec import (
    DOMAIN_CODES,
    decode_value,
    encode_time,
    encode_value,
    key_group_prefix,
    prefix_end,
    split_state_key,
    split_timer_key,
    state_key,
    timer_key,
    timer_prefix,
)
from streamer.state.exceptions import CorruptStateError, StateError

_META = "_meta"
_TIMERS = "_timers"
_STATE_PREFIX = "state:"
_VERSION_KEY = b"version"
_FORMAT_KEY = b"format"
_FORMAT = b"streamer-rocksdb-state/1"
_OUTPUTS_PREFIX = b"outputs:"
_KIND_PREFIX = b"state:"

_PLAIN, _EXPIRING = b"\x00", b"\x01"
_EXPIRY = struct.Struct(">q")
_LEN = struct.Struct(">I")
_Q = struct.Struct(">Q")
_MAX_TIME = (1 << 63) - 1
_CHUNK = 4096
_MISSING: Any = object()
_LOCK_ERROR = re.compile(r"lock file|lock hold", re.IGNORECASE)


def _db_options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.set_keep_log_file_num(2)
    options.set_max_background_jobs(2)
    return options


def _cf_options() -> Options:
    options = _db_options()
    table = BlockBasedOptions()
    # Most reads of a new window miss: a whole-key bloom filter answers those without I/O.
    table.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table)
    return options


def _frame(payload: bytes, expires_at_ms: int | None) -> bytes:
    if expires_at_ms is None:
        return _PLAIN + payload
    return _EXPIRING + _EXPIRY.pack(expires_at_ms) + payload


def _unframe(raw: bytes, now_ms: int | None) -> bytes | None:
    """The payload of a stored value, or None when it has expired at `now_ms`."""
    if raw[0] == 0:
        return raw[1:]
    if now_ms is not None and _EXPIRY.unpack_from(raw, 1)[0] <= now_ms:
        return None
    return raw[9:]


def _expiry_of(raw: bytes) -> int | None:
    return None if raw[0] == 0 else int(_EXPIRY.unpack_from(raw, 1)[0])


def _encode_list(values: Iterable[Any]) -> bytes:
    parts = []
    for value in values:
        data = encode_value(value)
        parts.append(_LEN.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def _decode_list(payload: bytes) -> list[Any]:
    out = []
    pos, end = 0, len(payload)
    while pos < end:
        (size,) = _LEN.unpack_from(payload, pos)
        pos += 4
        out.append(decode_value(payload[pos:pos + size]))
        pos += size
    return out


def _merge(db_pairs: list[tuple[bytes, bytes]],
           buffered: list[tuple[bytes, bytes | None]]) -> list[tuple[bytes, bytes]]:
    """Two sorted runs of (key, value) merged, buffered writes winning, deletions dropped."""
    if not buffered:
        return db_pairs
    out: list[tuple[bytes, bytes]] = []
    i, n = 0, len(buffered)
    for key, value in db_pairs:
        while i < n and buffered[i][0] < key:
            bkey, bvalue = buffered[i]
            i += 1
            if bvalue is not None:
                out.append((bkey, bvalue))
        if i < n and buffered[i][0] == key:
            bvalue = buffered[i][1]
            i += 1
            if bvalue is not None:
                out.append((key, bvalue))
            continue
        out.append((key, value))
    out.extend((k, v) for k, v in buffered[i:] if v is not None)
    return out


def _is_lock_error(exc: Exception) -> bool:
    return bool(_LOCK_ERROR.search(str(exc)))


#: A file a process leaves in a subtask directory whose DB another process holds open: the
#: holder's watcher closes its parked handle when it sees it.
RELEASE_REQUEST = "RELEASE-REQUEST"
#: How often the watcher looks for release requests, and how long a parked DB stays open unused.
_WATCH_S = 0.005
_PARK_IDLE_S = 120.0
#: path -> the backend parked open in this process (see the module docstring).
_PARKED: dict[str, RocksDBBackend] = {}
_PARKED_LOCK = threading.Lock()
_WATCHER: list[threading.Thread] = []


def _dir_id(path: Path) -> tuple[int, int] | None:
    """The identity of a directory (device, inode), None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _watch() -> None:
    """Close parked handles that another process asked for, whose directory is gone or was
    replaced, or that stayed unused for `_PARK_IDLE_S`."""
    while True:
        time.sleep(_WATCH_S)
        with _PARKED_LOCK:
            parked = list(_PARKED.items())
        now = time.monotonic()
        for key, backend in parked:
            request = backend.path / RELEASE_REQUEST
            if not (os.path.exists(request) or _dir_id(backend.path) != backend.dir_id
                    or now - backend.parked_at > _PARK_IDLE_S):
                continue
            with _PARKED_LOCK:
                if _PARKED.get(key) is not backend:
                    continue  # a task took it back meanwhile
                del _PARKED[key]
            with contextlib.suppress(Exception):
                backend.close()
            with contextlib.suppress(OSError):
                os.unlink(request)


def release_parked(path: str | os.PathLike[str] | None = None) -> None:
    """Close this process's parked handle of the subtask directory `path` (or all of them)."""
    with _PARKED_LOCK:
        if path is None:
            backends = list(_PARKED.values())
            _PARKED.clear()
        else:
            found = _PARKED.pop(os.path.abspath(path), None)
            backends = [found] if found is not None else []
    for backend in backends:
        with contextlib.suppress(Exception):
            backend.close()


def _unpark(path: Path, key_groups: range) -> RocksDBBackend | None:
    """The backend parked by this process for `path` if it can serve the next task."""
    with _PARKED_LOCK:
        backend = _PARKED.pop(os.path.abspath(path), None)
    if backend is None:
        return None
    if (backend.status is BackendStatus.OPEN and backend.key_groups == key_groups
            and _dir_id(path) == backend.dir_id):
        return backend
    with contextlib.suppress(Exception):
        backend.close()
    return None


def _open_db(path: Path, timeout_s: float) -> tuple[Rdict, list[str]]:
    """The DB of a subtask directory (created if missing) and its column family names."""
    asked = False

    def attempt() -> tuple[Rdict, list[str]]:
        nonlocal asked
        names = {_META, _TIMERS}
        try:
            if (path / "CURRENT").exists():
                names.update(Rdict.list_cf(str(path), _db_options()))
            names.discard("default")
            families = {name: _cf_options() for name in names}
            return Rdict(str(path), _db_options(), column_families=families), sorted(names)
        except Exception as exc:
            if _is_lock_error(exc):
                if "current process" in str(exc):
                    release_parked(path)  # parked here (same process): close it now
                else:  # parked in another process: ask its watcher to close it (again, if
                    # the holder took it back for a task and answered an earlier request)
                    with contextlib.suppress(OSError):
                        (path / RELEASE_REQUEST).touch()
                    asked = True
            raise

    try:
        found = wait_for_lock(attempt, _is_lock_error, timeout_s, path)
        if asked:
            with contextlib.suppress(OSError):
                (path / RELEASE_REQUEST).unlink()
        return found
    except StateError:
        raise
    except Exception as exc:
        msg = (f"cannot open the RocksDB state in {str(path)!r}: {exc}; if it is damaged, delete "
               "the subtask directory and restore from a checkpoint")
        raise CorruptStateError(msg) from exc


class RocksDBBackend(KeyedStateBackend):
    """Keyed state in one RocksDB per subtask, committed with one WriteBatch per epoch."""

    name = "rocksdb"

    def __init__(self, location: SubtaskLocation, key_groups: range,
                 options: BackendOptions | None = None,
                 states: Iterable[StateDescriptor] = ()) -> None:
        super().__init__(location, key_groups, options or BackendOptions())
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            msg = f"cannot create the state directory {str(self.path)!r}: {exc}"
            raise StateError(msg) from exc
        self._db: Rdict | None
        self._db, families = _open_db(self.path, self.options.lock_timeout_s)
        #: The directory opened (a restore replaces it), and when the backend was last parked.
        self.dir_id = _dir_id(self.path)
        self.parked_at = 0.0
        self._cfs: dict[str, Rdict] = {}
        self._handles: dict[str, Any] = {}
        self._pending: dict[str, dict[bytes, bytes | None]] = {}
        self._sorted: dict[str, list[bytes]] = {}
        self._declared: dict[str, StateKind] = {}
        self._kinds: dict[str, StateKind] = {}
        self._written: set[str] = set()
        try:
            for name in families:
                self._attach(name)
            self._read_meta()
            for descriptor in states:
                self.declare(descriptor)
        except BaseException:
            self._release()
            raise

    def _attach(self, cf_name: str) -> None:
        assert self._db is not None
        self._cfs[cf_name] = self._db.get_column_family(cf_name)
        self._handles[cf_name] = self._db.get_column_family_handle(cf_name)

    def _read_meta(self) -> None:
        meta = self._cfs[_META]
        fmt = meta.get(_FORMAT_KEY)
        if fmt is not None and fmt != _FORMAT:
            msg = (f"{str(self.path)!r} holds state format {fmt!r}; this streamer reads "
                   f"{_FORMAT!r}")
            raise CorruptStateError(msg)
        raw = meta.get(_VERSION_KEY)
        self._version: int | None = None if raw is None else int(_Q.unpack(raw)[0])
        self._output_versions = [int(_Q.unpack(k[len(_OUTPUTS_PREFIX):])[0]) for k, _ in
                                 self._read_db(_META, _OUTPUTS_PREFIX,
                                               prefix_end(_OUTPUTS_PREFIX), None)]
        for key, value in self._read_db(_META, _KIND_PREFIX, prefix_end(_KIND_PREFIX), None):
            self._kinds[key[len(_KIND_PREFIX):].decode()] = StateKind(value.decode())

    # ------------------------------------------------------------------ low-level access
    def _read_db(self, cf_name: str, lo: bytes, hi: bytes | None,
                 limit: int | None) -> list[tuple[bytes, bytes]]:
        """Up to `limit` committed (key, value) pairs in [lo, hi), read with a short-lived
        iterator (a live iterator would keep the DB and its LOCK alive after close).
        """
        read_options = ReadOptions()
        if hi is not None:
            read_options.set_iterate_upper_bound(hi)
        out: list[tuple[bytes, bytes]] = []
        for key, value in self._cfs[cf_name].items(from_key=lo, read_opt=read_options):
            out.append((cast(bytes, key), value))  # raw mode: keys are bytes
            if limit is not None and len(out) >= limit:
                break
        return out

    def _buffer(self, cf_name: str) -> dict[bytes, bytes | None]:
        self._sorted.pop(cf_name, None)
        buffer = self._pending.get(cf_name)
        if buffer is None:
            buffer = self._pending[cf_name] = {}
        return buffer

    def _buffered_range(self, cf_name: str, lo: bytes,
                        hi: bytes | None) -> list[tuple[bytes, bytes | None]]:
        buffer = self._pending.get(cf_name)
        if not buffer:
            return []
        keys = self._sorted.get(cf_name)
        if keys is None:
            keys = self._sorted[cf_name] = sorted(buffer)
        start = bisect.bisect_left(keys, lo)
        stop = len(keys) if hi is None else bisect.bisect_left(keys, hi)
        return [(k, buffer[k]) for k in keys[start:stop]]

    def _scan(self, cf_name: str, lo: bytes, hi: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) in [lo, hi), committed and buffered, in key order."""
        buffered = self._buffered_range(cf_name, lo, hi)
        start = lo
        while True:
            self._check_open()
            chunk = self._read_db(cf_name, start, hi, _CHUNK)
            if len(chunk) < _CHUNK:
                yield from _merge(chunk, buffered)
                return
            last = chunk[-1][0]
            cut = bisect.bisect_right(buffered, last, key=lambda pair: pair[0])
            yield from _merge(chunk, buffered[:cut])
            buffered = buffered[cut:]
            start = last + b"\x00"

    def _lookup(self, cf_name: str, key: bytes) -> bytes | None:
        buffer = self._pending.get(cf_name)
        if buffer is not None:
            raw = buffer.get(key, _MISSING)
            if raw is not _MISSING:
                return raw
        return self._cfs[cf_name].get(key)

    def _state_cf(self, state: str, *allowed: StateKind) -> tuple[str, StateKind]:
        self._check_open()
        kind = self._kind_of(state, *allowed)
        return _STATE_PREFIX + state, kind

    # ------------------------------------------------------------------ declaration
    def declare(self, descriptor: StateDescriptor) -> None:
        """Declare a state (idempotent); a name keeps its kind for the life of the state."""
        if not self._check_declare(descriptor):
            return
        cf_name = _STATE_PREFIX + descriptor.name
        if cf_name not in self._cfs:
            assert self._db is not None
            self._db.create_column_family(cf_name, _cf_options())
            self._attach(cf_name)
        self._declared[descriptor.name] = descriptor.kind

    def states(self) -> dict[str, StateDescriptor]:
        """The declared states by name (committed or declared since the last commit)."""
        kinds = {**self._kinds, **self._declared}
        return {name: StateDescriptor(name, kind) for name, kind in kinds.items()}

    # ------------------------------------------------------------------ values, lists, maps
    def get_many(self, state: str, keys: Sequence[StateKey], *,
                 now_ms: int | None = None) -> list[Any]:
        """The current value of each (key group, key, namespace), None where absent or expired.
        A list state gives a list, a map state a dict {user key: value}.
        """
        cf_name, kind = self._state_cf(state)
        check = self._check_key_group
        if kind is StateKind.MAP:
            out: list[Any] = []
            for kg, key, ns in keys:
                check(kg)
                items = self.map_items(state, kg, key, ns, now_ms=now_ms)
                out.append(dict(items) if items else None)
            return out
        decode = _decode_list if kind is StateKind.LIST else decode_value
        buffer = self._pending.get(cf_name) or {}
        get = self._cfs[cf_name].get
        out = []
        for kg, key, ns in keys:
            check(kg)
            stored_key = state_key(kg, key, ns)
            raw = buffer.get(stored_key, _MISSING)
            if raw is _MISSING:
                raw = get(stored_key)
            if raw is None:
                out.append(None)
                continue
            payload = _unframe(raw, now_ms)
            if payload is None:
                self._buffer(cf_name)[stored_key] = None
                out.append(None)
            else:
                out.append(decode(payload))
        return out

    def put_many(self, state: str, entries: Sequence[ValueEntry], *,
                 expires_at_ms: Expiry = None) -> None:
        """Set the value of each entry (a list for list states, a dict for map states); None,
        an empty list or an empty dict deletes the entry, as Flink's `update(null)` does.
        """
        cf_name, kind = self._state_cf(state)
        if kind is StateKind.MAP:
            for (kg, key, ns, value), expiry in zip(
                    entries, expiries(expires_at_ms, len(entries)), strict=True):
                self._check_write(kg, key, ns)
                if value is not None and not isinstance(value, Mapping):
                    msg = f"map state {state!r} takes dict values, got {type(value).__name__}"
                    raise StateError(msg)
                self._clear_map(cf_name, kg, key, ns)
                if value:
                    self.map_put_many(state, [(kg, key, ns, uk, v) for uk, v in value.items()],
                                      expires_at_ms=expiry)
            return
        buffer = self._buffer(cf_name)
        is_list = kind is StateKind.LIST
        for (kg, key, ns, value), expiry in zip(entries, expiries(expires_at_ms, len(entries)),
                                                strict=True):
            self._check_write(kg, key, ns)
            stored_key = state_key(kg, key, ns)
            if value is None:
                buffer[stored_key] = None
            elif is_list:
                payload = _encode_list(value)
                buffer[stored_key] = _frame(payload, expiry) if payload else None
            else:
                buffer[stored_key] = _frame(encode_value(value), expiry)

    def _clear_map(self, cf_name: str, kg: int, key: bytes, ns: bytes) -> None:
        prefix = state_key(kg, key, ns)
        doomed = [k for k, _ in self._scan(cf_name, prefix, prefix_end(prefix))]
        buffer = self._buffer(cf_name)
        for stored_key in doomed:
            buffer[stored_key] = None

    def delete_many(self, state: str, keys: Sequence[StateKey]) -> None:
        """Remove each (key group, key, namespace) entirely (a whole list or map included)."""
        cf_name, kind = self._state_cf(state)
        for kg, key, ns in keys:
            self._check_key_group(kg)
            if kind is StateKind.MAP:
                self._clear_map(cf_name, kg, key, ns)
            else:
                self._buffer(cf_name)[state_key(kg, key, ns)] = None

    def append_many(self, state: str, entries: Sequence[AppendEntry], *,
                    expires_at_ms: Expiry = None, now_ms: int | None = None) -> None:
        """Append values to lists (an expired list, given `now_ms`, starts empty)."""
        cf_name, _ = self._state_cf(state, StateKind.LIST)
        for (kg, key, ns, values), expiry in zip(entries, expiries(expires_at_ms, len(entries)),
                                                 strict=True):
            self._check_write(kg, key, ns)
            if not values:
                continue
            stored_key = state_key(kg, key, ns)
            raw = self._lookup(cf_name, stored_key)
            current = b"" if raw is None else _unframe(raw, now_ms) or b""
            self._buffer(cf_name)[stored_key] = _frame(current + _encode_list(values), expiry)

    def map_get_many(self, state: str, keys: Sequence[MapKey], *,
                     now_ms: int | None = None) -> list[Any]:
        """The value of each map entry, None where absent or expired."""
        cf_name, _ = self._state_cf(state, StateKind.MAP)
        out: list[Any] = []
        for kg, key, ns, user_key in keys:
            self._check_key_group(kg)
            stored_key = state_key(kg, key, ns) + user_key
            raw = self._lookup(cf_name, stored_key)
            payload = None if raw is None else _unframe(raw, now_ms)
            if raw is not None and payload is None:
                self._buffer(cf_name)[stored_key] = None
            out.append(None if payload is None else decode_value(payload))
        return out

    def map_put_many(self, state: str, entries: Sequence[MapEntry], *,
                     expires_at_ms: Expiry = None) -> None:
        """Set map entries, each user key with its own expiry; a None value deletes the entry."""
        cf_name, _ = self._state_cf(state, StateKind.MAP)
        buffer = self._buffer(cf_name)
        for (kg, key, ns, user_key, value), expiry in zip(
                entries, expiries(expires_at_ms, len(entries)), strict=True):
            self._check_write(kg, key, ns, user_key)
            buffer[state_key(kg, key, ns) + user_key] = \
                None if value is None else _frame(encode_value(value), expiry)

    def map_delete_many(self, state: str, keys: Sequence[MapKey]) -> None:
        """Remove map entries."""
        cf_name, _ = self._state_cf(state, StateKind.MAP)
        buffer = self._buffer(cf_name)
        for kg, key, ns, user_key in keys:
            self._check_key_group(kg)
            buffer[state_key(kg, key, ns) + user_key] = None

    def map_items(self, state: str, key_group: int, key: bytes, namespace: bytes = b"", *,
                  now_ms: int | None = None) -> list[tuple[bytes, Any]]:
        """The entries of one map, sorted by user key."""
        cf_name, _ = self._state_cf(state, StateKind.MAP)
        self._check_key_group(key_group)
        prefix = state_key(key_group, key, namespace)
        out: list[tuple[bytes, Any]] = []
        expired: list[bytes] = []
        for stored_key, raw in self._scan(cf_name, prefix, prefix_end(prefix)):
            payload = _unframe(raw, now_ms)
            if payload is None:
                expired.append(stored_key)
            else:
                out.append((stored_key[len(prefix):], decode_value(payload)))
        if expired:
            buffer = self._buffer(cf_name)
            for stored_key in expired:
                buffer[stored_key] = None
        return out

    # ------------------------------------------------------------------ enumeration
    def iterate(self, state: str, key_group: int, *,
                now_ms: int | None = None) -> Iterator[tuple[bytes, bytes, Any]]:
        """(key, namespace, value) of every entry of `state` in a key group, in no set order;
        list states give lists, map states dicts.
        """
        cf_name, kind = self._state_cf(state)
        self._check_key_group(key_group)
        prefix = key_group_prefix(key_group)
        current: tuple[bytes, bytes] | None = None
        entries: dict[bytes, Any] = {}
        decode = _decode_list if kind is StateKind.LIST else decode_value
        for stored_key, raw in self._scan(cf_name, prefix, prefix_end(prefix)):
            payload = _unframe(raw, now_ms)
            if payload is None:
                continue
            _, key, ns, user_key = split_state_key(stored_key)
            if kind is not StateKind.MAP:
                yield key, ns, decode(payload)
                continue
            if current is not None and current != (key, ns) and entries:
                yield current[0], current[1], entries
                entries = {}
            current = (key, ns)
            entries[user_key] = decode_value(payload)
        if current is not None and entries:
            yield current[0], current[1], entries

    def entries_of_key_group(self, key_group: int, *,
                             now_ms: int | None = None) -> Iterator[KeyGroupEntry]:
        """Every state entry (all states, by state name) and then every timer of a key group."""
        self._check_open()
        self._check_key_group(key_group)
        prefix = key_group_prefix(key_group)
        for state, descriptor in sorted(self.states().items()):
            cf_name = _STATE_PREFIX + state
            for stored_key, raw in self._scan(cf_name, prefix, prefix_end(prefix)):
                payload = _unframe(raw, now_ms)
                if payload is None:
                    continue
                _, key, ns, user_key = split_state_key(stored_key)
                if descriptor.kind is StateKind.MAP:
                    yield StateEntry(state, key, ns, decode_value(payload), user_key,
                                     _expiry_of(raw))
                elif descriptor.kind is StateKind.LIST:
                    yield StateEntry(state, key, ns, _decode_list(payload), None, _expiry_of(raw))
                else:
                    yield StateEntry(state, key, ns, decode_value(payload), None, _expiry_of(raw))
        for domain in TimeDomain:
            lo = timer_prefix(key_group, DOMAIN_CODES[domain.value])
            for stored_key, _ in self._scan(_TIMERS, lo, prefix_end(lo)):
                kg, _, time_ms, key, ns = split_timer_key(stored_key)
                yield Timer(time_ms, kg, key, ns, domain)

    def purge_expired(self, now_ms: int) -> int:
        """Schedule the deletion of every entry expired at `now_ms`; returns how many."""
        self._check_open()
        lo = key_group_prefix(self.key_groups.start)
        hi = key_group_prefix(self.key_groups.stop)  # stop <= 32768 fits the 2-byte prefix
        count = 0
        for state in self.states():
            cf_name = _STATE_PREFIX + state
            doomed = [k for k, raw in self._scan(cf_name, lo, hi)
                      if raw[0] != 0 and _unframe(raw, now_ms) is None]
            if doomed:
                buffer = self._buffer(cf_name)
                for stored_key in doomed:
                    buffer[stored_key] = None
            count += len(doomed)
        return count

    # ------------------------------------------------------------------ timers
    def add_timers(self, domain: DomainLike, timers: Iterable[TimerSpec]) -> None:
        """Register timers (key group, time, key, namespace); registering twice is one timer."""
        self._set_timers(domain, timers, b"")

    def delete_timers(self, domain: DomainLike, timers: Iterable[TimerSpec]) -> None:
        """Remove timers; removing an absent timer does nothing."""
        self._set_timers(domain, timers, None)

    def _set_timers(self, domain: DomainLike, timers: Iterable[TimerSpec],
                    value: bytes | None) -> None:
        self._check_open()
        code = DOMAIN_CODES[as_domain(domain).value]
        buffer = self._buffer(_TIMERS)
        for kg, time_ms, key, ns in timers:
            self._check_write(kg, key, ns)
            buffer[timer_key(kg, code, time_ms, key, ns)] = value

    def _timer_ranges(self, domain: TimeDomain,
                      up_to_ms: int | None) -> Iterator[tuple[int, bytes, bytes | None]]:
        code = DOMAIN_CODES[domain.value]
        for kg in self.key_groups:
            lo = timer_prefix(kg, code)
            if up_to_ms is None or up_to_ms >= _MAX_TIME:
                yield kg, lo, prefix_end(lo)
            else:
                yield kg, lo, lo + encode_time(up_to_ms + 1)

    def due_timers(self, domain: DomainLike, up_to_ms: int, *,
                   remove: bool = False) -> list[Timer]:
        """Timers with time <= `up_to_ms`, sorted by (time, key group, key, namespace); with
        `remove`, they are also deleted (a buffered write, like any other).
        """
        self._check_open()
        time_domain = as_domain(domain)
        due: list[Timer] = []
        iterator = self._cfs[_TIMERS].iter()
        try:
            for _, lo, hi in self._timer_ranges(time_domain, up_to_ms):
                committed: list[tuple[bytes, bytes]] = []
                iterator.seek(lo)
                while iterator.valid():
                    stored_key = iterator.key()
                    if hi is not None and stored_key >= hi:
                        break
                    committed.append((stored_key, b""))
                    iterator.next()
                for stored_key, _ in _merge(committed, self._buffered_range(_TIMERS, lo, hi)):
                    kg, _, time_ms, key, ns = split_timer_key(stored_key)
                    due.append(Timer(time_ms, kg, key, ns, time_domain))
        finally:
            del iterator
        due.sort()
        if remove:
            self.delete_timers(time_domain,
                               [(t.key_group, t.time_ms, t.key, t.namespace) for t in due])
        return due

    def next_timer(self, domain: DomainLike) -> int | None:
        """The earliest registered time in `domain`, or None when there is no timer."""
        self._check_open()
        best: int | None = None
        buffer = self._pending.get(_TIMERS, {})
        iterator = self._cfs[_TIMERS].iter()
        try:
            for _, lo, hi in self._timer_ranges(as_domain(domain), None):
                iterator.seek(lo)
                while iterator.valid():
                    stored_key = iterator.key()
                    if hi is not None and stored_key >= hi:
                        break
                    if buffer.get(stored_key, b"") is not None:
                        time_ms = split_timer_key(stored_key)[2]
                        best = time_ms if best is None else min(best, time_ms)
                        break
                    iterator.next()
                for stored_key, value in self._buffered_range(_TIMERS, lo, hi):
                    if value is not None:
                        time_ms = split_timer_key(stored_key)[2]
                        best = time_ms if best is None else min(best, time_ms)
                        break
        finally:
            del iterator
        return best

    # ------------------------------------------------------------------ snapshots
    def local_checkpoint(self, directory: Path) -> list[Path]:
        """RocksDB's checkpoint of the committed state into `directory` (must not exist): it
        flushes the memtables, hard-links the SST files (same file system; ~ms for 1 M keys) and
        copies MANIFEST, CURRENT, OPTIONS and the (empty) write-ahead log. Files RocksDB may
        change are made private copies, so the copy stays valid while the DB goes on.
        """
        self._check_open()
        assert self._db is not None
        checkpoint = Checkpoint(self._db)
        try:
            checkpoint.create_checkpoint(str(directory))
        except Exception as exc:
            msg = (f"cannot create a RocksDB checkpoint of {str(self.path)!r} in "
                   f"{str(directory)!r}: {exc}")
            raise StateError(msg) from exc
        finally:
            del checkpoint  # a live Checkpoint object keeps the DB (and its LOCK) alive
        files = sorted(p for p in directory.iterdir() if p.is_file())
        for file in files:
            if not self.immutable_file(file.name) and file.stat().st_nlink > 1:
                tmp = file.with_name(f".{file.name}.copy")
                shutil.copyfile(file, tmp)
                os.replace(tmp, file)
        return files

    def key_counts(self) -> dict[str, int]:
        """RocksDB's estimate (`rocksdb.estimate-num-keys`) of the entries per committed state:
        exact right after a flush of inserts only, approximate once overwrites and deletions sit
        in several files.
        """
        self._check_open()
        return {name: int(self._cfs[_STATE_PREFIX + name]
                          .property_int_value("rocksdb.estimate-num-keys") or 0)
                for name in sorted(self._kinds)}

    @classmethod
    def immutable_file(cls, name: str) -> bool:
        """SST (and blob) files: RocksDB never rewrites one, it writes new ones."""
        return name.endswith((".sst", ".blob"))

    # ------------------------------------------------------------------ epochs
    def version(self) -> int | None:
        """The last committed version (epoch), or None before the first commit."""
        return self._version

    def outputs(self, version: int) -> bytes | None:
        """The outputs committed with `version`, if it is among the last `keep_outputs`."""
        self._check_open()
        return self._cfs[_META].get(_OUTPUTS_PREFIX + _Q.pack(version))

    def commit(self, version: int, outputs: bytes | None = None) -> None:
        """Atomically make every buffered write durable, with `version` (above the last one)
        and the epoch's `outputs`.
        """
        # 1. Check: open, and the version moves forward.
        self._check_open()
        self._check_version(version)
        self.status = BackendStatus.COMMITTING
        try:
            # 2. One WriteBatch: every buffered write, new declarations, version, outputs.
            batch = WriteBatch(raw_mode=True)
            for cf_name, buffer in self._pending.items():
                handle = self._handles[cf_name]
                for stored_key, raw in buffer.items():
                    if raw is None:
                        batch.delete(stored_key, handle)
                    else:
                        batch.put(stored_key, raw, handle)
            meta = self._handles[_META]
            batch.put(_FORMAT_KEY, _FORMAT, meta)
            for name, kind in self._declared.items():
                batch.put(_KIND_PREFIX + name.encode(), kind.value.encode(), meta)
            batch.put(_VERSION_KEY, _Q.pack(version), meta)
            kept = list(self._output_versions)
            if outputs is not None:
                batch.put(_OUTPUTS_PREFIX + _Q.pack(version), outputs, meta)
                kept.append(version)
            for old in kept[:-self.options.keep_outputs]:
                batch.delete(_OUTPUTS_PREFIX + _Q.pack(old), meta)
            # 3. Write it: atomic through the write-ahead log.
            write_options = WriteOptions()
            write_options.sync = self.options.sync
            assert self._db is not None
            self._db.write(batch, write_options)
        except Exception as exc:
            self.status = BackendStatus.FAILED
            msg = f"cannot commit version {version} to {str(self.path)!r}: {exc}"
            raise StateError(msg) from exc
        # 4. The buffer is now the committed state.
        self._written.update(self._pending)
        self._written.add(_META)
        self._pending.clear()
        self._sorted.clear()
        self._kinds.update(self._declared)
        self._declared.clear()
        self._version = version
        self._output_versions = kept[-self.options.keep_outputs:]
        self.status = BackendStatus.OPEN

    def abort(self) -> None:
        """Drop every buffered write; the backend stays open at the last committed version."""
        self._check_open()
        self._pending.clear()
        self._sorted.clear()

    def close(self) -> None:
        """Drop buffered writes, flush what this task committed (so the next open need not
        replay the write-ahead log) and close the DB, releasing its LOCK.
        """
        if self.status is BackendStatus.CLOSED:
            return
        healthy = self.status is BackendStatus.OPEN
        self.status = BackendStatus.CLOSED
        self._pending.clear()
        self._sorted.clear()
        try:
            if healthy:
                for cf_name in sorted(self._written):
                    self._cfs[cf_name].flush()
        finally:
            self._release()

    def park(self) -> None:
        """Keep the DB open for the next task of this subtask in this process (module
        docstring); a backend that is not healthy, or with `process_cache` off, closes."""
        if self.status is not BackendStatus.OPEN or not self.options.process_cache:
            self.close()
            return
        self._pending.clear()  # what a task buffered but did not commit is dropped
        self._sorted.clear()
        self.parked_at = time.monotonic()
        key = os.path.abspath(self.path)
        with _PARKED_LOCK:
            previous = _PARKED.get(key)
            _PARKED[key] = self
            if not _WATCHER:
                _WATCHER.append(threading.Thread(target=_watch, name="rocksdb-parking",
                                                 daemon=True))
                _WATCHER[0].start()
        if previous is not None and previous is not self:
            with contextlib.suppress(Exception):
                previous.close()

    def _release(self) -> None:
        self._cfs.clear()
        self._handles.clear()
        db, self._db = self._db, None
        if db is not None:
            db.close()
