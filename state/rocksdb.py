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

**Parked between tasks, released on request**: a small epoch's task leaves its DB open for the
next task of the subtask in this process, and another process asks for it to be closed
(state/rocksdb_parking.py). The layout and value encoding are in state/rocksdb_format.py, the
reads through the epoch's buffer and the timers in state/rocksdb_buffered.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rocksdict import (
    Checkpoint,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from streamer.state.base import (
    AppendEntry,
    BackendOptions,
    BackendStatus,
    Expiry,
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
    ValueEntry,
    expiries,
)
from streamer.state.codec import (
    DOMAIN_CODES,
    decode_value,
    encode_value,
    key_group_prefix,
    prefix_end,
    split_state_key,
    split_timer_key,
    state_key,
    timer_prefix,
)
from streamer.state.exceptions import CorruptStateError, StateError
from streamer.state.rocksdb_buffered import BufferedRocksDB
from streamer.state.rocksdb_format import (
    FORMAT,
    FORMAT_KEY,
    KIND_PREFIX,
    META,
    MISSING,
    OUTPUTS_PREFIX,
    STATE_PREFIX,
    TIMERS,
    UINT64,
    VERSION_KEY,
    cf_options,
    decode_list,
    encode_list,
    expiry_of,
    frame,
    unframe,
)
from streamer.state.rocksdb_parking import (
    dir_identity,
    open_db,
    park_backend,
    take_parked,
)


def unpark(path: Path, key_groups: range) -> RocksDBBackend | None:
    """The backend parked by this process for `path` if it can serve the next task."""
    backend = take_parked(path)
    if backend is None:
        return None
    if (isinstance(backend, RocksDBBackend) and backend.status is BackendStatus.OPEN
            and backend.key_groups == key_groups and dir_identity(path) == backend.dir_id):
        return backend
    with contextlib.suppress(Exception):
        backend.close()
    return None


