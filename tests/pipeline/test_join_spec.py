"""The `join:` operator in the pipeline file: what it builds, what validation reports (at
`file:line:col`), and how `streamer schema` and `streamer plan` show it. No Spark here (the
checks against the inputs' columns are in tests/runtime/test_join.py)."""

from __future__ import annotations

import json
import textwrap

import pytest

from streamer.pipeline.exceptions import PipelineError
from streamer.pipeline.graph import compile_dataflow
from streamer.pipeline.schema import json_schema
from streamer.pipeline.spec import JoinSpec, WindowSpec
from streamer.pipeline.validate import load_pipeline_text

BASE = textwrap.dedent("""\
    name: paid-orders
    sources:
      - id: orders
        type: files
        path: /data/orders/*.jsonl
        format: jsonl
        schema: {order_id: string, amount: double, ts: timestamp}
        event_time: ts
      - id: payments
        type: files
        path: /data/payments/*.jsonl
        format: jsonl
        schema: {order_id: string, paid: double, pts: timestamp}
        event_time: pts
    operators:
      - id: paid_orders
        join:
          left: orders
          right: payments
          on: [order_id]
          type: left
          between: [0s, 1h]
        late: too_late
    sinks:
      - id: out
        type: files
        input: paid_orders
        path: /out
        format: jsonl
      - id: too_late
        type: files
        path: /late
        format: jsonl
    """)


def problems(text: str) -> list[str]:
    with pytest.raises(PipelineError) as info:
        load_pipeline_text(text, file="p.yaml", env={})
    return [str(p) for p in info.value.problems]


def test_interval_join_spec() -> None:
    spec = load_pipeline_text(BASE, file="p.yaml", env={})
    op = spec.operators[0]
    assert op.join == JoinSpec(left="orders", right="payments", left_key=("order_id",),
                               right_key=("order_id",), type="left", mode="interval",
                               lower_ms=0, upper_ms=3_600_000, late="too_late")
    assert (op.kind, op.keyed_kind, op.inputs, op.key_by, op.uid) == (
        "keyed", "join", ("orders", "payments"), ("order_id",), "paid_orders")
    assert op.stateful
    assert spec.dead_letter_sinks == {"too_late"}


