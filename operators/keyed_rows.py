"""The rows of a keyed task (operators/keyed.py): its input (`Input`, read a column at a
time), its output batch (`Emitter`), and the accumulator, key and namespace helpers that the
logic of every keyed kind (operators/kinds.py) shares.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

from streamer.columns import (
    CHANGE,
    EVENT_TIME,
    EVENT_TIME_MS,
    KEY_GROUP,
    META,
    OUT,
    ROW_KIND,
    ROW_META,
    SEQUENCE,
    partial,
)
from streamer.operators.aggregates import accumulator
from streamer.operators.keyed_config import KeyedConfig

NS_ROLLING = b""
I64 = struct.Struct(">q")


def ns_of(start_ms: int) -> bytes:
    """A window namespace: its start, big-endian so namespaces sort by time."""
    return I64.pack(start_ms)


def accumulators_of(cfg: KeyedConfig) -> list[tuple[Any, int]]:
    """(accumulator, number of partial columns) per aggregate, in order."""
    accs = [accumulator(a, EVENT_TIME_MS, SEQUENCE) for a in cfg.aggregates]
    return [(acc, len(acc.sql)) for acc in accs]


class Emitter:
    """Collects output rows and turns them into one Arrow batch: row by row (`rows`, dicts)
    or, for the columnar operators, a column chunk at a time (`columns`); the batch holds the
    chunks, then the rows, then the meta row."""

    def __init__(self, cfg: KeyedConfig) -> None:
        self.cfg = cfg
        self.rows: list[dict[str, Any]] = []
        self.chunks: list[tuple[int, dict[str, Any]]] = []

    def __len__(self) -> int:
        return len(self.rows) + sum(n for n, _ in self.chunks)

    def columns(self, keys: list[tuple[Any, ...]], values: list[list[Any]],
                starts: list[int] | None = None, size: int = 0,
                changes: list[str] | None = None) -> None:
        """Output rows of `keys` with the final `values` (one list per aggregate); with
        `starts`, of the windows [start, start + size); with `changes`, what each row is to
        an update stream (`columns.CHANGE`)."""
        if not keys:
            return
        self.key_columns([[k[i] for k in keys] for i in range(len(self.cfg.keys))], values,
                         starts, size, changes)

    def key_columns(self, keys: list[list[Any]], values: list[list[Any]],
                    starts: list[int] | None = None, size: int = 0,
                    changes: list[str] | None = None) -> None:
        """`columns`, with the keys given a column (list) per key column."""
        n = len(values[0]) if values else len(starts or ())
        if not n:
            return
        cols: dict[str, Any] = dict(zip(self.cfg.keys, keys, strict=True))
        if changes is not None:
            cols[CHANGE] = changes
        if starts is not None:
            import numpy as np

            micros = np.asarray(starts, dtype=np.int64) * 1000  # (window times in microseconds)
            cols["window_start"] = micros
            cols["window_end"] = micros + size * 1000
            cols[EVENT_TIME] = micros + (size - 1) * 1000
        for agg, column in zip(self.cfg.aggregates, values, strict=True):
            cols[agg.name] = column
        self.chunks.append((n, cols))

    def window(self, key: Sequence[Any], start: int, end: int, values: list[Any]) -> None:
        """One window's output row: its key, [start, end) and final values."""
        row: dict[str, Any] = {ROW_KIND: OUT, ROW_META: None}
        row.update(zip(self.cfg.keys, key, strict=True))
        row["window_start"] = start * 1000
        row["window_end"] = end * 1000
        row[EVENT_TIME] = (end - 1) * 1000
        for agg, value in zip(self.cfg.aggregates, values, strict=True):
            row[agg.name] = value
        self.rows.append(row)

    def table(self, table: Any) -> None:
        """Output rows: the rows of the Arrow `table`, whose columns are output columns."""
        if table.num_rows:
            self.chunks.append((table.num_rows, {name: table.column(name)
                                                 for name in table.column_names}))

    def record(self, record: dict[str, Any]) -> None:
        """One output row of the output columns."""
        self.rows.append({ROW_KIND: OUT, ROW_META: None, **record})

    def batch(self, meta: dict[str, Any]) -> Any:
        """The output as one Arrow batch, its last row the meta row (`meta` as JSON)."""
        import pyarrow as pa

        schema = self.cfg.out_schema
        rows = [*self.rows, {ROW_KIND: META, ROW_META: json.dumps(meta)}]
        last = pa.RecordBatch.from_pylist(rows, schema=schema)
        if not self.chunks:
            return last
        parts = []
        for n, cols in self.chunks:
            arrays = []
            for f in schema:
                if f.name in cols:
                    value = cols[f.name]
                    if isinstance(value, pa.ChunkedArray):
                        arrays.append(value.combine_chunks().cast(f.type))
                    else:
                        arrays.append(pa.array(value, type=f.type))
                elif f.name == ROW_KIND:
                    arrays.append(pa.array([OUT] * n, type=f.type))
                else:
                    arrays.append(pa.nulls(n, type=f.type))
            parts.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
        return pa.concat_batches([*parts, last])


