"""The datagen source against a real local Spark: determinism, admission and schema."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from streamer.connectors.base import DEFAULT_LOCAL_ROWS, ConnectorContext
from streamer.connectors.builtin.datagen import DEFAULT_MAX_RECORDS_PER_EPOCH, DatagenSource
from streamer.connectors.exceptions import ConnectorError
from streamer.pipeline.validate import load_pipeline_text

FIELDS = {
    "user": "concat('u', offset % 3)",
    "ts": "timestamp_millis(1700000000000 + offset * 10)",
    "s": "split",
    "o": "offset",
}


@pytest.fixture
def make(spark: Any) -> Any:
    """A factory of datagen sources from their options."""

    def build(*, local_rows: int = DEFAULT_LOCAL_ROWS, **options: Any) -> DatagenSource:
        source = {"id": "gen", "type": "datagen", "fields": FIELDS, **options}
        text = yaml.safe_dump({"name": "t", "sources": [source],
                               "sinks": [{"id": "out", "type": "console", "input": "gen"}]},
                              sort_keys=False)
        spec = load_pipeline_text(text).sources[0]
        return DatagenSource(spec, ConnectorContext(spark, "t", local_rows=local_rows))

    return build


def rows(source: DatagenSource, offsets: dict[str, Any], now_ms: int = 0) -> list[tuple]:
    piece = source.plan(offsets, now_ms)
    assert piece is not None
    df = source.read(piece).records
    return sorted((r.s, r.o, r.user) for r in df.collect())


def test_schema_comes_from_the_field_expressions(make: Any) -> None:
    schema = make(limit=1).schema()
    assert [(f.name, f.dataType.simpleString()) for f in schema.fields] == [
        ("user", "string"), ("ts", "timestamp"), ("s", "int"), ("o", "bigint")]


def test_rows_are_a_function_of_split_and_offset(make: Any) -> None:
    source = make(splits=3, limit=4)
    first = rows(source, source.initial_offsets())
    assert first == [(s, o, f"u{o % 3}") for s in range(3) for o in range(4)]
    assert rows(source, source.initial_offsets()) == first  # same offsets, same rows
    assert rows(make(splits=3, limit=4), {"0": 0, "1": 0, "2": 0}) == first


@pytest.mark.parametrize("event_time", [None, "ts"])
def test_one_partition_per_split_and_columns_in_field_order(make: Any, event_time) -> None:
    # local_rows=0: a spark.range, not an inline table
    source = make(splits=3, limit=2, local_rows=0,
                  **({"event_time": event_time} if event_time else {}))
    read = source.read(source.plan(source.initial_offsets(), 0))
    df = read.records
    if source.spec.event_time:  # per-split watermarks and where a bad event time was;
        assert read.split_column == "__split"  # the runtime drops the columns
        assert read.position == ("__split", "__offset")
        assert df.columns == ["user", "ts", "s", "o", "__split", "__offset"]
        assert {r["__split"]: r["s"] for r in df.collect()} == {"0": 0, "1": 1, "2": 2}
    else:
        assert read.split_column is None
        assert df.columns == ["user", "ts", "s", "o"]
    assert df.rdd.getNumPartitions() == 3
    per_partition = df.rdd.glom().map(lambda part: sorted({r.s for r in part})).collect()
    assert per_partition == [[0], [1], [2]]


@pytest.mark.parametrize("rate", [None, 1000.0])
def test_a_small_slice_is_an_inline_table_with_the_range_s_rows(make: Any, rate) -> None:
    from streamer.runtime.plan.local import is_local

    extra = {"rows_per_second": rate} if rate else {}
    source = make(splits=3, limit=50, event_time="ts", **extra)
    piece = source.plan({"0": 5, "1": 9, "2": 7}, 0)  # splits restored at different offsets
    if rate:
        piece = source.plan({"0": 5, "1": 9, "2": 7}, 30)  # 30 ms: 30 rows, 10 per split
    assert piece is not None
    local = source.read(piece)
    source.ctx.local_rows = 0
    ranged = source.read(piece)
    assert local.local and local.local_rows == piece.expected_records
    assert not ranged.local and ranged.local_rows is None
    assert is_local(local.records) and not is_local(ranged.records)
    assert local.records.schema.simpleString() == ranged.records.schema.simpleString()
    assert sorted(local.records.collect()) == sorted(ranged.records.collect())
    assert len(local.records.collect()) == piece.expected_records


def test_limit_bounds_the_source_and_plan_ends_with_none(make: Any) -> None:
    source = make(splits=2, limit=5, max_records_per_epoch=6)
    assert source.bounded
    offsets = source.initial_offsets()
    sizes = []
    while (piece := source.plan(offsets, 0)) is not None:
        sizes.append(piece.expected_records)
        assert source.read(piece).records.count() == piece.expected_records
        offsets = dict(piece.end)
    assert sizes == [6, 4]
    assert offsets == {"0": 5, "1": 5}
    assert source.exhausted(offsets)
    assert not source.exhausted({"0": 5, "1": 4})


def test_max_records_per_epoch_is_split_evenly(make: Any) -> None:
    piece = make(splits=3, max_records_per_epoch=10).plan({"0": 7, "1": 7, "2": 7}, 0)
    assert piece is not None
    assert piece.end == {"0": 10, "1": 10, "2": 10}
    assert piece.expected_records == 9


def test_unbounded_without_rate_uses_the_default_cap(make: Any) -> None:
    source = make(splits=2)
    assert not source.bounded
    piece = source.plan(source.initial_offsets(), 0)
    assert piece is not None
    assert piece.expected_records == DEFAULT_MAX_RECORDS_PER_EPOCH
    assert source.lag(piece.end, 0) is None
    assert source.split_lag(piece.end, 0) is None
    assert not source.exhausted(piece.end)


def test_rate_admits_rows_as_time_passes(make: Any) -> None:
    source = make(splits=2, rows_per_second=100)
    start = {"0": 0, "1": 0}
    assert source.plan(start, 10_000) is None  # the first plan only starts the clock
    assert source.lag(start, 10_500) == 50
    assert source.split_lag(start, 10_500) == {"0": 25, "1": 25}
    piece = source.plan(start, 10_500)
    assert piece is not None
    assert piece.end == {"0": 25, "1": 25}
    assert source.lag(piece.end, 10_500) == 0
    assert source.plan(piece.end, 10_500) is None
    later = source.plan(piece.end, 11_000)
    assert later is not None and later.end == {"0": 50, "1": 50}


def test_rate_continues_from_restored_offsets(make: Any) -> None:
    restored = {"0": 500, "1": 500}
    source = make(splits=2, rows_per_second=10, limit=503)
    assert source.plan(restored, 1_000_000) is None  # no burst for the time the job was down
    piece = source.plan(restored, 1_000_400)
    assert piece is not None and piece.end == {"0": 502, "1": 502}
    # The limit caps what the rate admits.
    assert source.lag(piece.end, 1_010_000) == 2
    assert source.split_lag(piece.end, 1_010_000) == {"0": 1, "1": 1}


def test_rate_and_cap_together(make: Any) -> None:
    source = make(rows_per_second=1000, max_records_per_epoch=100)
    source.plan({"0": 0}, 0)
    piece = source.plan({"0": 0}, 1000)
    assert piece is not None and piece.end == {"0": 100}
    assert source.lag(piece.end, 1000) == 900


def test_splits_restored_at_different_offsets_read_exactly_their_rows(make: Any) -> None:
    source = make(splits=3, limit=5)
    got = rows(source, {"0": 1, "1": 3, "2": 5})
    assert got == [(0, o, f"u{o % 3}") for o in range(1, 5)] + [(1, 3, "u0"), (1, 4, "u1")]


def test_zero_limit_is_exhausted_at_once(make: Any) -> None:
    source = make(limit=0)
    assert source.plan(source.initial_offsets(), 0) is None
    assert source.exhausted(source.initial_offsets())


def test_bad_expression_names_the_source_and_field(make: Any) -> None:
    source = make(limit=1, fields={"ok": "offset", "bad": "no_such_fn(offset)"})
    with pytest.raises(ConnectorError) as err:
        source.schema()
    message = str(err.value)
    assert "'bad'" in message and "'gen'" in message
    assert "no_such_fn" in message
    assert "\n" not in message


def test_non_positive_rate_is_rejected_when_built_from_python(make: Any) -> None:
    spec = make(limit=1).spec  # the YAML validator rejects it too; specs built in code may not
    bad = dataclasses.replace(spec, options={**spec.options, "rows_per_second": 0})
    with pytest.raises(ConnectorError, match="rows_per_second"):
        DatagenSource(bad, make(limit=1).ctx)


def _generated(source: DatagenSource, offsets: dict[str, Any], now_ms: int) -> dict[tuple, int]:
    piece = source.plan(offsets, now_ms)
    assert piece is not None
    df = source.read(piece).records
    return {(r.s, r.o): r.g for r in df.collect()}


def test_generated_at_is_when_the_rate_admitted_the_row(make: Any) -> None:
    # 4 rows/s over 2 splits: each split gets a row every 500 ms after the first plan.
    source = make(splits=2, rows_per_second=4, fields={**FIELDS, "g": "unix_millis(generated_at)"})
    assert source.plan({"0": 0, "1": 0}, 10_000) is None  # the rate's origin: nothing yet
    got = _generated(source, {"0": 0, "1": 0}, 11_600)  # 1.6 s later: 3 rows per split
    assert got == {(s, o): 10_000 + 500 * (o + 1) for s in (0, 1) for o in range(3)}
    # Restored splits at different offsets: each row keeps the time it was admitted at.
    source = make(splits=2, rows_per_second=4, fields={**FIELDS, "g": "unix_millis(generated_at)"})
    assert source.plan({"0": 5, "1": 7}, 0) is None
    got = _generated(source, {"0": 5, "1": 7}, 1_000)
    assert got == {(0, 5): 500, (0, 6): 1_000, (1, 7): 500, (1, 8): 1_000}


def test_generated_at_without_a_rate_is_the_planning_time(make: Any) -> None:
    source = make(splits=2, limit=3, fields={**FIELDS, "g": "unix_millis(generated_at)"})
    got = _generated(source, source.initial_offsets(), 1_234_567)
    assert set(got.values()) == {1_234_567} and len(got) == 6
