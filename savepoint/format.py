"""The savepoint state format: an operator's keyed state as one Parquet file per key group.

A savepoint must outlive the job, the state backend and the code that wrote it: it is
**canonical** (the same state gives the same bytes, whatever backend held it), **backend-
independent** (rocksdb and memory state are written alike and restore into either), **self-
contained** (no file outside the savepoint directory is referenced) and **relocatable** (every
path is relative to the savepoint root, so a copied directory restores as well as the original).
This module is the task side: a Spark task of the old job calls `write_key_groups` with its
subtask's backend open at the savepoint's epoch; a task of the new job, at any parallelism and
with either backend, calls `restore_key_groups` for the key groups it owns. The driver keeps the
handles in the savepoint's `_metadata` (`operator_metadata` merges the handles of one operator).
`export_operator` (savepoint/export.py) turns an operator's files into readable Parquet or JSON
lines.

**Layout** under the savepoint root (any fsspec URL, see `streamer.storage`)::

    <uid>/kg-<00042>.parquet      every state entry and timer of key group 42 of operator <uid>

Key groups without state have no file. A file is written atomically (temporary file, fsync and
rename; one PUT on object stores), so a retried or speculative task attempt overwrites it with
identical bytes: rows are sorted (below) and nothing in a file depends on the attempt.

**File schema** (format 1). One row per state entry (a value / reducing / aggregating value, a
whole list, or one map entry) and one row per timer:

    state          string  the state name (null for timers)
    kind           string  value | list | map | reducing | aggregating | timer
    key            binary  the key as `streamer.state.codec.encode_key` bytes
    namespace      binary  the namespace bytes (b"" when none; windows: the window start)
    user_key       binary  the map entry's user key (null unless kind is map)
    value          binary  the value in the tagged JSON encoding below (null for timers)
    expires_at_ms  int64   TTL expiry time in ms (null: never expires; null for timers)
    domain         string  event | processing (timers only)
    time_ms        int64   the timer's time in ms (timers only)

Rows are sorted by (state, domain, time_ms, key, namespace, user_key), nulls last: the entries by
state, then the timers. The Parquet schema's key-value metadata `streamer.savepoint` holds JSON
`{"format": 1, "value_encoding": "tagged-json-1", "uid": ..., "key_group": ...}`.

**Values** are encoded as compact, tagged UTF-8 JSON ("tagged-json-1", `savepoint/values.py`),
so that any tool can read them and no Python class is needed to load them (but for pickled
objects, which a handle counts in `pickled_values`).

**Handle** returned by `write_key_groups` (the savepoint `_metadata` keeps it)::

    {"format": 1, "uid": "counts", "subtask": 0, "key_groups": [0, 64],   # [start, stop)
     "files": [{"key_group": 3, "path": "counts/kg-00003.parquet", "size": 2048,
                "sha256": "...", "entries": 120, "timers": 4}],
     "states": {"acc": "aggregating"}, "keys": {"acc": 120}, "entries": 120, "timers": 4,
     "pickled_values": 0, "bytes": 2048, "duration_ms": 12.5}

**Broadcast state** (state names starting `broadcast.`, a process function's broadcast
state) is not keyed: every subtask holds the same full copy in the first key group it owns.
Only subtask 0 writes it, in key group 0's file (key and namespace b""); on restore a
subtask that does not own key group 0 also reads that file's broadcast rows into its own
first key group, so every subtask of any parallelism starts with the one copy.

**Restore** reads the files of the key groups a new subtask owns (any parallelism: key groups
are the unit of redistribution), checks each file's size and sha256 against the savepoint's
file list, declares the states, and writes the entries with the target backend's bulk writes
(`put_many` / `map_put_many` / `add_timers`, what `KeyedStateBackend.ingest` does, minus its
per-entry look-up of the state's kind, which dominated a large restore). Values of one file are
parsed by one `json.loads`. Both directions pause the cyclic garbage collector per key group:
they allocate many small acyclic objects, and collections walking a worker's whole heap (e.g. a
memory backend's state) made a restore several times slower.

**Failures.** Storage failures raise `SavepointError`; a missing file, a size or sha256 mismatch
or an unreadable file raises `CorruptSavepointError` naming the savepoint, uid, key group and
file; a file of another format raises `IncompatibleSavepointError`.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import json
import pickle
import posixpath
import re
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from streamer.savepoint.exceptions import (
    CorruptSavepointError,
    IncompatibleSavepointError,
    SavepointError,
)
from streamer.savepoint.values import VALUE_ENCODING, decode_values, encode_value, is_pickled
from streamer.state.base import (
    BROADCAST_STATE_PREFIX,
    KeyedStateBackend,
    StateDescriptor,
    StateEntry,
    StateKind,
    TimeDomain,
    Timer,
    TimerSpec,
)
from streamer.state.exceptions import StateError
from streamer.storage import MissingFileError, Storage, StorageError

#: The version of the state files and handles this module writes and reads.
FORMAT = 1
#: The Parquet key-value metadata key of a state file.
METADATA_KEY = b"streamer.savepoint"
TIMER = "timer"

_UID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_SORT = [("state", "ascending"), ("domain", "ascending"), ("time_ms", "ascending"),
         ("key", "ascending"), ("namespace", "ascending"), ("user_key", "ascending")]
_FILE_KEYS = ("key_group", "path", "size", "sha256")


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("state", pa.string()), ("kind", pa.string()), ("key", pa.binary()),
        ("namespace", pa.binary()), ("user_key", pa.binary()), ("value", pa.binary()),
        ("expires_at_ms", pa.int64()), ("domain", pa.string()), ("time_ms", pa.int64()),
    ])


# ------------------------------------------------------------------------------ helpers
def key_group_path(uid: str, key_group: int) -> str:
    """The savepoint-relative path of the state file of `key_group` of operator `uid`."""
    return f"{uid}/kg-{key_group:05d}.parquet"


def state_schema(backend: KeyedStateBackend) -> dict[str, str]:
    """The declared states of a backend as {state name: kind}, sorted by name."""
    return {name: d.kind.value for name, d in sorted(backend.states().items())}


def _check_uid(uid: str) -> None:
    if not isinstance(uid, str) or not _UID.match(uid):
        msg = (f"operator uid {uid!r} cannot name a savepoint directory; use letters, digits, "
               "'_', '.' or '-'")
        raise SavepointError(msg)


def open_storage(savepoint_url: str) -> Storage:
    """The storage of a savepoint URL; a `SavepointError` saying which when it cannot be used."""
    try:
        return Storage(savepoint_url)
    except StorageError as exc:
        msg = f"cannot use savepoint {savepoint_url!r}: {exc}"
        raise SavepointError(msg) from exc


def _where(savepoint_url: str, uid: str, key_group: int | None = None) -> str:
    where = f"savepoint {savepoint_url!r}, operator {uid!r}"
    return where if key_group is None else f"{where}, key group {key_group}"


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector during bulk work on one key group: it allocates many
    small acyclic objects (freed by reference counting), and the collections they trigger walk
    every live object; in a worker holding 500 k entries of memory state, a restore of 500 k
    entries took 4.1 s of CPU with collections and 0.75 s without.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


# ------------------------------------------------------------------------------ write
def _key_group_table(backend: KeyedStateBackend, key_group: int, uid: str,
                     kinds: Mapping[str, str], broadcast: bool = True,
                     ) -> tuple[Any, list[str], int, int] | None:
    """The sorted Arrow table of one key group's entries and timers, the state name of each
    entry, the timer count and the count of pickled values; None when the group is empty.
    Without `broadcast`, broadcast state (a copy of subtask 0's) is left out.
    """
    import pyarrow as pa

    entries: list[StateEntry] = []
    timers: list[Timer] = []
    for item in backend.entries_of_key_group(key_group):
        if type(item) is StateEntry:
            if not broadcast and item.state.startswith(BROADCAST_STATE_PREFIX):
                continue
            entries.append(item)
        else:
            assert isinstance(item, Timer)
            timers.append(item)
    if not entries and not timers:
        return None
    nt = len(timers)
    none_t: list[Any] = [None] * nt
    states = [e.state for e in entries]
    values = [encode_value(e.value) for e in entries]
    pickled = sum(1 for v in values if is_pickled(v))
    table = pa.table({
        "state": pa.array(states + none_t, pa.string()),
        "kind": pa.array([kinds[s] for s in states] + [TIMER] * nt, pa.string()),
        "key": pa.array([e.key for e in entries] + [t.key for t in timers], pa.binary()),
        "namespace": pa.array([e.namespace for e in entries] + [t.namespace for t in timers],
                              pa.binary()),
        "user_key": pa.array([e.user_key for e in entries] + none_t, pa.binary()),
        "value": pa.array(values + none_t, pa.binary()),
        "expires_at_ms": pa.array([e.expires_at_ms for e in entries] + none_t, pa.int64()),
        "domain": pa.array([None] * len(entries) + [t.domain.value for t in timers],
                           pa.string()),
        "time_ms": pa.array([None] * len(entries) + [t.time_ms for t in timers], pa.int64()),
    }, schema=_schema())
    meta = {"format": FORMAT, "value_encoding": VALUE_ENCODING, "uid": uid,
            "key_group": key_group}
    table = table.sort_by(_SORT).replace_schema_metadata(
        {METADATA_KEY: json.dumps(meta, sort_keys=True).encode()})
    return table, states, nt, pickled


def _parquet_bytes(table: Any) -> bytes:
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd", compression_level=1,
                   write_statistics=False)
    return buffer.getvalue()


def write_key_groups(backend: KeyedStateBackend, savepoint_url: str, uid: str,
                     subtask: int) -> dict[str, Any]:
    """Write the state of every key group `backend` owns into the savepoint at `savepoint_url`,
    one file per non-empty key group, and return the subtask's handle (module docstring). Call
    it with the backend open at the savepoint's epoch and no buffered writes: what
    `entries_of_key_group` yields (expired entries included, with their expiry) is written.
    Broadcast state, the same on every subtask, is written by subtask 0 only (key group 0).
    """
    started = time.monotonic()
    _check_uid(uid)
    storage = open_storage(savepoint_url)
    kinds = state_schema(backend)
    files: list[dict[str, Any]] = []
    keys: Counter[str] = Counter()
    timers = pickled = 0
    for key_group in backend.key_groups:
        try:
            with _gc_paused():
                built = _key_group_table(backend, key_group, uid, kinds, subtask == 0)
        except StateError as exc:
            msg = f"{_where(savepoint_url, uid, key_group)}: cannot read the state: {exc}"
            raise SavepointError(msg) from exc
        if built is None:
            continue
        table, states, nt, np_ = built
        data = _parquet_bytes(table)
        rel = key_group_path(uid, key_group)
        try:
            storage.write_atomic(rel, data)
        except StorageError as exc:
            msg = f"{_where(savepoint_url, uid, key_group)}: cannot write {rel!r}: {exc}"
            raise SavepointError(msg) from exc
        keys.update(states)
        timers += nt
        pickled += np_
        files.append({"key_group": key_group, "path": rel, "size": len(data),
                      "sha256": hashlib.sha256(data).hexdigest(), "entries": len(states),
                      "timers": nt})
    return {
        "format": FORMAT,
        "uid": uid,
        "subtask": subtask,
        "key_groups": [backend.key_groups.start, backend.key_groups.stop],
        "files": files,
        "states": kinds,
        "keys": {name: keys.get(name, 0) for name in kinds},
        "entries": sum(keys.values()),
        "timers": timers,
        "pickled_values": pickled,
        "bytes": sum(f["size"] for f in files),
        "duration_ms": _ms_since(started),
    }


def operator_metadata(handles: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge the handles of one operator's subtasks into the operator's savepoint entry:
    {"uid", "states", "files" (sorted by key group), "keys", "entries", "timers",
    "pickled_values", "bytes"}. Raises `SavepointError` if the handles are of several operators,
    overlap in key groups or disagree on a state's kind.
    """
    if not handles:
        msg = "an operator's savepoint entry needs at least one subtask handle"
        raise SavepointError(msg)
    uid = handles[0].get("uid")
    states: dict[str, str] = {}
    files: dict[int, dict[str, Any]] = {}
    keys: Counter[str] = Counter()
    for handle in handles:
        if handle.get("format") != FORMAT or handle.get("uid") != uid:
            msg = (f"cannot merge savepoint handle of operator {handle.get('uid')!r} (format "
                   f"{handle.get('format')!r}) into operator {uid!r} (format {FORMAT})")
            raise SavepointError(msg)
        for name, kind in handle["states"].items():
            if states.setdefault(name, kind) != kind:
                msg = (f"operator {uid!r}: state {name!r} is of kind {states[name]} in one "
                       f"subtask and {kind} in another")
                raise SavepointError(msg)
        for entry in handle["files"]:
            if entry["key_group"] in files:
                msg = (f"operator {uid!r}: key group {entry['key_group']} was written by two "
                       "subtasks; the subtasks' key-group ranges overlap")
                raise SavepointError(msg)
            files[entry["key_group"]] = dict(entry)
        keys.update(handle["keys"])
    return {
        "uid": uid,
        "states": dict(sorted(states.items())),
        "files": [files[kg] for kg in sorted(files)],
        "keys": {name: keys.get(name, 0) for name in sorted(states)},
        "entries": sum(h["entries"] for h in handles),
        "timers": sum(h["timers"] for h in handles),
        "pickled_values": sum(h.get("pickled_values", 0) for h in handles),
        "bytes": sum(h["bytes"] for h in handles),
    }


# ------------------------------------------------------------------------------ read
def _uid_of(entry: Mapping[str, Any]) -> str:
    return posixpath.dirname(str(entry.get("path", ""))) or "?"


def files_by_key_group(savepoint_url: str, operator_files: Sequence[Mapping[str, Any]],
                        ) -> dict[int, Mapping[str, Any]]:
    """The operator's file entries by key group, after checking their shape."""
    by_group: dict[int, Mapping[str, Any]] = {}
    for entry in operator_files:
        if not isinstance(entry, Mapping) or not set(_FILE_KEYS) <= set(entry) \
                or type(entry["key_group"]) is not int:
            msg = (f"savepoint {savepoint_url!r} has a malformed state file entry {entry!r}; "
                   f"an entry needs {', '.join(_FILE_KEYS)}")
            raise SavepointError(msg)
        if entry["key_group"] in by_group:
            msg = (f"{_where(savepoint_url, _uid_of(entry), entry['key_group'])}: the savepoint "
                   "lists two files for this key group")
            raise SavepointError(msg)
        by_group[entry["key_group"]] = entry
    return by_group


def read_table(storage: Storage, savepoint_url: str, entry: Mapping[str, Any],
                verify: bool) -> Any:
    """The Arrow table of one state file, its size, sha256 and format checked."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rel, key_group = str(entry["path"]), int(entry["key_group"])
    where = _where(savepoint_url, _uid_of(entry), key_group)
    try:
        data = storage.read_bytes(rel)
    except MissingFileError as exc:
        msg = f"{where}: file {rel!r} is missing; the savepoint is incomplete ({exc})"
        raise CorruptSavepointError(msg) from exc
    except StorageError as exc:
        msg = f"{where}: cannot read {rel!r}: {exc}"
        raise SavepointError(msg) from exc
    if verify:
        problem = None
        if len(data) != int(entry["size"]):
            problem = f"size {len(data)} instead of {entry['size']}"
        else:
            digest = hashlib.sha256(data).hexdigest()
            if digest != entry["sha256"]:
                problem = f"sha256 {digest} instead of {entry['sha256']}"
        if problem is not None:
            msg = (f"{where}: file {rel!r} is corrupt ({problem}); restore from another "
                   "savepoint or checkpoint")
            raise CorruptSavepointError(msg)
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as exc:
        msg = f"{where}: file {rel!r} is not a readable Parquet file: {exc}"
        raise CorruptSavepointError(msg) from exc
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    try:
        meta = json.loads(raw) if raw is not None else {}
    except ValueError:
        meta = {}
    if meta.get("format") != FORMAT or meta.get("value_encoding") != VALUE_ENCODING:
        msg = (f"{where}: file {rel!r} is in savepoint format {meta.get('format')!r} with value "
               f"encoding {meta.get('value_encoding')!r}; this streamer reads format {FORMAT} "
               f"({VALUE_ENCODING})")
        raise IncompatibleSavepointError(msg)
    if meta.get("key_group") != key_group:
        msg = (f"{where}: file {rel!r} holds key group {meta.get('key_group')!r}, not "
               f"{key_group}; the savepoint's file list does not match its files")
        raise CorruptSavepointError(msg)
    if not _schema().equals(table.schema, check_metadata=False):
        msg = f"{where}: file {rel!r} does not have the columns of a savepoint state file"
        raise CorruptSavepointError(msg)
    return table


@dataclass
class _Group:
    """One state's rows of a state file, decoded, ready for the backend's bulk writes."""

    kind: StateKind
    keys: list[bytes]
    namespaces: list[bytes]
    user_keys: list[bytes | None]
    values: list[Any]
    expiries: list[int | None]


def _not_null(table: Any, columns: Sequence[str], what: str) -> None:
    for name in columns:
        if table.column(name).null_count:
            msg = f"{what} rows with a null {name!r}"
            raise ValueError(msg)


def _groups(table: Any, key_group: int,
            ) -> tuple[dict[str, _Group], dict[TimeDomain, list[TimerSpec]], int]:
    """The entries of one state file by state, its timers by domain, and the timer count."""
    import pyarrow.compute as pc

    is_timer = pc.equal(table.column("kind"), TIMER)
    entries, timer_rows = table.filter(pc.invert(is_timer)), table.filter(is_timer)
    groups: dict[str, _Group] = {}
    if entries.num_rows:
        _not_null(entries, ("state", "key", "namespace", "value"), "state entry")
        for state in pc.unique(entries.column("state")).to_pylist():
            rows = entries.filter(pc.equal(entries.column("state"), state))
            found = pc.unique(rows.column("kind")).to_pylist()
            if len(found) != 1:
                msg = f"state {state!r} has rows of kinds {found!r}"
                raise ValueError(msg)
            kind = StateKind(found[0])
            user_keys = rows.column("user_key").to_pylist()
            if kind is StateKind.MAP and rows.column("user_key").null_count:
                msg = f"map state {state!r} has rows without a user key"
                raise ValueError(msg)
            groups[state] = _Group(kind, rows.column("key").to_pylist(),
                                   rows.column("namespace").to_pylist(), user_keys,
                                   decode_values(rows.column("value").to_pylist()),
                                   rows.column("expires_at_ms").to_pylist())
    timers: dict[TimeDomain, list[TimerSpec]] = {}
    if timer_rows.num_rows:
        _not_null(timer_rows, ("key", "namespace", "domain", "time_ms"), "timer")
        for domain, time_ms, key, ns in zip(
                timer_rows.column("domain").to_pylist(), timer_rows.column("time_ms").to_pylist(),
                timer_rows.column("key").to_pylist(), timer_rows.column("namespace").to_pylist(),
                strict=True):
            timers.setdefault(TimeDomain(domain), []).append((key_group, time_ms, key, ns))
    return groups, timers, timer_rows.num_rows


def _ingest(backend: KeyedStateBackend, key_group: int, groups: Mapping[str, _Group],
            timers: Mapping[TimeDomain, list[TimerSpec]]) -> None:
    """Write one key group's state with the backend's bulk writes: what `ingest` does, without
    its per-entry look-up of the state's kind (which dominates the cost of a large restore).
    """
    for state, group in groups.items():
        kg = [key_group] * len(group.keys)
        if group.kind is StateKind.MAP:
            user_keys = cast(list[bytes], group.user_keys)  # checked: no nulls in a map
            backend.map_put_many(state, list(zip(kg, group.keys, group.namespaces, user_keys,
                                                 group.values, strict=True)),
                                 expires_at_ms=group.expiries)
        else:
            backend.put_many(state, list(zip(kg, group.keys, group.namespaces, group.values,
                                             strict=True)),
                             expires_at_ms=group.expiries)
    for domain, specs in timers.items():
        backend.add_timers(domain, specs)


def _declare(backend: KeyedStateBackend, kinds: Mapping[str, str], where: str) -> None:
    for name, kind in kinds.items():
        try:
            backend.declare(StateDescriptor(name, StateKind(kind)))
        except (StateError, ValueError) as exc:
            msg = (f"{where}: state {name!r} ({kind}) of the savepoint does not fit the new "
                   f"job's state: {exc}")
            raise SavepointError(msg) from exc


def restore_key_groups(savepoint_url: str, operator_files: Sequence[Mapping[str, Any]],
                       backend: KeyedStateBackend, key_groups: range, *, verify: bool = True,
                       states: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Ingest the savepoint state of the key groups in `key_groups` into `backend` (a backend
    of either kind, owning them, normally empty) as buffered writes; the caller commits.
    `operator_files` is the operator's file list from the savepoint (`operator_metadata`
    "files"); `states` ({name: kind}, e.g. its "states") is declared first, so that states
    without entries exist too. With `verify`, each file's size and sha256 are checked.
    Returns {"files", "entries", "timers", "bytes", "duration_ms"}.
    """
    started = time.monotonic()
    by_group = files_by_key_group(savepoint_url, operator_files)
    uid = next((_uid_of(e) for e in by_group.values()), backend.location.uid)
    outside = [kg for kg in key_groups if kg not in backend.key_groups]
    if outside:
        msg = (f"{_where(savepoint_url, uid)}: key groups {outside[0]}..{outside[-1]} are not "
               f"owned by the backend (it owns {backend.key_groups.start}.."
               f"{backend.key_groups.stop - 1}); restore each subtask's own key groups")
        raise SavepointError(msg)
    if states:
        _declare(backend, states, _where(savepoint_url, uid))
    storage = open_storage(savepoint_url)
    files = entries = timers = size = 0
    for key_group in key_groups:
        entry = by_group.get(key_group)
        if entry is None:
            continue
        where = _where(savepoint_url, _uid_of(entry), key_group)
        table = read_table(storage, savepoint_url, entry, verify)
        with _gc_paused():
            try:
                groups, group_timers, n_timers = _groups(table, key_group)
            except (ValueError, TypeError, pickle.UnpicklingError) as exc:
                msg = f"{where}: file {entry['path']!r} has a row that cannot be read: {exc}"
                raise CorruptSavepointError(msg) from exc
            _declare(backend, {state: group.kind.value for state, group in groups.items()},
                     where)
            try:
                _ingest(backend, key_group, groups, group_timers)
            except StateError as exc:
                msg = f"{where}: cannot restore the state into the new backend: {exc}"
                raise SavepointError(msg) from exc
        files += 1
        entries += sum(len(group.keys) for group in groups.values())
        timers += n_timers
        size += int(entry["size"])
    if 0 not in key_groups and 0 in by_group and any(  # broadcast state: subtask 0's copy
            name.startswith(BROADCAST_STATE_PREFIX) for name in states or ()):
        entries += _restore_broadcast(storage, savepoint_url, by_group[0], backend, verify)
    return {"files": files, "entries": entries, "timers": timers, "bytes": size,
            "duration_ms": _ms_since(started)}


def _restore_broadcast(storage: Storage, savepoint_url: str, entry: Mapping[str, Any],
                       backend: KeyedStateBackend, verify: bool) -> int:
    """Copy the broadcast state of key group 0's file (the savepoint's one copy) into the
    first key group `backend` owns, where a subtask keeps its copy; returns the entries."""
    import pyarrow.compute as pc

    where = _where(savepoint_url, _uid_of(entry), 0)
    table = read_table(storage, savepoint_url, entry, verify)
    table = table.filter(pc.fill_null(pc.starts_with(table.column("state"),
                                                     BROADCAST_STATE_PREFIX), False))
    if not table.num_rows:
        return 0
    try:
        groups, _, _ = _groups(table, 0)
    except (ValueError, TypeError, pickle.UnpicklingError) as exc:
        msg = f"{where}: file {entry['path']!r} has a row that cannot be read: {exc}"
        raise CorruptSavepointError(msg) from exc
    _declare(backend, {state: group.kind.value for state, group in groups.items()}, where)
    try:
        _ingest(backend, backend.key_groups.start, groups, {})
    except StateError as exc:
        msg = f"{where}: cannot restore the broadcast state into the new backend: {exc}"
        raise SavepointError(msg) from exc
    return sum(len(group.keys) for group in groups.values())