def final_values(accs: list[tuple[Any, int]], state: list[Any]) -> list[Any]:
    """The final value of each accumulator of one state."""
    return [acc.final(value) for (acc, _), value in zip(accs, state, strict=True)]


def final_columns(accs: list[tuple[Any, int]], states: list[list[Any]]) -> list[list[Any]]:
    """The final values of many accumulator lists, one list per aggregate."""
    return [acc.final_rows([state[i] for state in states]) for i, (acc, _) in enumerate(accs)]


def lifted_columns(accs: list[tuple[Any, int]], rows: Input) -> list[list[Any]]:
    """The mergeable accumulators of every input row, a column (list) per aggregate."""
    per_agg, i = [], 0
    for acc, n in accs:
        per_agg.append(acc.lift_rows([rows.column(partial(i + j)) for j in range(n)]))
        i += n
    return per_agg


def lift_columns(accs: list[tuple[Any, int]], rows: Input) -> list[list[Any]]:
    """The mergeable accumulators of every input row (a list per row, like `lift_row`)."""
    return [list(values) for values in zip(*lifted_columns(accs, rows), strict=True)]


class Input:
    """A subtask's input rows of an epoch (dummy rows removed) as an Arrow table, read into
    Python a column at a time: the columnar operators never build a dict per row."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self._columns: dict[str, list[Any]] = {}

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def column(self, name: str) -> list[Any]:
        """One column as a Python list."""
        values = self._columns.get(name)
        if values is None:
            values = self._columns[name] = self.table.column(name).to_pylist()
        return values

    def keys(self, names: Sequence[str]) -> list[tuple[Any, ...]]:
        """The key tuple of every row."""
        if not names:
            return [()] * len(self)
        return list(zip(*(self.column(k) for k in names), strict=True))


def _column_codes(column: Any) -> tuple[Any, Any]:
    """(per value of the Arrow `column` its index in the column's dictionary of distinct
    values, nulls as one past the last; that dictionary)."""
    import numpy as np
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(column.combine_chunks())
    index = encoded.indices.fill_null(len(encoded.dictionary)).to_numpy().astype(np.int64)
    return index, encoded.dictionary


def key_codes(table: Any, keys: tuple[str, ...]) -> tuple[Any, list[tuple[Any, ...]]]:
    """(per row of the Arrow `table` the index of its distinct key over the columns
    `keys`, the distinct keys as tuples): dictionary codes, combined across columns."""
    import numpy as np

    code: Any = None
    distinct: list[tuple[Any, ...]] = [()]
    for name in keys:
        index, dictionary = _column_codes(table.column(name))
        values = [*dictionary.to_pylist(), None]  # the last stands for null
        if code is None:
            code, distinct = index, [(v,) for v in values]
            continue
        # Combine with the columns before, then renumber densely.
        combined = code * len(values) + index
        uniq, code = np.unique(combined, return_inverse=True)
        distinct = [(*distinct[c // len(values)], values[c % len(values)]) for c in uniq.tolist()]
    if code is None:
        code = np.zeros(table.num_rows, dtype=np.int64)
    return code, distinct


def key_codes_only(table: Any, keys: tuple[str, ...]) -> Any:
    """The codes of `key_codes` without its distinct keys (nothing is read into Python):
    where only which rows share a key matters."""
    import numpy as np

    code: Any = None
    for name in keys:
        index, dictionary = _column_codes(table.column(name))
        if code is None:
            code = index
            continue
        _, code = np.unique(code * (len(dictionary) + 1) + index, return_inverse=True)
    return np.zeros(table.num_rows, dtype=np.int64) if code is None else code


def key_cells(table: Any, keys: Sequence[str], namespace: bytes = NS_ROLLING
              ) -> list[tuple[int, bytes, bytes]]:
    """(key group, encoded key, `namespace`) of every row of the Arrow `table` (with
    `__kg` and the key columns), the keys encoded a column at a time."""
    from streamer.state.codec import encode_key_columns

    kgs = table.column(KEY_GROUP).to_pylist()
    encoded = (encode_key_columns([table.column(k) for k in keys]) if keys
               else [key_to_bytes(())] * len(kgs))
    return [(kg, kb, namespace) for kg, kb in zip(kgs, encoded, strict=True)]


def encode_keys(keys: list[tuple[Any, ...]]) -> list[bytes]:
    """`encode_key` of every key, once per distinct key.

    A cache by key is safe: equal keys of one column encode alike (a column has one type,
    and encode_key maps -0.0 and 0.0 alike).
    """
    from streamer.state.codec import encode_key

    cache: dict[tuple[Any, ...], bytes] = {}
    out = []
    for key in keys:
        data = cache.get(key)
        if data is None:
            data = cache[key] = encode_key(key)
        out.append(data)
    return out


def window_namespaces(starts: list[int]) -> list[bytes]:
    """`ns_of` of every window start, once per distinct start."""
    cache: dict[int, bytes] = {}
    out = []
    for start in starts:
        ns = cache.get(start)
        if ns is None:
            ns = cache[start] = ns_of(start)
        out.append(ns)
    return out


def lift_row(accs: list[tuple[Any, int]], row: dict[str, Any]) -> list[Any]:
    """The accumulators of one row's partial columns."""
    out, i = [], 0
    for acc, n in accs:
        out.append(acc.lift([row[partial(i + j)] for j in range(n)]))
        i += n
    return out


