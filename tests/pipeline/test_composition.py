"""Which keyed operators may read which (issue 40), checked without Spark: a keyed operator
refuses an update stream (a rolling aggregate's, a window's with `emit: updates`), directly
or through stateless operators, at the reader's `file:line:col` with the fix; append-only
outputs (windows, dedupe, joins) feed anything, and sinks take updates."""

from __future__ import annotations

import textwrap

import pytest

from streamer.pipeline.exceptions import PipelineError
from streamer.pipeline.validate import load_pipeline_text

HEAD = """\
name: compose
sources:
  - id: bids
    type: datagen
    limit: 10
    fields: {auction: "offset % 5", category: "offset % 2", price: "offset",
             ts: "timestamp_millis(offset)"}
    event_time: ts
operators:
"""
SINK = """\
sinks:
  - {id: out, type: console, input: %s}
"""


def load(operators: str, sink_input: str):
    return load_pipeline_text(HEAD + textwrap.dedent(operators) + SINK % sink_input,
                              file="p.yaml", env={})


def problems_of(operators: str, sink_input: str) -> list[str]:
    with pytest.raises(PipelineError) as info:
        load(operators, sink_input)
    return [str(p) for p in info.value.problems]


def test_a_rolling_aggregate_takes_updates_only_with_aggregates_that_retract() -> None:
    rolling = """\
      - id: max_price
        input: bids
        key_by: [auction, category]
        aggregate: {top: max(price)}
      - id: positive
        input: max_price
        filter: "top > 0"
      - id: per_category
        input: positive
        key_by: [category]
        aggregate: {%s}
    """
    spec = load(rolling % "avg_top: avg(top), n: count(), total: sum(top)", "per_category")
    assert spec.updates_behind("positive") == "max_price"
    assert spec.updates_behind("max_price") == "max_price"
    assert spec.updates_behind("bids") is None
    found = problems_of(rolling % "avg_top: avg(top), best: max(top)", "per_category")
    assert found == [
        "p.yaml:20:40: operator 'per_category' reads through 'positive' the updates of "
        "'max_price', a rolling aggregate (it emits each key's new value after every epoch); "
        "its aggregate 'best' = max() cannot take an old value back when a key's value "
        "changes; use count(), sum(), avg() over updates, or key and window the records "
        "before 'max_price'"]


def test_a_window_over_an_updating_window_and_a_join_of_updates_are_refused() -> None:
    found = problems_of("""\
      - id: early
        input: bids
        key_by: [auction]
        window: {tumbling: 1m, emit: updates}
        aggregate: {n: count()}
      - id: per_hour
        input: early
        key_by: [auction]
        window: {tumbling: 1h}
        aggregate: {n: sum(n)}
      - id: joined
        join: {left: bids, right: early, on: [auction], window: {tumbling: 1m}, right_prefix: e_}
    """, "[per_hour, joined]")
    assert len(found) == 2
    assert found[0] == (
        "p.yaml:16:10: operator 'per_hour' reads the updates of 'early', a window with emit: "
        "updates (it emits a window again after every change); a window would take every "
        "update as a new record (only a rolling aggregate of count, sum or avg takes "
        "retractions). Key and window the records before 'early' instead, or send 'early' "
        "to a sink")
    assert found[1].startswith("p.yaml:21:29: operator 'joined' reads the updates of 'early'")


@pytest.mark.parametrize("operators", [
    # a window over a window, a dedupe over a window, a join of a window: append-only
    """\
      - id: per_minute
        input: bids
        key_by: [auction]
        window: {tumbling: 1m}
        aggregate: {n: count()}
      - id: per_hour
        input: per_minute
        key_by: [auction]
        window: {tumbling: 1h}
        aggregate: {n: sum(n)}
      - id: last
        input: per_hour
        key_by: [auction]
        dedupe: {within: 1h}
    """,
    # a sink takes a rolling aggregate's updates, also through a stateless operator
    """\
      - id: per_minute
        input: bids
        key_by: [auction]
        aggregate: {n: count()}
      - id: last
        input: per_minute
        with_columns: {m: "n * 2"}
    """,
])
def test_append_only_outputs_feed_keyed_operators_and_sinks_take_updates(operators) -> None:
    spec = load(operators, "last")
    assert [o.id for o in spec.operators][-1] == "last"


@pytest.mark.parametrize("expression", [
    "row_number() OVER (PARTITION BY auction ORDER BY price DESC)",
    "sum(price) over w",
    "rank()over(order by price)",
])
def test_a_window_function_in_a_stateless_operator_is_refused(expression: str) -> None:
    found = problems_of(f"""\
      - id: ranked
        input: bids
        with_columns: {{rn: "{expression}"}}
    """, "ranked")
    assert found == [
        "p.yaml:12:22: operator 'ranked' uses a window function (OVER), which would see only "
        "one epoch's rows at a time; keep state across epochs with a keyed operator instead: "
        "key_by with a window and max_by/min_by for the top row per key, or dedupe for the "
        "first"]


def test_over_in_a_string_or_a_name_is_not_a_window_function() -> None:
    spec = load("""\
      - id: texts
        input: bids
        with_columns: {a: "concat('game ) over (', 'x')", rollover: "price + 1"}
    """, "texts")
    assert spec.operators[0].id == "texts"


def test_a_rolling_aggregate_over_an_updating_windows_output_is_refused() -> None:
    found = problems_of("""\
      - id: early
        input: bids
        key_by: [auction]
        window: {tumbling: 1m, emit: updates}
        aggregate: {n: count()}
      - id: total
        input: early
        key_by: [auction]
        aggregate: {n: sum(n)}
    """, "total")
    assert found == [
        "p.yaml:16:10: operator 'total' reads the updates of 'early', a window with emit: "
        "updates (it emits a window again after every change); a rolling aggregate would "
        "take every update as a new record (only a rolling aggregate of count, sum or avg takes "
        "retractions). Key and window the records before 'early' instead, or send 'early' "
        "to a sink"]


def test_key_by_nothing_is_one_key_for_every_record() -> None:
    spec = load("""\
      - id: overall
        input: bids
        key_by: []
        window: {tumbling: 1m}
        aggregate: {top: "max_by(auction, price)"}
    """, "overall")
    assert spec.operators[0].key_by == ()
