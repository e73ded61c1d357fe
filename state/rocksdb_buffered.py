"""A subtask's RocksDB as the rocksdb backend (state/rocksdb.py) reads it: through the epoch's
write buffer (scans and look-ups merge buffered writes over committed ones), and its timers,
which need nothing more. `RocksDBBackend` builds on `BufferedRocksDB`.

Iteration never keeps a RocksDB iterator across a `yield` (scans read bounded chunks into
lists): a live iterator would keep the DB, and its LOCK, alive after `close()`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from typing import cast

from rocksdict import Rdict, ReadOptions

from streamer.state.base import (
    DomainLike,
    KeyedStateBackend,
    TimeDomain,
    Timer,
    TimerSpec,
    as_domain,
)
from streamer.state.codec import (
    DOMAIN_CODES,
    encode_time,
    prefix_end,
    split_timer_key,
    timer_key,
    timer_prefix,
)
from streamer.state.rocksdb_format import CHUNK, MAX_TIME, MISSING, TIMERS, merge


class BufferedRocksDB(KeyedStateBackend):
    """The committed column families of one subtask's DB and the epoch's buffered writes."""

    _db: Rdict | None
    #: Column family name -> its Rdict.
    _cfs: dict[str, Rdict]
    #: Column family name -> the epoch's buffered writes (None: a deletion).
    _pending: dict[str, dict[bytes, bytes | None]]
    #: Column family name -> the sorted keys of its buffer (dropped when the buffer changes).
    _sorted: dict[str, list[bytes]]

    # ------------------------------------------------------------------ buffered reads
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
            chunk = self._read_db(cf_name, start, hi, CHUNK)
            if len(chunk) < CHUNK:
                yield from merge(chunk, buffered)
                return
            last = chunk[-1][0]
            cut = bisect.bisect_right(buffered, last, key=lambda pair: pair[0])
            yield from merge(chunk, buffered[:cut])
            buffered = buffered[cut:]
            start = last + b"\x00"

    def _lookup(self, cf_name: str, key: bytes) -> bytes | None:
        buffer = self._pending.get(cf_name)
        if buffer is not None:
            raw = buffer.get(key, MISSING)
            if raw is not MISSING:
                return raw
        return self._cfs[cf_name].get(key)

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
        buffer = self._buffer(TIMERS)
        for kg, time_ms, key, ns in timers:
            self._check_write(kg, key, ns)
            buffer[timer_key(kg, code, time_ms, key, ns)] = value

    def _timer_ranges(self, domain: TimeDomain,
                      up_to_ms: int | None) -> Iterator[tuple[int, bytes, bytes | None]]:
        code = DOMAIN_CODES[domain.value]
        for kg in self.key_groups:
            lo = timer_prefix(kg, code)
            if up_to_ms is None or up_to_ms >= MAX_TIME:
                yield kg, lo, prefix_end(lo)
            else:
                yield kg, lo, lo + encode_time(up_to_ms + 1)

    def due_timers(self, domain: DomainLike, up_to_ms: int, *,
                   remove: bool = False) -> list[Timer]:
        """Timers with time <= `up_to_ms`, sorted by (time, key group, key, namespace); with
        `remove`, they are also deleted (a buffered write, like any other).

        (Hot for operators with a timer per key: the committed timers of each key group's
        range come from one bounded scan (`_read_db`), sort as plain tuples, and are deleted
        by their stored key.)
        """
        self._check_open()
        time_domain = as_domain(domain)
        found: list[tuple[int, int, bytes, bytes, bytes]] = []
        for _, lo, hi in self._timer_ranges(time_domain, up_to_ms):
            committed = self._read_db(TIMERS, lo, hi, None)
            for stored_key, _ in merge(committed, self._buffered_range(TIMERS, lo, hi)):
                kg, _, time_ms, key, ns = split_timer_key(stored_key)
                found.append((time_ms, kg, key, ns, stored_key))
        found.sort()
        if remove and found:
            buffer = self._buffer(TIMERS)
            for entry in found:
                buffer[entry[4]] = None
        return [Timer(t, kg, key, ns, time_domain) for t, kg, key, ns, _ in found]

    def next_timer(self, domain: DomainLike) -> int | None:
        """The earliest registered time in `domain`, or None when there is no timer."""
        self._check_open()
        best: int | None = None
        buffer = self._pending.get(TIMERS, {})
        iterator = self._cfs[TIMERS].iter()
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
                for stored_key, value in self._buffered_range(TIMERS, lo, hi):
                    if value is not None:
                        time_ms = split_timer_key(stored_key)[2]
                        best = time_ms if best is None else min(best, time_ms)
                        break
        finally:
            del iterator
        return best
