"""The aggregate-call grammar: `count(distinct x[, y])` and Flink SQL's `filter (where ...)`
(Nexmark Q15-Q17), parsed into the spec, and its misuses reported at `file:line:col`."""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamer.pipeline.aggregate_calls import AggregateCall, parse_call
from streamer.pipeline.exceptions import PipelineError
from streamer.pipeline.validate import load_pipeline_text


@pytest.mark.parametrize(("text", "call"), [
    ("count()", AggregateCall("count", None)),
    ("count(*)", AggregateCall("count", None)),
    ("count(distinct bidder)", AggregateCall("count", "bidder", True)),
    ("COUNT(DISTINCT bidder, auction)", AggregateCall("count", "bidder, auction", True)),
    ("count(*) filter (where price < 10000)",
     AggregateCall("count", None, False, "price < 10000")),
    ("sum(price) FILTER (WHERE price >= 10000 and price < 1000000)",
     AggregateCall("sum", "price", False, "price >= 10000 and price < 1000000")),
    ("count(distinct bidder) filter (where f(a, b) in (1, 2))",
     AggregateCall("count", "bidder", True, "f(a, b) in (1, 2)")),
    ("count_distinct(x) filter (where s = ')')",
     AggregateCall("count_distinct", "x", False, "s = ')'")),
    ("count(distinctive)", AggregateCall("count", "distinctive")),
])
def test_calls_parse(text: str, call: AggregateCall) -> None:
    assert parse_call(text) == call


@pytest.mark.parametrize("text", [
    "max(x) - min(x)", "sum(x) filter where x > 1", "sum(x) filter (where )",
    "sum(x) filter (where x > 1) + 1", "sum(x) over (partition by y)", "sum(x",
])
def test_what_is_not_one_call_with_a_filter_does_not_parse(text: str) -> None:
    assert parse_call(text) is None


def test_distinct_and_filter_reach_the_spec() -> None:
    spec = load_pipeline_text(textwrap.dedent(pipeline(
        'a: "count(distinct bidder)", b: "count(*) filter (where price < 10)", '
        'c: "count(distinct bidder, auction) filter (where price > 5)"')), env={})
    aggs = {a.name: (a.function, a.arg, a.filter) for a in spec.operators[0].aggregates}
    assert aggs == {"a": ("count_distinct", "bidder", None),
                    "b": ("count", None, "price < 10"),
                    "c": ("count_distinct", "bidder, auction", "price > 5")}


def pipeline(aggregates: str, window: str = "") -> str:
    return f"""\
        name: p
        sources:
          - id: bids
            type: datagen
            fields: {{auction: offset % 5, bidder: offset % 7, price: offset, tags: "map('a', 1)",
                     ts: "timestamp_millis(offset)"}}
            event_time: ts
        operators:
          - id: agg
            input: bids
            key_by: [auction]{window}
            aggregate: {{{aggregates}}}
        sinks:
          - {{id: out, type: console, input: agg}}
        """


def problems_of(text: str) -> list[str]:
    with pytest.raises(PipelineError) as info:
        load_pipeline_text(textwrap.dedent(text), file="p.yaml", env={})
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize(("aggregates", "problem"), [
    ('a: "sum(distinct price)"', "p.yaml:12:20: sum(distinct ...) is not supported; only "
     "count(distinct x) counts distinct values"),
    ('a: "count(distinct)"', "p.yaml:12:20: count(distinct ...) needs one or more columns or "
     "expressions, e.g. count(distinct bidder)"),
    ('a: "count(distinct bidder, )"', "p.yaml:12:20: count(distinct ...) needs one or more "
     "columns or expressions, e.g. count(distinct bidder)"),
    ('a: "count(*) filter where price > 1"', "p.yaml:12:20: aggregate 'count(*) filter where "
     "price > 1' must be a call such as count() or sum(x), optionally followed by filter "
     "(where <condition>)"),
    ('a: "count(bidder)"', "p.yaml:12:20: count() takes no argument; use count(distinct "
     "bidder) to count distinct values"),
])
def test_misuses_are_reported_at_the_aggregate(aggregates: str, problem: str) -> None:
    assert problems_of(pipeline(aggregates)) == [problem]


