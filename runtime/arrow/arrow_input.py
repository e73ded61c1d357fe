"""A keyed stage's JSON input decoded, filtered and derived in Python tasks with Arrow
(`job.execution.arrow_input`), where that is certainly what Spark would compute.

The staged-input strategy (`runtime.plan.stages.keyed_stage.StagedRun`) has Spark decode a source's
text, apply the stateless operators before the keyed stage and write the result as local
parquet files for the subtasks. For a local JSON-lines `files` source, or a Kafka source of
JSON values read by confluent-kafka, whose columns, event time and operators Arrow computes
as Spark does (`connectors.arrow.arrow_json`, `runtime.arrow.arrow_sql`), one Spark job of Python
tasks does that instead, a task per file or per partition range: read, decode, event time,
operators, and the stage's columns written as a parquet file. A local parquet source with
operators before the keyed stage (without them its subtasks read the files themselves)
takes the same tasks, each file read when its column types are exactly Spark's.

A file or range where any step is not certain (a line Spark could read otherwise or call a
bad record, a record without event time, an overflow, a NaN met by a comparison) is refused
whole, and Spark reads, checks and computes it as before in the same epoch: dead letters,
errors and results are Spark's either way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from streamer.columns import EVENT_TIME
from streamer.connectors.arrow.arrow_json import TYPES
from streamer.connectors.formats import not_utc
from streamer.exceptions import ArrowRefused
from streamer.frames import lenient
from streamer.pipeline.spec import OperatorSpec
from streamer.runtime.arrow.arrow_sql import Program, arrow_type, compile_ops

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamer.connectors.base import SourceSlice
    from streamer.connectors.files.files_sink import TaskTarget
    from streamer.pipeline.graph import Dataflow

#: A bigger file is left to Spark, which reads it in splits: a task reads a file whole.
MAX_FILE_BYTES = 256 << 20


@dataclass(frozen=True)
class ArrowInput:
    """How the tasks compute a keyed stage's input from its source."""

    source_id: str
    #: "files" (a task per JSON-lines file), "csv" (per CSV file), "parquet" (per parquet
    #: file) or "kafka" (per partition range).
    kind: str
    #: The stateless operators between the source and the keyed stage, in order.
    op_ids: tuple[str, ...]
    #: The source's columns (name, Spark type), as decoded.
    columns: tuple[tuple[str, str], ...]
    #: Computes the event-time column from the decoded ones (None: no event time).
    event_time: Program | None
    program: Program
    #: The columns the tasks write (name, Arrow type): those the keyed stage's subtasks read
    #: (`DirectShape.columns`), or the sink's.
    out: tuple[tuple[str, Any], ...]
    #: A Kafka source's consumer configuration; a CSV source's `header` and `delimiter`.
    conf: Mapping[str, Any] | None = None

    @property
    def _key(self) -> str:
        """Where a slice's payload lists what the tasks read."""
        return "ranges" if self.kind == "kafka" else "files"

    def units(self, piece: SourceSlice) -> list[Any]:
        """What the tasks read of a slice: its files, or its partition ranges."""
        return list(piece.payload[self._key])

    def rest(self, piece: SourceSlice, units: list[Any]) -> SourceSlice:
        """The slice narrowed to `units` (those the tasks refused), for Spark to read."""
        from dataclasses import replace

        return replace(piece, payload={**piece.payload, self._key: units})


def plan_arrow_input(spark: SparkSession, flow: Dataflow, node_id: str,
                     sources: Mapping[str, Any], schemas: Mapping[str, Any],
                     out: tuple[tuple[str, Any], ...]) -> ArrowInput | str:
    """Whether the input of `node_id` (a keyed stage, or a sink whose files the tasks write)
    can be computed by Arrow tasks as the columns `out` (name, Arrow type), or why not:
    its input is a chain of filter, select and with_columns operators (or none) read only by
    the next, starting at a source only that chain reads: local
    JSON-lines, CSV (delimiter `,` `;` `|` or tab) or parquet files, or a Kafka topic of
    JSON values read by confluent-kafka (no `key:`, no `record_timestamp:`); the source's
    columns are bigint, int, double, string, boolean or timestamp; Spark's session
    time zone is UTC; and `runtime.arrow.arrow_sql` translates the event time and operators."""
    node = flow.node(node_id)
    chain: list[Any] = []
    current = node.inputs[0] if len(node.inputs) == 1 else None
    while current is not None and current not in sources:
        upstream = flow.node(current)
        if upstream.role != "operator" or upstream.kind == "keyed" or len(upstream.inputs) != 1:
            return f"its input {current!r} is not a filter, select or with_columns operator"
        if len(flow.consumers(current)) != 1:
            return f"operator {current!r} has other readers"
        chain.insert(0, upstream.operator)
        current = upstream.inputs[0]
    if current is None:
        return "it has more than one input"
    source = sources[current]
    if len(flow.consumers(current)) != 1:
        return f"source {current!r} has other readers"
    kind = _source_kind(source)
    if kind is None:
        return (f"source {current!r} is not local JSON-lines, CSV or parquet files, nor "
                "Kafka JSON values read by confluent-kafka without key: or record_timestamp:")
    schema = schemas[current]
    columns = tuple((f.name, f.dataType.simpleString()) for f in schema.fields)
    for name, column_kind in columns:
        if column_kind not in TYPES:
            return f"column {name!r} of source {current!r} has type {column_kind}"
    zone = not_utc(spark)
    if zone is not None:
        return zone
    event_time: Program | None = None
    if source.spec.event_time:
        found = _event_time(spark, source.spec, schema)
        if isinstance(found, str):
            return found
        event_time, schema = found.program, found.schema
    program = compile_ops(spark, schema, chain)
    if isinstance(program, str):
        return program
    conf = source.reader_conf() if kind == "kafka" else None
    if kind == "csv":
        from streamer.connectors.arrow.arrow_csv import refusal

        why = refusal(source.delimiter)
        if why is not None:
            return f"source {current!r}: {why}"
        conf = {"header": source.header, "delimiter": source.delimiter}
    return ArrowInput(current, kind, tuple(op.id for op in chain), columns, event_time,
                      program, tuple(out), conf)


