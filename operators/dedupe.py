"""Dedupe, a column at a time (`operators.keyed.run_task` hands it its epochs).

**Semantics** (docs/guide/pipeline-file.md, `dedupe: {within: d}`): the first record of a key (by
event time, then arrival, within an epoch) is forwarded, and the key is remembered until the
watermark passes that record's time + d; a record of a remembered key is dropped. With a
processing-time job the clock takes the watermark's place.

**State layout.** The remembered keys live in chunks: Arrow tables of the key columns and the
time each key is forgotten at (`__expires_ms`), stored as one LZ4-compressed Arrow IPC stream
each in the value state `dedupe.seen` under (key group, b"", namespace), the namespace being
the epoch that wrote the chunk and its earliest and latest expiry (8 bytes each, big-endian).
A chunk whose latest expiry has passed is deleted without being read, one whose earliest has
passed is rewritten without its forgotten keys, and a key group with more than `MAX_CHUNKS`
chunks has them merged; every other chunk is only read, and only in the epochs that bring
records of its key group. No timers: forgetting a key emits nothing, so nothing needs the
coordinator to run an epoch for it, and a key past its expiry is treated as forgotten whether
its chunk was rewritten yet or not. Everything is per key group, so checkpoints, savepoints
and rescaling move chunks as they move any state entry.

Why (bench/matrix.py, `parquet·-·dedupe·parquet`, 1 M distinct ids): the layout before this
one kept an "acc" entry and an expiry timer per key, and py-spy put most of the subtasks'
time into writing, scanning and deleting those entries and timers one key at a time.

State written that way (per key an "acc" entry under `NS_ROLLING` and a timer at its expiry)
is moved into chunks the first time a subtask finds one of those timers (`_migrate`), so
earlier checkpoints and savepoints restore.
"""

from __future__ import annotations

import json
import struct
from typing import TYPE_CHECKING, Any

from streamer.columns import (
    EVENT_TIME,
    EVENT_TIME_MS,
    FIRST_RECORD,
    KEY_GROUP,
    ROUTE,
    SEQUENCE,
    SUBTASK,
)
from streamer.operators.contract import (
    COLUMNAR,
    COMBINES,
    LOCAL_EPOCHS,
    WHOLE_RECORDS,
    KeyedKind,
    Logic,
    Planning,
)
from streamer.operators.keyed_rows import (
    encode_chunk,
    filled,
    flagged,
    key_codes_only,
    key_group_runs,
    normal_key_column,
)
from streamer.state.names import CHUNK_KEYS, DEDUPE_EXPIRES, DEDUPE_SEEN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructField, StructType

    from streamer.operators.keyed_config import KeyedConfig
    from streamer.pipeline.spec import OperatorSpec

#: A key group with more chunks than this has them merged into one.
MAX_CHUNKS = 16
#: When a remembered key is forgotten (ms: its first record's time + `within`).
EXPIRES = DEDUPE_EXPIRES
_NS = struct.Struct(">qqq")  # epoch, earliest expiry, latest expiry
_REWRITE = "__rewrite"  # (in memory: the row's chunk is written again this epoch)


class DedupeKind(KeyedKind):
    """Dedupe (`dedupe: {within: d}`)."""

    name = "dedupe"
    capabilities = frozenset({COMBINES, COLUMNAR, LOCAL_EPOCHS, WHOLE_RECORDS})

    def output_fields(self, spark: Any, op: OperatorSpec, input_schema: StructType
                      ) -> list[StructField]:
        """The input's columns, and `__ts` (the record's event time)."""
        from pyspark.sql.types import StructField, TimestampType

        del spark, op
        fields = list(input_schema.fields)
        if EVENT_TIME not in input_schema.fieldNames():
            fields.append(StructField(EVENT_TIME, TimestampType()))
        return fields

    def prepare(self, plan: Planning, df: DataFrame, group: list[Any], epoch: int,
                watermark: int, prerouted: bool) -> tuple[DataFrame, DataFrame | None, Any]:
        """Each key's first record of the epoch (by event time, then arrival)."""
        from pyspark.sql import functions as F

        del epoch, watermark
        cols = [F.col(c) for c in df.columns if c not in (SUBTASK, KEY_GROUP, SEQUENCE)]
        first = F.min_by(F.struct(*cols, F.col(SEQUENCE)), F.struct(EVENT_TIME_MS, SEQUENCE))
        if prerouted:
            df, group = plan.routed(df), [F.col(ROUTE), *group]
        rows = df.groupBy(*group).agg(first.alias(FIRST_RECORD)).select(
            *([ROUTE] if prerouted else []), SUBTASK, KEY_GROUP, f"{FIRST_RECORD}.*")
        return rows, None, None

    def logic(self, cfg: KeyedConfig) -> Logic:
        """`run_dedupe` over the rows' table."""
        return lambda cfg, backend, rows, out: run_dedupe(cfg, backend, rows.table, out)


