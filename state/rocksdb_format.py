"""The rocksdb state backend's layout on disk (state/rocksdb.py): column family and `_meta` key
names, value framing (a 1-byte tag, an optional 8-byte expiry, then the pickled value), list
encoding (length-prefixed pickled elements, so appending never decodes the list) and the
RocksDB options; and the merge of committed pairs with the epoch's buffered writes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

from rocksdict import BlockBasedOptions, Options

from streamer.state.codec import decode_value, encode_value

META = "_meta"
TIMERS = "_timers"
STATE_PREFIX = "state:"
VERSION_KEY = b"version"
FORMAT_KEY = b"format"
FORMAT = b"streamer-rocksdb-state/1"
OUTPUTS_PREFIX = b"outputs:"
KIND_PREFIX = b"state:"

_PLAIN, _EXPIRING = b"\x00", b"\x01"
_EXPIRY = struct.Struct(">q")
_LEN = struct.Struct(">I")
UINT64 = struct.Struct(">Q")
MAX_TIME = (1 << 63) - 1
CHUNK = 4096
MISSING: Any = object()


def db_options() -> Options:
    """The options of a subtask's DB (created with its column families when missing)."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.set_keep_log_file_num(2)
    options.set_max_background_jobs(2)
    return options


def cf_options() -> Options:
    """The options of a state's column family: the DB's, with a bloom filter."""
    options = db_options()
    table = BlockBasedOptions()
    # Most reads of a new window miss: a whole-key bloom filter answers those without I/O.
    table.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table)
    return options


def frame(payload: bytes, expires_at_ms: int | None) -> bytes:
    """A stored value: its tag, its expiry when it has one, then `payload`."""
    if expires_at_ms is None:
        return _PLAIN + payload
    return _EXPIRING + _EXPIRY.pack(expires_at_ms) + payload


def unframe(raw: bytes, now_ms: int | None) -> bytes | None:
    """The payload of a stored value, or None when it has expired at `now_ms`."""
    if raw[0] == 0:
        return raw[1:]
    if now_ms is not None and _EXPIRY.unpack_from(raw, 1)[0] <= now_ms:
        return None
    return raw[9:]


def expiry_of(raw: bytes) -> int | None:
    """The expiry of a stored value, or None when it has none."""
    return None if raw[0] == 0 else int(_EXPIRY.unpack_from(raw, 1)[0])


def encode_list(values: Iterable[Any]) -> bytes:
    """A list state's value: each element encoded with its length before it."""
    parts = []
    for value in values:
        data = encode_value(value)
        parts.append(_LEN.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def decode_list(payload: bytes) -> list[Any]:
    """The elements of an `encode_list` payload."""
    out = []
    pos, end = 0, len(payload)
    while pos < end:
        (size,) = _LEN.unpack_from(payload, pos)
        pos += 4
        out.append(decode_value(payload[pos:pos + size]))
        pos += size
    return out


def merge(db_pairs: list[tuple[bytes, bytes]],
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