def merge_accumulators(accs: list[tuple[Any, int]], a: list[Any] | None, b: list[Any]
                       ) -> list[Any]:
    """`a` and `b` merged, accumulator by accumulator (`b` when there is no `a`)."""
    if a is None:
        return b
    return [acc.merge(x, y) for (acc, _), x, y in zip(accs, a, b, strict=True)]


def key_to_bytes(key: Sequence[Any]) -> bytes:
    """The state key of a key tuple."""
    from streamer.state.codec import encode_key

    return encode_key(tuple(key))


def normal_key_column(column: Any) -> Any:
    """`column` with -0.0 as 0.0 when it is floating point: key columns compared a column at
    a time (the chunked layouts of `operators.join_interval` and `operators.dedupe`) tell
    keys apart as `encode_key` does."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_floating(column.type):
        return pc.add(column, pa.scalar(0.0, column.type))
    return column


def encode_chunk(table: Any) -> bytes:
    """An Arrow table as one LZ4-compressed Arrow IPC stream: a chunk of a chunked state
    layout (`operators.join_interval`, `operators.dedupe`)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def filled(n: int, dtype: Any, value: Any) -> Any:
    """An Arrow array of `n` times `value`."""
    import pyarrow as pa

    return pa.nulls(n, dtype).fill_null(pa.scalar(value, dtype))


def flagged(rows: Any, name: str, value: bool) -> Any:
    """The Arrow table `rows` with a boolean column `name` of `value`: how the chunked
    layouts mark rows by where they came from while they work on them."""
    import pyarrow as pa

    return rows.append_column(name, filled(rows.num_rows, pa.bool_(), value))


def key_group_runs(rows: Any) -> tuple[Any, list[tuple[int, int, int]]]:
    """`rows` (an Arrow table with `__kg`) sorted by key group (stable), and per key group
    (kg, start, stop) of its rows there: how a chunked layout writes one chunk per key
    group."""
    import itertools

    import numpy as np
    import pyarrow as pa

    kgs = rows.column(KEY_GROUP).to_numpy()
    order = np.argsort(kgs, kind="stable")
    rows, kgs = rows.take(pa.array(order)), kgs[order]
    bounds = [0, *(np.flatnonzero(kgs[1:] != kgs[:-1]) + 1).tolist(), len(kgs)]
    return rows, [(int(kgs[a]), a, b) for a, b in itertools.pairwise(bounds)]