class RocksDBBackend(BufferedRocksDB):
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
        self._db, families = open_db(self.path, self.options.lock_timeout_s)
        #: The directory opened (a restore replaces it), and when the backend was last parked.
        self.dir_id = dir_identity(self.path)
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
        meta = self._cfs[META]
        fmt = meta.get(FORMAT_KEY)
        if fmt is not None and fmt != FORMAT:
            msg = (f"{str(self.path)!r} holds state format {fmt!r}; this streamer reads "
                   f"{FORMAT!r}")
            raise CorruptStateError(msg)
        raw = meta.get(VERSION_KEY)
        self._version: int | None = None if raw is None else int(UINT64.unpack(raw)[0])
        self._output_versions = [int(UINT64.unpack(k[len(OUTPUTS_PREFIX):])[0]) for k, _ in
                                 self._read_db(META, OUTPUTS_PREFIX,
                                               prefix_end(OUTPUTS_PREFIX), None)]
        for key, value in self._read_db(META, KIND_PREFIX, prefix_end(KIND_PREFIX), None):
            self._kinds[key[len(KIND_PREFIX):].decode()] = StateKind(value.decode())

    def _state_cf(self, state: str, *allowed: StateKind) -> tuple[str, StateKind]:
        self._check_open()
        kind = self._kind_of(state, *allowed)
        return STATE_PREFIX + state, kind

    # ------------------------------------------------------------------ declaration
    def declare(self, descriptor: StateDescriptor) -> None:
        """Declare a state (idempotent); a name keeps its kind for the life of the state."""
        if not self._check_declare(descriptor):
            return
        cf_name = STATE_PREFIX + descriptor.name
        if cf_name not in self._cfs:
            assert self._db is not None
            self._db.create_column_family(cf_name, cf_options())
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
        return self._get_many(state, keys, now_ms, None)

    def get_many_shared(self, state: str, keys: Sequence[StateKey], *,
                        now_ms: int | None = None) -> list[Any]:
        """`get_many` of a value state whose values the caller only reads: equal stored bytes
        are decoded once per process (`_shared_decode`), so readers share the objects."""
        return self._get_many(state, keys, now_ms, _shared_decode)

    def _get_many(self, state: str, keys: Sequence[StateKey], now_ms: int | None,
                  shared: Any) -> list[Any]:
        cf_name, kind = self._state_cf(state)
        check = self._check_key_group
        if kind is StateKind.MAP:
            out: list[Any] = []
            for kg, key, ns in keys:
                check(kg)
                items = self.map_items(state, kg, key, ns, now_ms=now_ms)
                out.append(dict(items) if items else None)
            return out
        decode = decode_list if kind is StateKind.LIST else (shared or decode_value)
        buffer = self._pending.get(cf_name) or {}
        get = self._cfs[cf_name].get
        out = []
        for kg, key, ns in keys:
            check(kg)
            stored_key = state_key(kg, key, ns)
            raw = buffer.get(stored_key, MISSING)
            if raw is MISSING:
                raw = get(stored_key)
            if raw is None:
                out.append(None)
                continue
            payload = unframe(raw, now_ms)
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
                payload = encode_list(value)
                buffer[stored_key] = frame(payload, expiry) if payload else None
            else:
                buffer[stored_key] = frame(encode_value(value), expiry)

    def _clear_map(self, cf_name: str, kg: int, key: bytes, ns: bytes) -> None:
        prefix = state_key(kg, key, ns)
        doomed = [k for k, _ in self._scan(cf_name, prefix, prefix_end(prefix))]
        buffer = self._buffer(cf_name)
        for stored_key in doomed:
            buffer[stored_key] = None

    def delete_many(self, state: str, keys: Sequence[StateKey]) -> None:
        """Remove each (key group, key, namespace) entirely (a whole list or map included)."""
        cf_name, kind = self._state_cf(state)
        if kind is StateKind.MAP:
            for kg, key, ns in keys:
                self._check_key_group(kg)
                self._clear_map(cf_name, kg, key, ns)
            return
        buffer = self._buffer(cf_name)
        for kg, key, ns in keys:
            self._check_key_group(kg)
            buffer[state_key(kg, key, ns)] = None

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
            current = b"" if raw is None else unframe(raw, now_ms) or b""
            self._buffer(cf_name)[stored_key] = frame(current + encode_list(values), expiry)

    def map_get_many(self, state: str, keys: Sequence[MapKey], *,
                     now_ms: int | None = None) -> list[Any]:
        """The value of each map entry, None where absent or expired."""
        cf_name, _ = self._state_cf(state, StateKind.MAP)
        out: list[Any] = []
        for kg, key, ns, user_key in keys:
            self._check_key_group(kg)
            stored_key = state_key(kg, key, ns) + user_key
            raw = self._lookup(cf_name, stored_key)
            payload = None if raw is None else unframe(raw, now_ms)
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
                None if value is None else frame(encode_value(value), expiry)

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
            payload = unframe(raw, now_ms)
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
        decode = decode_list if kind is StateKind.LIST else decode_value
        for stored_key, raw in self._scan(cf_name, prefix, prefix_end(prefix)):
            payload = unframe(raw, now_ms)
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
            cf_name = STATE_PREFIX + state
            for stored_key, raw in self._scan(cf_name, prefix, prefix_end(prefix)):
                payload = unframe(raw, now_ms)
                if payload is None:
                    continue
                _, key, ns, user_key = split_state_key(stored_key)
                if descriptor.kind is StateKind.MAP:
                    yield StateEntry(state, key, ns, decode_value(payload), user_key,
                                     expiry_of(raw))
                elif descriptor.kind is StateKind.LIST:
                    yield StateEntry(state, key, ns, decode_list(payload), None, expiry_of(raw))
                else:
                    yield StateEntry(state, key, ns, decode_value(payload), None, expiry_of(raw))
        for domain in TimeDomain:
            lo = timer_prefix(key_group, DOMAIN_CODES[domain.value])
            for stored_key, _ in self._scan(TIMERS, lo, prefix_end(lo)):
                kg, _, time_ms, key, ns = split_timer_key(stored_key)
                yield Timer(time_ms, kg, key, ns, domain)

    def purge_expired(self, now_ms: int) -> int:
        """Schedule the deletion of every entry expired at `now_ms`; returns how many."""
        self._check_open()
        lo = key_group_prefix(self.key_groups.start)
        hi = key_group_prefix(self.key_groups.stop)  # stop <= 32768 fits the 2-byte prefix
        count = 0
        for state in self.states():
            cf_name = STATE_PREFIX + state
            doomed = [k for k, raw in self._scan(cf_name, lo, hi)
                      if raw[0] != 0 and unframe(raw, now_ms) is None]
            if doomed:
                buffer = self._buffer(cf_name)
                for stored_key in doomed:
                    buffer[stored_key] = None
            count += len(doomed)
        return count

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
        return {name: int(self._cfs[STATE_PREFIX + name]
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
        return self._cfs[META].get(OUTPUTS_PREFIX + UINT64.pack(version))

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
            meta = self._handles[META]
            batch.put(FORMAT_KEY, FORMAT, meta)
            for name, kind in self._declared.items():
                batch.put(KIND_PREFIX + name.encode(), kind.value.encode(), meta)
            batch.put(VERSION_KEY, UINT64.pack(version), meta)
            kept = list(self._output_versions)
            if outputs is not None:
                batch.put(OUTPUTS_PREFIX + UINT64.pack(version), outputs, meta)
                kept.append(version)
            for old in kept[:-self.options.keep_outputs]:
                batch.delete(OUTPUTS_PREFIX + UINT64.pack(old), meta)
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
        self._written.add(META)
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
        """Keep the DB open for the next task of this subtask in this process
        (state/rocksdb_parking.py); a backend that is not healthy, or with `process_cache`
        off, closes."""
        if self.status is not BackendStatus.OPEN or not self.options.process_cache:
            self.close()
            return
        self._pending.clear()  # what a task buffered but did not commit is dropped
        self._sorted.clear()
        self.parked_at = time.monotonic()
        park_backend(self)

    def _release(self) -> None:
        self._cfs.clear()
        self._handles.clear()
        db, self._db = self._db, None
        if db is not None:
            db.close()


#: Decoded values of `get_many_shared` by their stored bytes, and the bytes they hold.
_SHARED: dict[bytes, Any] = {}
_SHARED_BYTES = [0]
#: The stored bytes `_SHARED` may hold before it starts over (the decoded objects take a
#: few times more).
SHARED_MAX_BYTES = 16 << 20


def _shared_decode(payload: bytes) -> Any:
    """`decode_value(payload)`, once per distinct `payload` in this process: a value's bytes
    say all there is to it, so no write, commit, restore or other process can make a kept
    object wrong; the callers promise not to mutate it. Measured on the table-join benchmark
    (10,000 rows looked up every epoch): unpickling the rows was ~18 % of its tasks' time."""
    value = _SHARED.get(payload, MISSING)
    if value is MISSING:
        value = decode_value(payload)
        if _SHARED_BYTES[0] + len(payload) > SHARED_MAX_BYTES:
            _SHARED.clear()
            _SHARED_BYTES[0] = 0
        _SHARED[payload] = value
        _SHARED_BYTES[0] += len(payload)
    return value