def _source_kind(source: Any) -> str | None:
    """"files" (JSON lines), "csv", "parquet", "kafka", or None for a source the tasks do
    not read."""
    reads: str | None = source.task_reads  # (declared by the source: `Source.task_reads`)
    return reads


@dataclass(frozen=True)
class _EventTime:
    program: Program
    schema: Any


def _event_time(spark: SparkSession, spec: Any, schema: Any) -> _EventTime | str:
    """The source's event-time expression as a program adding `EVENT_TIME`, analyzed as
    `runtime.plan.stages.event_time` analyzes it (ANSI off: a value that cannot be computed is
    null, a bad record, which the tasks refuse), or why it cannot be one."""
    from pyspark.sql.types import StructField, StructType, TimestampType

    op = OperatorSpec(id=f"{spec.id} event_time", inputs=(spec.id,), kind="with_columns",
                      path=spec.path, uid=f"{spec.id}.event_time",
                      columns=((EVENT_TIME, spec.event_time),))
    with lenient(spark):
        program = compile_ops(spark, schema, [op])
    if isinstance(program, str):
        return f"the event time: {program}"
    return _EventTime(program, StructType([*schema.fields, StructField(
        EVENT_TIME, TimestampType())]))


def decode_units(spark: SparkSession, plan: ArrowInput, units: list[Any],
                 target: str | TaskTarget) -> list[dict[str, Any]]:
    """One Spark job, a Python task per file or range: each one's result, `{"unit", "split",
    "path"` (the parquet file written into directory `target`, or, `target` a sink's
    `TaskTarget`, the task's staging file there, `"rows_out"` and `"sink_refused"`),
    `"rows_in"`, `"max_ts"` (epoch ms or None), `"filters"` (op id -> [in, out])`}` or
    `{"unit", "refused": why}`."""
    import shutil

    if isinstance(target, str):
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(target)
        clear_other_epochs(os.path.dirname(target), os.path.basename(target))
    work = list(enumerate(units))
    rdd = spark.sparkContext.parallelize(work, len(work))
    return rdd.map(partial(_decode_one, plan, target)).collect()


