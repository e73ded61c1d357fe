"""A keyed stage's JSON-lines input decoded, filtered and derived in Python tasks with Arrow
(`job.execution.arrow_input`), where that is certainly what Spark would compute.

The staged-input strategy (`runtime.stages.keyed.StagedRun`) has Spark decode a source's
text, apply the stateless operators before the keyed stage and write the result as local
parquet files for the subtasks. For a local JSON-lines `files` source whose columns and
operators Arrow computes as Spark does (`connectors.arrow_json`, `operators.arrow_sql`),
one Spark job of Python tasks does that instead, a file per task: decode, event time,
operators, and the stage's columns written as a parquet file. A file where any step is not
certain (a line Spark could read otherwise or call a bad record, an overflow, a NaN met by a
comparison) is refused whole, and Spark reads, checks and computes it as before in the same
epoch: dead letters, errors and results are Spark's either way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from streamer.columns import EVENT_TIME
from streamer.connectors.arrow_json import TYPES
from streamer.operators.arrow_sql import Program, compile_ops

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamer.pipeline.graph import Dataflow
    from streamer.runtime.keyed import DirectShape


#: A bigger file is left to Spark, which reads it in splits: a task reads a file whole.
MAX_FILE_BYTES = 512 << 20


@dataclass(frozen=True)
class ArrowInput:
    """How the tasks compute a keyed stage's input from its source's files."""

    source_id: str
    #: The stateless operators between the source and the keyed stage, in order.
    op_ids: tuple[str, ...]
    #: The source's columns (name, Spark type), as decoded.
    columns: tuple[tuple[str, str], ...]
    #: The source's event-time column (a timestamp column), or None.
    ts_column: str | None
    program: Program
    #: The columns the subtasks read (`DirectShape.columns`: name, Arrow type).
    out: tuple[tuple[str, Any], ...]


def plan_arrow_input(spark: SparkSession, flow: Dataflow, node_id: str, sources: Mapping[str, Any],
                     schemas: Mapping[str, Any], shape: DirectShape) -> ArrowInput | str:
    """Whether the keyed stage `node_id`'s input can be computed by Arrow tasks, or why not:
    its input is a chain of filter, select and with_columns operators (or none) read only by
    the next, starting at a local JSON-lines `files` source only that chain reads; the
    source's columns are bigint, int, double, string, boolean or timestamp; its event time,
    if any, is a timestamp column; Spark's session time zone is UTC; and `operators.arrow_sql`
    translates the operators."""
    from pyspark.sql.types import StructField, StructType, TimestampType

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
    spec = source.spec
    if len(flow.consumers(current)) != 1:
        return f"source {current!r} has other readers"
    if spec.type != "files" or getattr(source, "format", None) != "jsonl" or not getattr(
            source, "local", False) or spec.option("reload"):
        return f"source {current!r} is not local JSON-lines files"
    schema = schemas[current]
    columns = tuple((f.name, f.dataType.simpleString()) for f in schema.fields)
    for name, kind in columns:
        if kind not in TYPES:
            return f"column {name!r} of source {current!r} has type {kind}"
    ts_column = None
    if spec.event_time:
        ts_column = spec.event_time.strip().strip("`")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ts_column) or \
                dict(columns).get(ts_column) != "timestamp":
            return "the source's event time is not a timestamp column"
        schema = StructType([*schema.fields, StructField(EVENT_TIME, TimestampType())])
    zone = (spark.conf.get("spark.sql.session.timeZone", "UTC") or "").strip()
    if zone not in ("UTC", "Etc/UTC", "Z", "+00:00"):
        return f"Spark's session time zone is {zone}, not UTC"
    program = compile_ops(spark, schema, chain)
    if isinstance(program, str):
        return program
    return ArrowInput(current, tuple(op.id for op in chain), columns, ts_column, program,
                      tuple(shape.columns))


def decode_files(spark: SparkSession, plan: ArrowInput, files: list[str],
                 target: str) -> list[dict[str, Any]]:
    """One Spark job, a Python task per file: each file's result, `{"file", "path"` (the
    parquet file written into directory `target`), `"rows_in"`, `"max_ts"` (epoch ms or
    None), `"filters"` (op id -> [in, out])`}` or `{"file", "refused": why}`."""
    import os
    import shutil

    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    clear_other_epochs(os.path.dirname(target), os.path.basename(target))
    work = list(enumerate(files))
    rdd = spark.sparkContext.parallelize(work, len(work))
    return rdd.map(partial(_decode_one, plan, target)).collect()


def clear_other_epochs(root: str, keep: str) -> None:
    """Remove the staged directories under `root` other than this epoch's (`keep` is one of
    them, `epoch-<n>` or `epoch-<n>-arrow`): the epochs that already ended read theirs."""
    import os
    import shutil

    epoch = keep.removesuffix("-arrow")
    for name in os.listdir(root):
        if name not in (epoch, f"{epoch}-arrow"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _decode_one(plan: ArrowInput, target: str, item: tuple[int, str]) -> dict[str, Any]:
    """A task: one file decoded, its event time taken, the operators run, the stage's
    columns written (see `decode_files`)."""
    import os

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from streamer.connectors.arrow_json import Refused as Undecodable
    from streamer.connectors.arrow_json import decode
    from streamer.operators.arrow_sql import Refused

    index, name = item
    try:
        if os.path.getsize(name) > MAX_FILE_BYTES:
            msg = f"the file is over {MAX_FILE_BYTES >> 20} MiB, more than a task holds"
            raise Undecodable(msg)
        with open(name, "rb") as f:
            table = decode(f.read(), plan.columns)
        max_ts = None
        if plan.ts_column is not None:
            ts = table.column(plan.ts_column)
            if ts.null_count:
                msg = "a record without event time (a bad record to Spark)"
                raise Undecodable(msg)
            table = table.append_column(EVENT_TIME, ts)
            if table.num_rows:
                max_ts = pc.max(ts).cast(pa.int64()).as_py() // 1000
        rows_in = table.num_rows
        table, filters = plan.program.run(table)
    except (Undecodable, Refused) as exc:
        return {"file": name, "refused": str(exc)}
    out = pa.table([table.column(n).cast(t) for n, t in plan.out], names=[n for n, _ in plan.out])
    path = f"{target}/part-{index:05d}.parquet"
    pq.write_table(out, path, compression="none")
    return {"file": name, "path": path, "rows_in": rows_in, "max_ts": max_ts,
            "filters": {k: list(v) for k, v in filters.items()}}