def run_dedupe(cfg: Any, backend: Any, table: Any, out: Any) -> None:
    """One epoch of a dedupe for one subtask: `table` (an Arrow table of the stage's input
    columns with the key group; may be empty) deduplicated against the remembered keys."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from streamer.state import StateDescriptor, StateKind

    backend.declare(StateDescriptor(DEDUPE_SEEN, StateKind.VALUE))
    now = cfg.fire_up_to
    keys = list(cfg.keys)
    firsts = _firsts(table, keys)
    wanted = set(firsts.column(KEY_GROUP).to_pylist()) if firsts is not None else set()
    # Decoded chunks as rows with their key group and whether they are written again (a
    # chunk deleted now: partly forgotten, or merged; the migrated rows).
    loaded: list[Any] = []
    migrated = _migrate(cfg, backend)
    if migrated is not None:
        loaded.append(flagged(migrated, _REWRITE, True))
    gone: list[tuple[int, bytes, bytes]] = []
    for kg in backend.key_groups:
        listed = [(ns, value) for _, ns, value in backend.iterate(DEDUPE_SEEN, kg)]
        merge = len(listed) > MAX_CHUNKS
        for ns, value in listed:
            _, lo, hi = _NS.unpack(ns)
            if hi <= now:  # every key of the chunk is forgotten
                gone.append((kg, b"", ns))
            elif merge or lo <= now or kg in wanted:
                rewritten = merge or lo <= now
                loaded.append(flagged(_decode(value, kg), _REWRITE, rewritten))
                if rewritten:
                    gone.append((kg, b"", ns))
    seen = pa.concat_tables(loaded, promote_options="permissive") if loaded else None
    if seen is not None:
        seen = seen.filter(pc.greater(seen.column(EXPIRES), now))
    new = firsts
    if firsts is not None and firsts.num_rows and seen is not None and seen.num_rows:
        both = pa.concat_tables([seen.select(keys),
                                 pa.table({k: normal_key_column(firsts.column(k)) for k in keys})],
                                promote_options="permissive")
        code = key_codes_only(both, tuple(keys))
        known = np.isin(code[seen.num_rows:], code[:seen.num_rows])
        new = firsts.filter(pa.array(~known))
    if new is not None and new.num_rows:
        out.table(new.select(list(cfg.record_columns)))
    parts = []  # what is written: the rewritten chunks' live keys, the epoch's new ones
    if seen is not None and seen.num_rows:
        parts.append(seen.filter(seen.column(_REWRITE)).drop_columns([_REWRITE]))
    if new is not None and new.num_rows:
        ts = new.column(EVENT_TIME_MS).to_numpy()
        parts.append(pa.table({
            **{k: normal_key_column(new.column(k)) for k in keys},
            EXPIRES: pa.array(ts + (cfg.dedupe_ms or 0), pa.int64()),
            KEY_GROUP: new.column(KEY_GROUP).cast(pa.int32())}))
    if gone:
        backend.delete_many(DEDUPE_SEEN, gone)
    parts = [p for p in parts if p.num_rows]
    if parts:
        _store(cfg, backend, pa.concat_tables(parts, promote_options="permissive"), keys)


def _firsts(table: Any, keys: list[str]) -> Any:
    """Each key's first record of the epoch (by event time, then arrival), in arrival order;
    keys that differ only as -0.0 and 0.0 are one key (as state keys are). None: no rows."""
    import numpy as np
    import pyarrow as pa

    if not table.num_rows:
        return None
    code = key_codes_only(pa.table({k: normal_key_column(table.column(k)) for k in keys}),
                        tuple(keys))
    ts = table.column(EVENT_TIME_MS).to_numpy()
    order = np.lexsort((np.arange(len(code)), ts, code))
    head = np.ones(len(order), dtype=bool)
    head[1:] = code[order][1:] != code[order][:-1]
    return table.take(pa.array(np.sort(order[head]), pa.int64()))


def _decode(value: bytes, kg: int) -> Any:
    """A stored chunk as rows with their key group (`__kg`)."""
    import pyarrow as pa

    table = pa.ipc.open_stream(value).read_all()
    return table.append_column(KEY_GROUP, filled(table.num_rows, pa.int32(), kg))


def _store(cfg: Any, backend: Any, rows: Any, keys: list[str]) -> None:
    """`rows` (keys, expiry, key group) as one new chunk per key group."""
    rows, runs = key_group_runs(rows)
    expires = rows.column(EXPIRES).to_numpy()
    chunk_rows = rows.select([*keys, EXPIRES]).replace_schema_metadata(
        {CHUNK_KEYS: json.dumps(keys).encode()})
    entries = []
    for kg, a, b in runs:
        ns = _NS.pack(cfg.epoch, int(expires[a:b].min()), int(expires[a:b].max()))
        entries.append((kg, b"", ns, encode_chunk(chunk_rows.slice(a, b - a))))
    backend.put_many(DEDUPE_SEEN, entries)


def _migrate(cfg: Any, backend: Any) -> Any:
    """The keys an earlier version remembered one entry and timer each ("acc" under
    `NS_ROLLING`) as chunk rows with their key group, those entries and timers deleted;
    None when there are none (no timer: this layout keeps none)."""
    import pyarrow as pa

    from streamer.operators.keyed_rows import NS_ROLLING
    from streamer.state.codec import decode_key

    if backend.next_timer(cfg.domain) is None:
        return None
    found: list[tuple[int, tuple[Any, ...], int]] = []
    addresses = []
    for kg in backend.key_groups:
        for kb, ns, value in backend.iterate("acc", kg):
            if ns == NS_ROLLING:
                addresses.append((kg, kb, ns))
                found.append((kg, decode_key(kb), int(value[3])))
    backend.due_timers(cfg.domain, 2**62, remove=True)
    if not addresses:
        return None
    backend.delete_many("acc", addresses)
    types = {f.name: f.type for f in cfg.out_schema}  # (the record's columns, keys among them)
    columns: dict[str, Any] = {}
    for i, k in enumerate(cfg.keys):
        columns[k] = normal_key_column(pa.array([key[i] for _, key, _ in found], types.get(k)))
    columns[EXPIRES] = pa.array([expiry for _, _, expiry in found], pa.int64())
    columns[KEY_GROUP] = pa.array([kg for kg, _, _ in found], pa.int32())
    return pa.table(columns)
