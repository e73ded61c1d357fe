"""Key groups: Flink's assignment rule and its inverse agree exactly, for every parallelism."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.state.exceptions import KeyGroupError
from streamer.state.keygroups import (
    UPPER_BOUND_MAX_PARALLELISM,
    assign_subtask,
    check_parallelism,
    key_group_range,
    key_group_sql,
    subtask_sql,
)


@st.composite
def parallelisms(draw: st.DrawFn) -> tuple[int, int]:
    """(parallelism, max_parallelism) with 1 <= p <= max_p <= 32768, often at the edges."""
    edges = [1, 2, 127, 128, 129, 1000, UPPER_BOUND_MAX_PARALLELISM]
    max_p = draw(st.one_of(st.integers(1, UPPER_BOUND_MAX_PARALLELISM), st.sampled_from(edges)))
    p = draw(st.one_of(st.integers(1, max_p), st.sampled_from([1, max_p, max(1, max_p - 1)])))
    return p, max_p


@settings(max_examples=300, deadline=None)
@given(parallelisms(), st.data())
def test_key_group_range_is_the_inverse_of_assign_subtask(
        pm: tuple[int, int], data: st.DataObject) -> None:
    p, max_p = pm
    kg = data.draw(st.integers(0, max_p - 1), label="key_group")
    owner = assign_subtask(kg, p, max_p)
    assert 0 <= owner < p
    assert kg in key_group_range(owner, p, max_p)
    subtask = data.draw(st.integers(0, p - 1), label="subtask")
    groups = key_group_range(subtask, p, max_p)
    assert len(groups) >= 1
    for edge in {groups.start, groups.stop - 1}:
        assert assign_subtask(edge, p, max_p) == subtask
    if groups.start > 0:
        assert assign_subtask(groups.start - 1, p, max_p) == subtask - 1
    if groups.stop < max_p:
        assert assign_subtask(groups.stop, p, max_p) == subtask + 1


@settings(max_examples=60, deadline=None)
@given(parallelisms())
def test_the_ranges_of_all_subtasks_partition_the_key_groups(pm: tuple[int, int]) -> None:
    p, max_p = pm
    ranges = [key_group_range(s, p, max_p) for s in range(p)]
    assert ranges[0].start == 0
    assert ranges[-1].stop == max_p
    assert all(a.stop == b.start for a, b in itertools.pairwise(ranges))
    sizes = {len(r) for r in ranges}
    assert max(sizes) - min(sizes) <= 1  # balanced


def test_exhaustively_for_small_max_parallelism() -> None:
    for max_p in range(1, 65):
        for p in range(1, max_p + 1):
            owners = [assign_subtask(kg, p, max_p) for kg in range(max_p)]
            for s in range(p):
                assert list(key_group_range(s, p, max_p)) == \
                    [kg for kg, o in enumerate(owners) if o == s]


def test_flink_reference_values() -> None:
    # KeyGroupRangeAssignment for maxParallelism 128, parallelism 3: [0,42], [43,85], [86,127]
    assert [key_group_range(s, 3, 128) for s in range(3)] == \
        [range(0, 43), range(43, 86), range(86, 128)]
    assert assign_subtask(42, 3, 128) == 0
    assert assign_subtask(43, 3, 128) == 1


@pytest.mark.parametrize(("p", "max_p"), [(0, 128), (129, 128), (1, 0), (1, 32769), (-1, 4)])
def test_invalid_parallelism_is_refused(p: int, max_p: int) -> None:
    with pytest.raises(KeyGroupError, match="out of range"):
        check_parallelism(p, max_p)


def test_out_of_range_key_groups_and_subtasks_are_refused() -> None:
    with pytest.raises(KeyGroupError):
        assign_subtask(128, 2, 128)
    with pytest.raises(KeyGroupError):
        key_group_range(2, 2, 128)


def test_sql_expressions() -> None:
    assert key_group_sql(["user"], 128) == "CAST(pmod(xxhash64(`user`), 128) AS INT)"
    assert key_group_sql(["a", "we`ird"], 4) == "CAST(pmod(xxhash64(`a`, `we``ird`), 4) AS INT)"
    assert subtask_sql("kg", 3, 128) == "CAST((kg) * 3 DIV 128 AS INT)"
    with pytest.raises(KeyGroupError):
        key_group_sql([], 128)


#: pmod(xxhash64(user), 32768) of 'alice', 'bob', 'carol', as computed by Spark 4.3 (seed 42).
PINNED_KG_BIG = [13459, 1291, 7390]


@pytest.mark.spark
def test_spark_computes_the_same_key_groups_everywhere(spark: object) -> None:
    """The key group expression runs in Spark and agrees with assign_subtask; the pinned values
    guard against a change of Spark's hash (which would silently re-shuffle restored state).
    """
    from pyspark.sql import SparkSession

    assert isinstance(spark, SparkSession)
    df = spark.createDataFrame([("alice", 1), ("bob", 2), ("carol", None)], "user string, n int")
    rows = df.selectExpr(f"{key_group_sql(['user', 'n'], 128)} AS kg",
                         f"{subtask_sql(key_group_sql(['user', 'n'], 128), 3, 128)} AS st",
                         f"{key_group_sql(['user'], 32768)} AS kg_big").collect()
    for row in rows:
        assert 0 <= row.kg < 128
        assert row.st == assign_subtask(row.kg, 3, 128)
    assert [r.kg_big for r in rows] == PINNED_KG_BIG