def test_a_distinct_count_over_updates_is_refused_with_the_fix() -> None:
    text = pipeline("top: max(price)").replace("""\
        sinks:""", """\
          - id: per_top
            input: agg
            key_by: [top]
            aggregate: {n: count(), bidders: "count(distinct auction) filter (where top > 1)"}
        sinks:""").replace("input: agg}", "input: per_top}")
    assert problems_of(text) == [
        "p.yaml:16:38: operator 'per_top' reads the updates of 'agg', a rolling aggregate "
        "(it emits each key's new value after every epoch); its aggregate 'bidders' = "
        "count(distinct ...) cannot take an old value back when a key's value changes (it keeps "
        "each distinct value once, not how many rows have it); use count(), sum(), avg() "
        "over updates, or key and window the records before 'agg'"]


@pytest.mark.spark
def test_the_analyzer_checks_filters_and_distinct_arguments(spark) -> None:
    from streamer.runtime.job.checks import analyze_spec

    spec = load_pipeline_text(textwrap.dedent(pipeline(
        'a: "count(*) filter (where price)", b: "sum(price) filter (where nope > 1)", '
        'c: "count(distinct tags)", d: "count(distinct bidder, tags) filter (where price > 1)", '
        'ok: "count(distinct bidder, price) filter (where price > 1)"')), file="p.yaml", env={})
    with pytest.raises(PipelineError) as info:
        analyze_spec(spec, spark)
    problems = [str(p) for p in info.value.problems]
    assert problems[0] == (
        "p.yaml:12:20: the filter of aggregate 'a' of operator 'agg' must be a condition (true "
        "or false), but 'price' is bigint; compare it, e.g. filter (where price > 0)")
    assert problems[1].startswith("p.yaml:12:56: the filter of aggregate 'b' of operator "
                                  "'agg': ") and "nope" in problems[1]
    assert problems[2:] == [
        "p.yaml:12:97: aggregate 'c' of operator 'agg': count(distinct ...) cannot compare "
        "values of type map<string,int>; count(distinct to_json(tags))",
        "p.yaml:12:124: aggregate 'd' of operator 'agg': count(distinct ...) cannot compare "
        "values of type map<string,int>; count(distinct to_json(tags))"]


@pytest.mark.spark
def test_session_windows_refuse_a_distinct_count_of_several_columns(spark) -> None:
    from streamer.runtime.job.checks import analyze_spec

    spec = load_pipeline_text(textwrap.dedent(pipeline(
        'n: "count(distinct bidder, price)", ok: "count(distinct bidder)"',
        "\n            window: {session: {gap: 5s}}")), file="p.yaml", env={})
    with pytest.raises(PipelineError) as info:
        analyze_spec(spec, spark)
    assert [str(p) for p in info.value.problems] == [
        "p.yaml:13:20: aggregate 'n' of operator 'agg': count(distinct) of several columns is "
        "not supported in session windows yet; count one column, e.g. count(distinct "
        "concat_ws('|', bidder, price))"]


_EXPR = st.sampled_from(["x", "f(a, b)", "price * 2", "'a,)'", "cast(y as double)", "`odd col`"])


@given(function=st.sampled_from(["count", "sum", "max_by", "count_distinct"]),
       args=st.lists(_EXPR, max_size=3), distinct=st.booleans(),
       condition=st.none() | st.sampled_from(["p < 10", "s = ')'", "g(a, (b)) and c"]),
       upper=st.booleans())
def test_a_written_call_parses_back(function: str, args: list[str], distinct: bool,
                                    condition: str | None, upper: bool) -> None:
    arg = ", ".join(args) or None
    words = ("DISTINCT ", " FILTER (WHERE ") if upper else ("distinct ", " filter (where ")
    text = f"{function}({words[0] if distinct and arg else ''}{arg or ''})"
    if condition is not None:
        text += f"{words[1]}{condition})"
    assert parse_call(text) == AggregateCall(function, arg, distinct and arg is not None,
                                             condition)