def test_window_join_with_left_and_right_keys_and_negative_bounds() -> None:
    spec = load_pipeline_text(BASE.replace("on: [order_id]", "left_key: [order_id]\n"
                                           "      right_key: order_id").replace(
        "between: [0s, 1h]", "window: {sliding: {size: 1m, slide: 10s}}").replace(
        "type: left", "type: full\n      right_prefix: p_"), file="p.yaml", env={})
    join = spec.operators[0].join
    assert join is not None
    assert (join.mode, join.type, join.right_prefix, join.window) == (
        "window", "full", "p_", WindowSpec("sliding", size_ms=60_000, slide_ms=10_000))
    spec = load_pipeline_text(BASE.replace("[0s, 1h]", "[-10m, -30s]"), file="p.yaml", env={})
    assert (spec.operators[0].join.lower_ms, spec.operators[0].join.upper_ms) == (  # type: ignore[union-attr]
        -600_000, -30_000)


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("      between: [0s, 1h]\n", "      between: [0s, 1h]\n      window: {tumbling: 1m}\n",
     "p.yaml:23:7: a join needs exactly one of between, window, table, regular; it has between and "
     "window"),
    ("      between: [0s, 1h]\n", "",
     "p.yaml:18:7: a join needs exactly one of between, window, table, regular"),
    ("[0s, 1h]", "[1h, 0s]",
     "p.yaml:22:16: between's lower bound (1h) must not be after its upper bound (0s)"),
    ("[0s, 1h]", "[-1h]",
     "p.yaml:22:16: between must be [lower, upper] (two durations), got 1 value(s)"),
    ("[0s, 1h]", "[-1x, 2m]",
     "p.yaml:22:17: between[0] must be a duration like '250ms', '10s', '5m', '2h' or '1d', "
     "optionally with a leading '-', got '-1x'"),
    ("type: left\n      between: [0s, 1h]", "type: full\n      table: {as_of: event_time}",
     "p.yaml:21:7: a table join is inner or left, not full: a table has no unmatched rows "
     "to emit (its rows are upserts of the current value of their key); use type: inner or "
     "left"),
    ("type: left\n      between: [0s, 1h]", "type: right\n      table: true\n    uid: x",
     "p.yaml:21:7: a table join is inner or left, not right: a table has no unmatched rows "
     "to emit (its rows are upserts of the current value of their key); use type: inner or "
     "left"),
    ("between: [0s, 1h]", "table: false",
     "p.yaml:22:14: 'table' must be true (enrich each left record with the table's current "
     "row) or {as_of: event_time} (a temporal join), got false"),
    ("between: [0s, 1h]", "table: {as_of: processing_time}",
     "p.yaml:22:22: 'as_of' must be one of event_time; got 'processing_time'"),
    ("between: [0s, 1h]", "table: {}",
     "p.yaml:22:14: 'table' is missing required key 'as_of'"),
    ("right: payments", "right: paymnts",
     "p.yaml:19:14: operator 'paid_orders' has input 'paymnts', which is not a source or "
     "operator; did you mean 'payments'?"),
    ("on: [order_id]", "left_key: [order_id]",
     "p.yaml:20:7: 'left_key' needs 'right_key' too (one column per key column of the other "
     "side), or use on: for columns named alike"),
    ("on: [order_id]", "left_key: [a, b]\n      right_key: c",
     "p.yaml:21:18: right_key has 1 column(s) but left_key has 2; give one right column per "
     "left key column"),
    ("on: [order_id]", "on: [order_id]\n      left_key: x",
     "p.yaml:21:7: a join takes either on: or left_key: + right_key:; it has on and left_key"),
    ("type: left", "type: outer",
     "p.yaml:21:13: 'type' must be one of inner, left, right, full; got 'outer'"),
    ("    late: too_late\n", "    late: too_lat\n",
     "p.yaml:23:11: late output 'too_lat' of operator 'paid_orders' is not defined; name a "
     "sink; did you mean 'too_late'?"),
    ("    late: too_late\n", "    input: orders\n    late: too_late\n",
     "p.yaml:23:5: operator 'paid_orders' is a join, which names its two inputs in join.left "
     "and join.right; remove input"),
    ("    join:\n", "    filter: x\n    join:\n",
     "p.yaml:18:5: operator 'paid_orders' needs exactly one of filter, select, with_columns, "
     "key_by, join; it has filter and join"),
    ("    late: too_late\n", "    late: too_late\n    window: {tumbling: 1m}\n",
     "p.yaml:24:5: a window join's window goes inside join: (join: {window: ...}); remove it "
     "from operator 'paid_orders'"),
    ("type: left", "type: left\n      right_prefix: 1x",
     "p.yaml:22:21: 'right_prefix' '1x' must be a column name (letters, digits and "
     "underscores, not starting with a digit)"),
    ("    late: too_late\n", "    late: too_late\n    broadcast: payments\n",
     "p.yaml:24:5: 'broadcast' does not apply to a join; remove it from operator "
     "'paid_orders'"),
    ("between: [0s, 1h]", "table: true",
     "p.yaml:23:5: operator 'paid_orders' is a processing-time table join (table: true), "
     "which has no late records (each left record joins the row its key has when it is "
     "processed); remove late, or use table: {as_of: event_time} (a temporal join, whose "
     "late records go there)"),
])
def test_invalid_join(old: str, new: str, expected: str) -> None:
    assert old in BASE
    text = BASE.replace(old, new)
    if "uid: x" in new:  # (a case of its own: no late output, which table: true refuses)
        text = text.replace("    late: too_late\n", "").replace("  - id: too_late\n", "  - "
                                                                "id: too_late\n    input: orders\n")
    assert problems(text) == [expected]


def test_late_outside_a_join_is_reported() -> None:
    text = BASE.replace(
        "  - id: paid_orders\n    join:\n      left: orders\n      right: payments\n"
        "      on: [order_id]\n      type: left\n      between: [0s, 1h]\n",
        "  - id: paid_orders\n    input: [orders]\n    filter: 'true'\n"
        "  - id: pp\n    input: payments\n    filter: 'true'\n")
    assert "p.yaml:22:5: 'late' at the operator level applies only to joins; a window's late " \
        "output goes in window: {late: <sink id>}" in problems(text)


def test_schema_has_the_join_operator() -> None:
    operator = json_schema()["properties"]["operators"]["items"]
    join = operator["properties"]["join"]
    assert set(join["properties"]) == {"left", "right", "on", "left_key", "right_key", "type",
                                       "between", "window", "table", "regular",
                                       "right_prefix"}
    assert join["properties"]["type"]["enum"] == ["inner", "left", "right", "full"]
    assert "late" in operator["properties"]
    assert "input" not in operator.get("required", [])


