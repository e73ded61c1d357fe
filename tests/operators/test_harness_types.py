"""The harness's output schema (`streamer.testing.harness`) is the engine's: the types
`windows.aggregate_fields` gives without a session (`arrow_typed_aggregate`) are those Spark's
analyzer gives the same aggregates, for every function and column type a direct read takes;
and what it cannot type without Spark it refuses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from streamer.operators.windows import aggregate_fields
from streamer.pipeline.spec import AggregateSpec

pytestmark = pytest.mark.spark

TYPES = ("tinyint", "smallint", "int", "bigint", "float", "double", "timestamp")


def test_aggregates_are_typed_without_a_session_as_spark_types_them(spark) -> None:
    from pyspark.sql import types as T

    by_name = {"tinyint": T.ByteType(), "smallint": T.ShortType(), "int": T.IntegerType(),
               "bigint": T.LongType(), "float": T.FloatType(), "double": T.DoubleType(),
               "timestamp": T.TimestampType()}
    schema = T.StructType([T.StructField(f"c_{n}", t) for n, t in by_name.items()])
    aggs = [AggregateSpec("n", "count", None)]
    for name in TYPES:
        functions = ("min", "max") if name == "timestamp" else ("sum", "min", "max", "avg")
        aggs += [AggregateSpec(f"{fn}_{name}", fn, f"c_{name}") for fn in functions]
    op = SimpleNamespace(aggregates=tuple(aggs))
    without = aggregate_fields(None, op, schema)
    assert [f.name for f in without] == [a.name for a in aggs]
    assert without == aggregate_fields(spark, op, schema)


@pytest.mark.parametrize("agg", [AggregateSpec("f", "first", "v"),
                                 AggregateSpec("s", "sum", "v", filter="v > 0"),
                                 AggregateSpec("s", "sum", "text")])
def test_what_only_spark_types_is_refused(agg) -> None:
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField("v", T.LongType()),
                           T.StructField("text", T.StringType())])
    with pytest.raises(ValueError, match="Spark's analyzer"):
        aggregate_fields(None, SimpleNamespace(aggregates=(agg,)), schema)