def clear_other_epochs(root: str, keep: str) -> None:
    """Remove the staged directories under `root` other than this epoch's (`keep` is one of
    them, `epoch-<n>` or `epoch-<n>-arrow`): the epochs that already ended read theirs."""
    import shutil

    epoch = keep.removesuffix("-arrow")
    for name in os.listdir(root):
        if name not in (epoch, f"{epoch}-arrow"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _decode_one(plan: ArrowInput, target: str | TaskTarget,
                item: tuple[int, Any]) -> dict[str, Any]:
    """A task: one file or range read and decoded, its event time taken, the operators run,
    the stage's columns (or the sink's rows) written (see `decode_units`)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from streamer.worker import prepare_task

    prepare_task()
    index, unit = item
    try:
        table, split = decode_unit(plan, unit)
        max_ts = None
        if plan.event_time is not None:
            table, _ = plan.event_time.run(table)
            ts = table.column(EVENT_TIME)
            if ts.null_count:
                msg = "a record without event time (a bad record to Spark)"
                raise ArrowRefused(msg)
            if table.num_rows:
                max_ts = pc.max(ts).cast(pa.int64()).as_py() // 1000
        rows_in = table.num_rows
        table, filters = plan.program.run(table)
    except ArrowRefused as exc:
        return {"unit": unit, "refused": str(exc)}
    out = pa.table([table.column(n).cast(t) for n, t in plan.out],
                   names=[n for n, _ in plan.out])
    done = {"unit": unit, "split": split, "rows_in": rows_in, "max_ts": max_ts,
            "filters": {k: list(v) for k, v in filters.items()}}
    if not isinstance(target, str):  # the sink's rows, in its staging directory
        from streamer.connectors.files.files_sink import TaskFile

        file = TaskFile(target, index)
        try:
            file.write_rows(out)
            rows = file.close()
        except BaseException:
            file.discard()
            raise
        return {**done, "path": target.directory, "rows_out": rows,
                "sink_refused": file.refused}
    path = f"{target}/part-{index:05d}.parquet"
    pq.write_table(out, path, compression="none")
    return {**done, "path": path}


def decode_unit(plan: ArrowInput, unit: Any) -> tuple[Any, str]:
    """(The source's columns of one file or Kafka range, decoded with Arrow as Spark would,
    the name of its split); `ArrowRefused` where that is not certain. The continuous mode's
    source subtasks (`runtime.continuous.source_subtask`) read their files with it too."""
    from streamer.connectors.arrow.arrow_csv import decode as decode_csv
    from streamer.connectors.arrow.arrow_json import decode
    from streamer.connectors.files.files_source import SPLIT

    if plan.kind == "parquet":
        return _parquet(plan, unit), SPLIT
    data, records, split = _read(plan, unit)
    if plan.kind == "csv":
        assert plan.conf is not None
        return decode_csv(data, plan.columns, header=plan.conf["header"],
                          delimiter=plan.conf["delimiter"]), split
    return decode(data, plan.columns, records), split


def _parquet(plan: ArrowInput, name: str) -> Any:
    """A parquet file's columns, when each has exactly the Arrow type Spark reads as the
    declared type (timestamps: with a UTC zone, in ms or us); else `ArrowRefused` (Spark reads
    the file: another type, a missing column Spark fills with nulls, a name that only
    matches case-insensitively, a timestamp without zone or in ns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(name)
    except (pa.ArrowException, OSError) as exc:  # (damaged: Spark's reader decides)
        msg = f"Arrow cannot read the file's footer: {str(exc)[:200]}"
        raise ArrowRefused(msg) from exc
    for column, kind in plan.columns:
        if column not in schema.names:
            msg = f"column {column!r} is not in the file"
            raise ArrowRefused(msg)
        found = schema.field(column).type
        wanted = arrow_type(kind)
        if kind == "timestamp":
            ok = pa.types.is_timestamp(found) and found.unit in ("ms", "us") and \
                found.tz in ("UTC", "+00:00", "Etc/UTC")
        else:
            ok = found == wanted or (kind == "string" and found == pa.large_string())
        if not ok:
            msg = f"column {column!r} is {found} in the file"
            raise ArrowRefused(msg)
    try:
        table = pq.read_table(name, columns=[c for c, _ in plan.columns])
    except (pa.ArrowException, OSError) as exc:
        msg = f"Arrow cannot read the file: {str(exc)[:200]}"
        raise ArrowRefused(msg) from exc
    return pa.table([table.column(c).cast(arrow_type(k)) for c, k in plan.columns],
                    names=[c for c, _ in plan.columns])


def _read(plan: ArrowInput, unit: Any) -> tuple[bytes, int | None, str]:
    """(The unit's JSON or CSV text, its number of records when each is one value (Kafka), its
    split's name); `ArrowRefused` for a unit the tasks cannot read as Spark would."""
    if plan.kind in ("files", "csv"):
        from streamer.connectors.files.files_source import SPLIT  # (one split: the files)

        if os.path.getsize(unit) > MAX_FILE_BYTES:
            msg = f"the file is over {MAX_FILE_BYTES >> 20} MiB, more than a task holds"
            raise ArrowRefused(msg)
        with open(unit, "rb") as f:
            return f.read(), None, SPLIT
    from streamer.connectors.kafka.kafka_source import read_range, split_name

    topic, partition, start, end = unit
    assert plan.conf is not None
    values: list[bytes | None] = []
    for batch in read_range(dict(plan.conf), topic, partition, start, end):
        values += batch.column(1).to_pylist()
    return kafka_text(values), len(values), split_name(topic, partition)


def kafka_text(values: list[bytes | None]) -> bytes:
    """Kafka values as the JSON-lines text `arrow_json.decode` reads, one line each;
    `ArrowRefused` for a null value (a tombstone: a bad record to Spark) or one that holds a
    line break (Spark decodes each value alone)."""
    if any(v is None for v in values):
        msg = "a value is null (a tombstone: a bad record to Spark)"
        raise ArrowRefused(msg)
    data = b"\n".join(v for v in values if v is not None)
    if data.count(b"\n") != max(len(values) - 1, 0) or b"\r" in data:
        msg = "a value holds a line break"
        raise ArrowRefused(msg)
    return data
