"""Export of an operator's savepoint state as readable Parquet or JSON lines
(`streamer savepoint export`): keys, namespaces and values decoded.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

from streamer.columns import EVENT_TIME_MS, PARTIAL_PREFIX, WINDOW_END, WINDOW_START
from streamer.savepoint.exceptions import SavepointError
from streamer.savepoint.format import TIMER, files_by_key_group, open_storage, read_table
from streamer.savepoint.values import decode_value
from streamer.state.codec import decode_key
from streamer.state.exceptions import StateError
from streamer.state.names import (
    CHUNK_KEYS,
    DEDUPE_EXPIRES,
    DEDUPE_SEEN,
    JOIN_CHUNKS,
    JOIN_MATCHED,
    SESSION_CHUNKS,
    WINDOW_KEYS,
)

#: Export formats of `export_operator`.
EXPORT_FORMATS = ("parquet", "jsonl")

def _plain(value: Any) -> Any:
    """A decoded state value as plain JSON: tuples and sets as lists, bytes as hex, times as
    ISO text, Decimals as text, non-finite floats as "NaN" / "Infinity"; else `repr`.
    """
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        if math.isfinite(value):
            return value
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_plain(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(_plain(k)): _plain(v)
                for k, v in value.items()}
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    return repr(value)


def _export_value(data: bytes) -> Any:
    try:
        return _plain(decode_value(data))
    except Exception:  # a pickled object whose class is not importable here
        return data.decode("utf-8", "replace")


def _json_text(value: Any) -> str:
    """JSON text, non-ASCII characters kept, unless a lone surrogate forces escapes."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value)
    return text


def _user_key(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.hex()


def _export_rows(table: Any, key_group: int, as_text: bool) -> list[dict[str, Any]]:
    """The readable rows of one state file: key, namespace and value decoded."""
    rows = []
    encode = _json_text if as_text else (lambda v: v)
    for row in table.to_pylist():
        ns = row["namespace"]
        timer = row["kind"] == TIMER
        if not timer and row["state"] == WINDOW_KEYS and len(ns) == 16:
            window = _window_partials(row, key_group, encode)
            if window is not None:
                rows.extend(window)
                continue
        if not timer and row["state"] in (JOIN_CHUNKS, DEDUPE_SEEN, SESSION_CHUNKS):
            records = _chunk_records(row, key_group, encode)
            if records is not None:
                rows.extend(records)
                continue
        try:
            key = _plain(list(decode_key(row["key"])))
        except StateError:
            key = row["key"].hex()
        rows.append({
            "key_group": key_group,
            "state": row["state"],
            "kind": row["kind"],
            "key": encode(key),
            "namespace": ns.hex(),
            "window_start_ms": int.from_bytes(ns, "big", signed=True) if len(ns) == 8 else None,
            "user_key": _user_key(row["user_key"]),
            "value": None if timer else encode(_export_value(row["value"])),
            "expires_at_ms": row["expires_at_ms"],
            "domain": row["domain"],
            "time_ms": row["time_ms"],
        })
    return rows


def _window_partials(row: dict[str, Any], key_group: int, encode: Any
                     ) -> list[dict[str, Any]] | None:
    """An `emit: final` window's entry of one epoch (columns of keys and accumulators,
    `operators.windows._window_chunks`) as one "acc" row per key, as per-key state reads;
    the namespace keeps the epoch (window start + epoch), so a window written over several
    epochs shows one partial per epoch. None for an entry of another layout."""
    try:
        value = decode_value(row["value"])
    except Exception:  # a pickled object whose class is not importable here
        return None
    if not (isinstance(value, tuple) and len(value) == 2):
        return None
    ns = row["namespace"]
    key_columns, acc_columns = value
    return [{
        "key_group": key_group, "state": "acc", "kind": row["kind"],
        "key": encode(_plain(list(key))), "namespace": ns.hex(),
        "window_start_ms": int.from_bytes(ns[:8], "big", signed=True), "user_key": None,
        "value": encode(_plain(list(acc))), "expires_at_ms": row["expires_at_ms"],
        "domain": row["domain"], "time_ms": row["time_ms"],
    } for key, acc in zip(zip(*key_columns, strict=True), zip(*acc_columns, strict=True),
                          strict=True)]


def _chunk_records(row: dict[str, Any], key_group: int, encode: Any
                   ) -> list[dict[str, Any]] | None:
    """A chunk (an Arrow IPC stream whose schema names the key columns) as one row per
    record: the key, and as value, for an interval join's buffered record
    (`operators.join_interval`) the side ("left" / "right"), the record's own columns,
    `event_time_ms` and `matched`; for a dedupe's remembered key (`operators.dedupe`)
    `expires_ms`; for an open session (`operators.sessions`) its start as `window_start_ms`
    and as value its `end_ms` and partial aggregates. None for an entry that is not such a
    chunk."""
    import pyarrow as pa

    try:
        table = pa.ipc.open_stream(decode_value(row["value"])).read_all()
        keys = json.loads((table.schema.metadata or {})[CHUNK_KEYS])
    except Exception:  # not a chunk of this layout
        return None
    ns = row["namespace"]
    if row["state"] == DEDUPE_SEEN:
        return [{
            "key_group": key_group, "state": row["state"], "kind": row["kind"],
            "key": encode(_plain([record[k] for k in keys])), "namespace": ns.hex(),
            "window_start_ms": None, "user_key": None,
            "value": encode(_plain({"expires_ms": record[DEDUPE_EXPIRES]})),
            "expires_at_ms": row["expires_at_ms"], "domain": row["domain"],
            "time_ms": row["time_ms"],
        } for record in table.to_pylist()]
    if row["state"] == SESSION_CHUNKS:
        return [{
            "key_group": key_group, "state": row["state"], "kind": row["kind"],
            "key": encode(_plain([record[k] for k in keys])), "namespace": ns.hex(),
            "window_start_ms": record[WINDOW_START], "user_key": None,
            "value": encode(_plain({"end_ms": record[WINDOW_END],
                                    "partials": [v for n, v in record.items()
                                                 if n.startswith(PARTIAL_PREFIX)]})),
            "expires_at_ms": row["expires_at_ms"], "domain": row["domain"],
            "time_ms": row["time_ms"],
        } for record in table.to_pylist()]
    side = "left" if ns[:1] == b"\x00" else "right"
    own = [n for n in table.column_names if n not in keys and not n.startswith("__")]
    return [{
        "key_group": key_group, "state": row["state"], "kind": row["kind"],
        "key": encode(_plain([record[k] for k in keys])), "namespace": ns.hex(),
        "window_start_ms": None, "user_key": None,
        "value": encode(_plain({"side": side, **{n: record[n] for n in own},
                                "event_time_ms": record[EVENT_TIME_MS],
                                "matched": record[JOIN_MATCHED]})),
        "expires_at_ms": row["expires_at_ms"], "domain": row["domain"],
        "time_ms": row["time_ms"],
    } for record in table.to_pylist()]


def _export_schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("key_group", pa.int32()), ("state", pa.string()), ("kind", pa.string()),
        ("key", pa.string()), ("namespace", pa.string()), ("window_start_ms", pa.int64()),
        ("user_key", pa.string()), ("value", pa.string()), ("expires_at_ms", pa.int64()),
        ("domain", pa.string()), ("time_ms", pa.int64()),
    ])


