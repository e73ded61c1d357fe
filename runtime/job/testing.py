"""`streamer test`: run a pipeline's `tests:` cases bounded, with inline rows in place of the
named sources and in-memory sinks, and compare each expected sink's rows (order-insensitive).

Inline rows go through the same JSON decoding as a `jsonl` files source, so a row that does not
fit the source's schema reaches the source's `on_error` sink exactly as it would in production.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import ConnectorContext, Sink, Source, SourceRead, SourceSlice
from streamer.connectors.formats import json_value
from streamer.exceptions import StreamerError
from streamer.pipeline.spec import PipelineSpec, SinkSpec, SourceSpec, TestCase
from streamer.runtime.job.coordinator import JobRunner, RunOptions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType


def canonical(value: Any) -> Any:
    """A comparable form: numbers equal when numerically equal (to 9 significant digits),
    timestamps as ISO UTC strings, mappings with sorted keys.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float | Decimal):
        number = float(value)
        if math.isfinite(number) and number == int(number) and abs(number) < 2**53:
            return int(number)
        return float(f"{number:.9g}")
    if isinstance(value, dt.datetime | dt.date):
        return json_value(value)
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return str(value)


def _key(row: Mapping[str, Any]) -> str:
    return json.dumps(canonical(dict(row)), sort_keys=True)


class InlineSource(Source):
    """A bounded source of the rows written in a test case, decoded with the real source's
    schema (one epoch, one split named `inline`).
    """

    def __init__(self, spec: SourceSpec, ctx: ConnectorContext, rows: list[dict[str, Any]],
                 schema: StructType) -> None:
        super().__init__(spec, ctx)
        self.rows = [json.dumps(json_value(r)) for r in rows]
        self._schema = schema

    @property
    def bounded(self) -> bool:
        """Always bounded."""
        return True

    def schema(self) -> StructType:
        """The schema of the source this replaces."""
        return self._schema

    def initial_offsets(self) -> dict[str, Any]:
        """Nothing read yet."""
        return {"inline": 0}

    def plan(self, offsets: Mapping[str, Any], now_ms: int) -> SourceSlice | None:
        """All rows in one slice."""
        if offsets["inline"] >= len(self.rows):
            return None
        return SourceSlice(self.spec.id, dict(offsets), {"inline": len(self.rows)},
                           expected_records=len(self.rows) - offsets["inline"])

    def read(self, piece: SourceSlice) -> SourceRead:
        """Decode the slice's rows as JSON lines."""
        from streamer.connectors.formats import decode_json_lines

        start, end = piece.start["inline"], piece.end["inline"]
        data = [(self.rows[i], "inline", str(i)) for i in range(start, end)]
        df = self.ctx.spark.createDataFrame(data, "value string, split string, offset string")
        read = decode_json_lines(self.ctx.spark, df, self._schema, self.spec)
        if read.dead_letters is not None:  # the field that failed, as a file source says
            from streamer.connectors.dead_letters import explain

            read.dead_letters = explain(read.dead_letters, self._schema, "json", lines=False)
        return read

    def exhausted(self, offsets: Mapping[str, Any]) -> bool:
        """True once the rows were read."""
        return bool(offsets["inline"] >= len(self.rows))


@dataclass
class CaseResult:
    """The outcome of one test case."""

    name: str
    missing: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    unexpected: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    actual: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """True when every expected sink got exactly the expected rows."""
        return not any(self.missing.values()) and not any(self.unexpected.values())


def compare_rows(expected: list[dict[str, Any]], actual: list[dict[str, Any]]
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows expected but missing, rows produced but not expected), as multisets."""
    want = Counter(_key(r) for r in expected)
    got = Counter(_key(r) for r in actual)
    missing = [json.loads(k) for k in (want - got).elements()]
    unexpected = [json.loads(k) for k in (got - want).elements()]
    return missing, unexpected


def run_case(spec: PipelineSpec, case: TestCase, spark: SparkSession) -> CaseResult:
    """Run one test case bounded with inline inputs and in-memory sinks; compare."""
    from streamer.connectors.builtin.memory_sink import MemorySink
    from streamer.connectors.registry import make_source

    memory: dict[str, MemorySink] = {}

    def source_factory(s: SourceSpec, ctx: ConnectorContext) -> Source:
        rows = list(case.inputs.get(s.id, []))
        try:
            schema = make_source(s, ctx).schema()
        except StreamerError:
            if not rows or s.schema:
                raise
            schema = spark.read.json(spark.sparkContext.parallelize(
                [json.dumps(json_value(r)) for r in rows])).schema
        return InlineSource(s, ctx, rows, schema)

    def sink_factory(k: SinkSpec, ctx: ConnectorContext) -> Sink:
        memory[k.id] = MemorySink(k, ctx)
        return memory[k.id]

    runner = JobRunner(spec, RunOptions(ui=False, metrics=False), spark=spark,
                       source_factory=source_factory, sink_factory=sink_factory)
    runner.run()
    result = CaseResult(case.name)
    for sink_id, rows in case.expect.items():
        actual = memory[sink_id].committed
        result.actual[sink_id] = actual
        result.missing[sink_id], result.unexpected[sink_id] = compare_rows(rows, actual)
    return result