def test_table_join_spec() -> None:
    text = BASE.replace("between: [0s, 1h]", "table: true").replace("    late: too_late\n", "")
    spec = load_pipeline_text(text.replace("  - id: too_late\n", "  - id: too_late\n"
                                           "    input: orders\n"), file="p.yaml", env={})
    join = spec.operators[0].join
    assert join is not None and (join.mode, join.as_of, join.type) == ("table", None, "left")
    assert compile_dataflow(spec).node("paid_orders").detail == (
        "left table join orders x payments on order_id, current row")
    spec = load_pipeline_text(BASE.replace("between: [0s, 1h]", "table: {as_of: event_time}"),
                              file="p.yaml", env={})
    join = spec.operators[0].join
    assert join is not None and (join.mode, join.as_of) == ("table", "event_time")
    assert compile_dataflow(spec).node("paid_orders").detail == (
        "left table join orders x payments on order_id, as of event time")


def test_plan_shows_the_join_with_its_two_inputs() -> None:
    flow = compile_dataflow(load_pipeline_text(BASE, file="p.yaml", env={}))
    node = flow.node("paid_orders")
    assert node.inputs == ("orders", "payments")
    assert node.detail == "left interval join orders x payments on order_id, between [0ms, 1h]"
    assert node.shuffle == "key group by order_id"
    assert node.side_outputs == (("late", "too_late"),)
    assert [n.id for n in flow.consumers("payments")] == ["paid_orders"]
    mermaid = flow.to_mermaid()
    assert "orders -- \"key group by order_id\" --> paid_orders" in mermaid
    assert "payments -- \"key group by order_id\" --> paid_orders" in mermaid


def test_cli_plan_names_the_right_input(tmp_path) -> None:
    from typer.testing import CliRunner

    from streamer.cli.main import app

    path = tmp_path / "p.yaml"
    path.write_text(BASE)
    result = CliRunner().invoke(app, ["plan", str(path)])
    assert result.exit_code == 0, result.output
    assert "left interval join orders x payments" in result.output
    assert "paid_orders (join right input, shown under orders)" in result.output


TABLES = textwrap.dedent("""\
    name: tables
    sources:
      - id: views
        type: files
        path: /data/views/*.jsonl
        format: jsonl
        schema: {user_id: bigint, ts: timestamp}
        event_time: ts
      - id: users
        type: kafka
        bootstrap_servers: 127.0.0.1:9092
        topic: users
        key: user_id
        schema: {user_id: bigint, name: string, updated: timestamp}
        event_time: updated
      - id: files_users
        type: files
        path: /data/users/*.jsonl
        format: jsonl
        reload: true
        schema: {user_id: bigint, name: string, updated: timestamp}
        event_time: updated
    operators:
      - id: a
        join: {left: views, right: users, on: [user_id], table: {as_of: event_time}}
      - id: b
        join: {left: views, right: files_users, on: [user_id], table: true}
    sinks:
      - {id: out_a, type: console, input: a}
      - {id: out_b, type: console, input: b}
    """)


def test_table_sources_key_and_reload() -> None:
    spec = load_pipeline_text(TABLES, file="p.yaml", env={})
    assert spec.sources[1].option("key") == "user_id"
    assert spec.sources[2].option("reload") is True
    properties = json_schema()["properties"]["sources"]["items"]
    assert "key" in json.dumps(properties) and "reload" in json.dumps(properties)


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("key: user_id", "key: id",
     "p.yaml:13:10: key 'id' is not a column of the source's schema (user_id, name, "
     "updated); name the column the message key holds"),
    ("right: users, on: [user_id]", "right: users, left_key: [user_id], right_key: [name]",
     "p.yaml:13:5: source 'users' has key: user_id (its tombstones delete the table row of "
     "their key), so it can only be the right input of a table join on [user_id]; 'a' reads "
     "it otherwise: remove key:, or read the topic with a second source without it"),
    ("{id: out_a, type: console, input: a}", "{id: out_a, type: console, input: [a, users]}",
     "p.yaml:13:5: source 'users' has key: user_id (its tombstones delete the table row of "
     "their key), so it can only be the right input of a table join on [user_id]; 'out_a' "
     "reads it otherwise: remove key:, or read the topic with a second source without it"),
    ("right: files_users, on: [user_id], table: true",
     "right: files_users, on: [user_id], table: {as_of: event_time}",
     "p.yaml:20:5: source 'files_users' has reload: true (each load replaces a table), so it "
     "can only be the right input of a processing-time table join (table: true); 'b' reads it "
     "otherwise: remove reload:, or use a Kafka changelog for a temporal join"),
    ("    reload: true\n", "    reload: true\n    watch: true\n",
     "p.yaml:21:5: 'watch' does not apply with reload: true, which watches the files and "
     "reads them all at each change; remove 'watch'"),
])
def test_invalid_table_sources(old: str, new: str, expected: str) -> None:
    assert old in TABLES
    assert problems(TABLES.replace(old, new)) == [expected]