def _export_groups(savepoint_url: str, operator_files: Sequence[Mapping[str, Any]],
                   verify: bool) -> Iterator[tuple[int, Any]]:
    storage = open_storage(savepoint_url)
    by_group = files_by_key_group(savepoint_url, operator_files)
    for key_group in sorted(by_group):
        yield key_group, read_table(storage, savepoint_url, by_group[key_group], verify)


def export_operator(savepoint_url: str, operator_files: Sequence[Mapping[str, Any]],
                    out_path: str, fmt: str, *, verify: bool = True) -> dict[str, Any]:
    """Write an operator's savepoint state to `out_path` (a path or fsspec URL) as "parquet"
    or "jsonl", one row per state entry and per timer (kind "timer"), key groups in order:
    key_group, state, kind, key (decoded key columns, a JSON array; Parquet: its JSON text),
    namespace (hex), window_start_ms (for an 8-byte namespace), user_key (UTF-8, else hex),
    value (decoded, as plain JSON; Parquet: its JSON text), expires_at_ms, domain, time_ms.
    An `emit: final` window's per-epoch entry is shown as one "acc" row per key (a partial
    per epoch that touched the window; its value is their merge), an interval join's
    or a dedupe's chunk as one row per record (`_chunk_records`).
    Returns {"path", "format", "rows", "entries", "timers", "key_groups"}.
    """
    import fsspec

    if fmt not in EXPORT_FORMATS:
        msg = f"unknown export format {fmt!r}; use one of {', '.join(map(repr, EXPORT_FORMATS))}"
        raise SavepointError(msg)
    entries = timers = groups = 0
    try:
        with fsspec.open(out_path, "wb") as sink:
            writer: Any = None
            if fmt == "parquet":
                import pyarrow as pa
                import pyarrow.parquet as pq

                schema = _export_schema()
                writer = pq.ParquetWriter(sink, schema, compression="zstd")
            try:
                for key_group, table in _export_groups(savepoint_url, operator_files, verify):
                    rows = _export_rows(table, key_group, as_text=writer is not None)
                    groups += 1
                    n_timers = sum(1 for r in rows if r["kind"] == TIMER)
                    timers += n_timers
                    entries += len(rows) - n_timers
                    if writer is not None:
                        writer.write_table(pa.Table.from_pylist(rows, schema=schema))
                    else:
                        sink.write("".join(_json_text(r) + "\n" for r in rows).encode())
            finally:
                if writer is not None:
                    writer.close()
    except OSError as exc:
        msg = f"cannot write the export of savepoint {savepoint_url!r} to {out_path!r}: {exc}"
        raise SavepointError(msg) from exc
    return {"path": out_path, "format": fmt, "rows": entries + timers, "entries": entries,
            "timers": timers, "key_groups": groups}
