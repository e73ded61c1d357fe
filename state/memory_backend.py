"""`MemoryBackend`: the memory state backend's class. What it stores is in
`state/memory_values.py`; its committed data, files and process cache are in
`state/memory_files.py`, whose docstring describes the design.
"""

from __future__ import annotations

import fcntl
import os
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

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
from streamer.state.exceptions import KeyEncodingError, StateError
from streamer.state.memory_files import (
    Committed,
    apply_delta,
    cache_committed,
    load,
    lock_token,
    materialize,
    needs_snapshot,
    snapshot_path,
    snapshot_payload,
    take_cached,
    write_atomic,
    write_delta,
)
from streamer.state.memory_values import (
    EXPIRED,
    TOMBSTONE,
    Changes,
    MapChange,
    expiry_of,
    live_value,
    unwrap,
    wrap,
)


class MemoryBackend(KeyedStateBackend):
    """Keyed state in Python dicts, persisted as snapshot + per-commit delta files."""

    name = "memory"

    def __init__(self, location: SubtaskLocation, key_groups: range,
                 options: BackendOptions | None = None,
                 states: Iterable[StateDescriptor] = ()) -> None:
        super().__init__(location, key_groups, options or BackendOptions())
        path = self.path
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            msg = f"cannot create the state directory {str(path)!r}: {exc}"
            raise StateError(msg) from exc
        self._lock_fd = self._acquire_lock(path / "LOCK")
        self._release = weakref.finalize(self, os.close, self._lock_fd)
        self._cache_key = os.path.abspath(path)
        try:
            token = lock_token(self._lock_fd)
            cached = take_cached(self._cache_key)
            if cached is not None and cached.token != token:
                cached = None  # a copy of a directory that has since been replaced
            self._data = load(path, cached, self.options.keep_outputs)
            self._data.token = token
        except BaseException:
            self._release()
            raise
        self._changes = Changes()
        self._declared: dict[str, StateKind] = {}
        for descriptor in states:
            self.declare(descriptor)

    def _acquire_lock(self, lock_path: Path) -> int:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)

        def attempt() -> int:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd

        try:
            return wait_for_lock(attempt, lambda exc: isinstance(exc, BlockingIOError),
                                 self.options.lock_timeout_s, self.path)
        except BaseException:
            os.close(fd)
            raise

    # ------------------------------------------------------------------ declaration
    def declare(self, descriptor: StateDescriptor) -> None:
        """Declare a state (idempotent); a name keeps its kind for the life of the state."""
        if self._check_declare(descriptor):
            self._declared[descriptor.name] = descriptor.kind

    def states(self) -> dict[str, StateDescriptor]:
        """The declared states by name (committed or declared since the last commit)."""
        kinds = {**self._data.states, **self._declared}
        return {name: StateDescriptor(name, kind) for name, kind in kinds.items()}

    # ------------------------------------------------------------------ internal lookups
    def _stored(self, state: str, kg: int, key: bytes, ns: bytes) -> Any:
        """The stored form of a value or list entry (buffered writes first), None if absent."""
        changes = self._changes.values.get(state)
        if changes is not None:
            stored = changes.get((kg, key, ns), None)
            if stored is not None:
                return None if stored is TOMBSTONE else stored
        group = self._data.values.get(state, {}).get(kg)
        return None if group is None else group.get((key, ns))

    def _writes(self, state: str) -> dict[StateKey, Any]:
        writes = self._changes.values.get(state)
        if writes is None:
            writes = self._changes.values[state] = {}
        return writes

    def _map_change(self, state: str, kg: int, key: bytes, ns: bytes) -> MapChange:
        writes = self._writes(state)
        change = writes.get((kg, key, ns))
        if change is None:
            change = writes[(kg, key, ns)] = MapChange()
        return change

    def _map_stored(self, state: str, kg: int, key: bytes, ns: bytes) -> dict[bytes, Any]:
        """The stored entries of one map, buffered writes applied (a new dict)."""
        change = self._changes.values.get(state, {}).get((kg, key, ns))
        group = self._data.values.get(state, {}).get(kg)
        base = {} if group is None or (change is not None and change.cleared) \
            else group.get((key, ns), {})
        if change is None:
            return dict(base)
        merged = dict(base)
        for user_key, stored in change.entries.items():
            if stored is TOMBSTONE:
                merged.pop(user_key, None)
            else:
                merged[user_key] = stored
        return merged

    def _keys_in_group(self, state: str, kg: int) -> list[tuple[bytes, bytes]]:
        group = self._data.values.get(state, {}).get(kg, {})
        keys = dict.fromkeys(group)
        for g, key, ns in self._changes.values.get(state, {}):
            if g == kg:
                keys[(key, ns)] = None
        return list(keys)

    # ------------------------------------------------------------------ values, lists, maps
    def get_many(self, state: str, keys: Sequence[StateKey], *,
                 now_ms: int | None = None) -> list[Any]:
        """The current value of each (key group, key, namespace), None where absent or expired.
        A list state gives a list, a map state a dict {user key: value}.
        """
        self._check_open()
        kind = self._kind_of(state)
        check = self._check_key_group
        if kind is StateKind.MAP:
            out: list[Any] = []
            for kg, key, ns in keys:
                check(kg)
                items = self.map_items(state, kg, key, ns, now_ms=now_ms)
                out.append(dict(items) if items else None)
            return out
        is_list = kind is StateKind.LIST
        changes = self._changes.values.get(state)
        committed = self._data.values.get(state, {})
        out = []
        for kg, key, ns in keys:
            check(kg)
            stored = None if changes is None else changes.get((kg, key, ns))
            if stored is None:
                group = committed.get(kg)
                stored = None if group is None else group.get((key, ns))
            elif stored is TOMBSTONE:
                stored = None
            if stored is None:
                out.append(None)
                continue
            value = live_value(stored, now_ms)
            if value is EXPIRED:
                self._writes(state)[(kg, key, ns)] = TOMBSTONE
                out.append(None)
            else:
                out.append(list(value) if is_list else value)
        return out

    def put_many(self, state: str, entries: Sequence[ValueEntry], *,
                 expires_at_ms: Expiry = None) -> None:
        """Set the value of each entry (a list for list states, a dict for map states); None,
        an empty list or an empty dict deletes the entry, as Flink's `update(null)` does.
        """
        self._check_open()
        kind = self._kind_of(state)
        writes = self._writes(state)
        for (kg, key, ns, value), expiry in zip(entries, expiries(expires_at_ms, len(entries)),
                                                strict=True):
            self._check_write(kg, key, ns)
            if value is None:
                writes[(kg, key, ns)] = MapChange(True) if kind is StateKind.MAP else TOMBSTONE
            elif kind is StateKind.MAP:
                if not isinstance(value, Mapping):
                    msg = f"map state {state!r} takes dict values, got {type(value).__name__}"
                    raise StateError(msg)
                writes[(kg, key, ns)] = MapChange(
                    True, {uk: wrap(v, expiry) for uk, v in value.items() if v is not None})
            elif kind is StateKind.LIST:
                values = list(value)
                writes[(kg, key, ns)] = wrap(values, expiry) if values else TOMBSTONE
            else:
                writes[(kg, key, ns)] = wrap(value, expiry)

    def delete_many(self, state: str, keys: Sequence[StateKey]) -> None:
        """Remove each (key group, key, namespace) entirely (a whole list or map included)."""
        self._check_open()
        is_map = self._kind_of(state) is StateKind.MAP
        writes = self._writes(state)
        for kg, key, ns in keys:
            self._check_key_group(kg)
            writes[(kg, key, ns)] = MapChange(True) if is_map else TOMBSTONE

    def append_many(self, state: str, entries: Sequence[AppendEntry], *,
                    expires_at_ms: Expiry = None, now_ms: int | None = None) -> None:
        """Append values to lists (an expired list, given `now_ms`, starts empty)."""
        self._check_open()
        self._kind_of(state, StateKind.LIST)
        writes = self._writes(state)
        for (kg, key, ns, values), expiry in zip(entries, expiries(expires_at_ms, len(entries)),
                                                 strict=True):
            self._check_write(kg, key, ns)
            if not values:
                continue
            stored = self._stored(state, kg, key, ns)
            current = [] if stored is None else live_value(stored, now_ms)
            if current is EXPIRED:
                current = []
            writes[(kg, key, ns)] = wrap([*current, *values], expiry)

    def map_get_many(self, state: str, keys: Sequence[MapKey], *,
                     now_ms: int | None = None) -> list[Any]:
        """The value of each map entry, None where absent or expired."""
        self._check_open()
        self._kind_of(state, StateKind.MAP)
        changes = self._changes.values.get(state, {})
        committed = self._data.values.get(state, {})
        out: list[Any] = []
        for kg, key, ns, user_key in keys:
            self._check_key_group(kg)
            change = changes.get((kg, key, ns))
            stored: Any = None
            if change is not None and user_key in change.entries:
                stored = change.entries[user_key]
                stored = None if stored is TOMBSTONE else stored
            elif change is None or not change.cleared:
                group = committed.get(kg)
                entries = None if group is None else group.get((key, ns))
                stored = None if entries is None else entries.get(user_key)
            value = None if stored is None else live_value(stored, now_ms)
            if value is EXPIRED:
                self._map_change(state, kg, key, ns).entries[user_key] = TOMBSTONE
                value = None
            out.append(value)
        return out

    def map_put_many(self, state: str, entries: Sequence[MapEntry], *,
                     expires_at_ms: Expiry = None) -> None:
        """Set map entries, each user key with its own expiry; a None value deletes the entry."""
        self._check_open()
        self._kind_of(state, StateKind.MAP)
        for (kg, key, ns, user_key, value), expiry in zip(
                entries, expiries(expires_at_ms, len(entries)), strict=True):
            self._check_write(kg, key, ns, user_key)
            self._map_change(state, kg, key, ns).entries[user_key] = \
                TOMBSTONE if value is None else wrap(value, expiry)

    def map_delete_many(self, state: str, keys: Sequence[MapKey]) -> None:
        """Remove map entries."""
        self._check_open()
        self._kind_of(state, StateKind.MAP)
        for kg, key, ns, user_key in keys:
            self._check_key_group(kg)
            self._map_change(state, kg, key, ns).entries[user_key] = TOMBSTONE

    def map_items(self, state: str, key_group: int, key: bytes, namespace: bytes = b"", *,
                  now_ms: int | None = None) -> list[tuple[bytes, Any]]:
        """The entries of one map, sorted by user key."""
        self._check_open()
        self._kind_of(state, StateKind.MAP)
        self._check_key_group(key_group)
        out: list[tuple[bytes, Any]] = []
        for user_key, stored in sorted(self._map_stored(state, key_group, key, namespace).items()):
            value = live_value(stored, now_ms)
            if value is EXPIRED:
                self._map_change(state, key_group, key, namespace).entries[user_key] = TOMBSTONE
            else:
                out.append((user_key, value))
        return out

    # ------------------------------------------------------------------ enumeration
    def iterate(self, state: str, key_group: int, *,
                now_ms: int | None = None) -> Iterator[tuple[bytes, bytes, Any]]:
        """(key, namespace, value) of every entry of `state` in a key group, in no set order;
        list states give lists, map states dicts.
        """
        self._check_open()
        self._kind_of(state)
        self._check_key_group(key_group)
        keys = self._keys_in_group(state, key_group)
        for (key, ns), value in zip(
                keys, self.get_many(state, [(key_group, k, n) for k, n in keys], now_ms=now_ms),
                strict=True):
            if value is not None:
                yield key, ns, value

    def entries_of_key_group(self, key_group: int, *,
                             now_ms: int | None = None) -> Iterator[KeyGroupEntry]:
        """Every state entry (all states, by state name) and then every timer of a key group."""
        self._check_open()
        self._check_key_group(key_group)
        for state, descriptor in sorted(self.states().items()):
            for key, ns in self._keys_in_group(state, key_group):
                if descriptor.kind is StateKind.MAP:
                    for user_key, stored in sorted(
                            self._map_stored(state, key_group, key, ns).items()):
                        if live_value(stored, now_ms) is not EXPIRED:
                            yield StateEntry(state, key, ns, unwrap(stored), user_key,
                                             expiry_of(stored))
                    continue
                stored = self._stored(state, key_group, key, ns)
                if stored is not None and live_value(stored, now_ms) is not EXPIRED:
                    value = unwrap(stored)
                    yield StateEntry(state, key, ns,
                                     list(value) if descriptor.kind is StateKind.LIST else value,
                                     None, expiry_of(stored))
        for domain in TimeDomain:
            yield from self._timers_in(domain, key_group, None)

    def purge_expired(self, now_ms: int) -> int:
        """Schedule the deletion of every entry expired at `now_ms`; returns how many."""
        self._check_open()
        count = 0
        for state, descriptor in self.states().items():
            for kg in self.key_groups:
                for key, ns in self._keys_in_group(state, kg):
                    if descriptor.kind is StateKind.MAP:
                        for user_key, stored in self._map_stored(state, kg, key, ns).items():
                            if live_value(stored, now_ms) is EXPIRED:
                                self._map_change(state, kg, key, ns).entries[user_key] = \
                                    TOMBSTONE
                                count += 1
                    else:
                        stored = self._stored(state, kg, key, ns)
                        if stored is not None and live_value(stored, now_ms) is EXPIRED:
                            self._writes(state)[(kg, key, ns)] = TOMBSTONE
                            count += 1
        return count

    # ------------------------------------------------------------------ timers
    def add_timers(self, domain: DomainLike, timers: Iterable[TimerSpec]) -> None:
        """Register timers (key group, time, key, namespace); registering twice is one timer."""
        self._set_timers(domain, timers, True)

    def delete_timers(self, domain: DomainLike, timers: Iterable[TimerSpec]) -> None:
        """Remove timers; removing an absent timer does nothing."""
        self._set_timers(domain, timers, False)

    def _set_timers(self, domain: DomainLike, timers: Iterable[TimerSpec], add: bool) -> None:
        self._check_open()
        name = as_domain(domain).value
        changes = self._changes.timers
        for kg, time_ms, key, ns in timers:
            self._check_write(kg, key, ns)
            if not isinstance(time_ms, int) or not -(1 << 63) <= time_ms < 1 << 63:
                msg = f"timer time {time_ms!r} is not a 64-bit integer of milliseconds"
                raise KeyEncodingError(msg)
            changes[(name, kg, time_ms, key, ns)] = add

    def _timers_in(self, domain: TimeDomain, kg: int | None, up_to_ms: int | None) -> list[Timer]:
        """The timers of one key group (or all owned ones), up to a time, sorted."""
        name = domain.value
        found: set[tuple[int, int, bytes, bytes]] = set()
        for group, by_time in self._data.timers.get(name, {}).items():
            if (kg is None and group in self.key_groups) or group == kg:
                for time_ms, members in by_time.items():
                    if up_to_ms is None or time_ms <= up_to_ms:
                        found.update((time_ms, group, key, ns) for key, ns in members)
        for (d, group, time_ms, key, ns), add in self._changes.timers.items():
            if d == name and (group == kg or kg is None) \
                    and (up_to_ms is None or time_ms <= up_to_ms):
                if add:
                    found.add((time_ms, group, key, ns))
                else:
                    found.discard((time_ms, group, key, ns))
        return [Timer(t, g, k, n, domain) for t, g, k, n in sorted(found)]

    def due_timers(self, domain: DomainLike, up_to_ms: int, *,
                   remove: bool = False) -> list[Timer]:
        """Timers with time <= `up_to_ms`, sorted by (time, key group, key, namespace); with
        `remove`, they are also deleted (a buffered write, like any other).
        """
        self._check_open()
        due = self._timers_in(as_domain(domain), None, up_to_ms)
        if remove:
            self.delete_timers(domain, [(t.key_group, t.time_ms, t.key, t.namespace) for t in due])
        return due

    def next_timer(self, domain: DomainLike) -> int | None:
        """The earliest registered time in `domain`, or None when there is no timer."""
        self._check_open()
        name = as_domain(domain).value
        changes = self._changes.timers
        best = min((t for (d, _, t, _, _), add in changes.items() if add and d == name),
                   default=None)
        candidates = sorted({t for g, by_time in self._data.timers.get(name, {}).items()
                             if g in self.key_groups for t in by_time})
        for time_ms in candidates:
            if best is not None and time_ms >= best:
                break
            for g, by_time in self._data.timers[name].items():
                members = by_time.get(time_ms) if g in self.key_groups else None
                if members and any(changes.get((name, g, time_ms, k, n), True)
                                   for k, n in members):
                    return time_ms
        return best

    # ------------------------------------------------------------------ snapshots
    def local_checkpoint(self, directory: Path) -> list[Path]:
        """The committed state as one full `snapshot-<version>.pkl` in `directory` (must not
        exist), the file format the backend loads.
        """
        self._check_open()
        data = self._data
        if data.version is None:
            msg = (f"the state of {str(self.path)!r} has no committed version to checkpoint; "
                   "commit an epoch first")
            raise StateError(msg)
        try:
            directory.mkdir(parents=True)
            target = snapshot_path(directory, data.version)
            write_atomic(target, snapshot_payload(data), self.options.sync)
        except OSError as exc:
            msg = f"cannot write a snapshot of {str(self.path)!r} to {str(directory)!r}: {exc}"
            raise StateError(msg) from exc
        return [target]

    def key_counts(self) -> dict[str, int]:
        """The exact number of committed entries per state (a map: one per user key)."""
        self._check_open()
        counts: dict[str, int] = {}
        for state, kind in sorted(self._data.states.items()):
            groups = self._data.values.get(state, {}).values()
            if kind is StateKind.MAP:
                counts[state] = sum(len(entries) for group in groups for entries in group.values())
            else:
                counts[state] = sum(len(group) for group in groups)
        return counts

    # ------------------------------------------------------------------ epochs
    def version(self) -> int | None:
        """The last committed version (epoch), or None before the first commit."""
        return self._data.version

    def outputs(self, version: int) -> bytes | None:
        """The outputs committed with `version`, if it is among the last `keep_outputs`."""
        self._check_open()
        return self._data.outputs.get(version)

    def commit(self, version: int, outputs: bytes | None = None) -> None:
        """Atomically make every buffered write durable, with `version` (above the last one)
        and the epoch's `outputs`.
        """
        # 1. Check: open, and the version moves forward.
        self._check_open()
        self._check_version(version)
        self.status = BackendStatus.COMMITTING
        data, changes = self._data, self._changes
        changes.states.update(self._declared)
        try:
            # 2. Write the delta file: its atomic rename is the commit point.
            record, size = write_delta(self.path, data.version, version, changes, outputs,
                                       self.options.sync)
        except Exception as exc:
            self.status = BackendStatus.FAILED
            msg = f"cannot commit version {version} to {str(self.path)!r}: {exc}"
            raise StateError(msg) from exc
        try:
            # 3. Apply the change set to the committed dicts (the process-cached copy).
            apply_delta(data, record, self.options.keep_outputs)
            data.delta_bytes += size
            data.delta_count += 1
            self._changes = Changes()
            self._declared.clear()
            # 4. Materialize a full snapshot once the deltas outweigh the last one.
            if needs_snapshot(data):
                materialize(self.path, data, self.options.sync)
        except Exception as exc:
            self.status = BackendStatus.FAILED
            msg = (f"version {version} of {str(self.path)!r} is committed, but updating the "
                   f"local copy failed: {exc}; close the backend and open it again")
            raise StateError(msg) from exc
        self.status = BackendStatus.OPEN

    def abort(self) -> None:
        """Drop every buffered write; the backend stays open at the last committed version."""
        self._check_open()
        self._changes = Changes()

    def close(self) -> None:
        """Drop buffered writes, hand the committed dicts to the process cache, release the
        subtask's lock.
        """
        if self.status is BackendStatus.CLOSED:
            return
        healthy = self.status is BackendStatus.OPEN
        self.status = BackendStatus.CLOSED
        self._changes = Changes()
        if healthy and self.options.process_cache:
            cache_committed(self._cache_key, self._data)
        self._data = Committed(version=self._data.version)  # do not pin a stale copy
        self._release()
