"""The compiled dataflow's nodes give their spec typed by role (`node.source`,
`node.operator`, `node.sink`), and refuse the wrong one."""

from __future__ import annotations

import textwrap

import pytest

from streamer.pipeline.graph import Dataflow, compile_dataflow
from streamer.pipeline.spec import OperatorSpec, SinkSpec, SourceSpec
from streamer.pipeline.validate import load_pipeline_text

PIPELINE = """\
    name: p
    sources:
      - id: clicks
        type: datagen
        fields: {user: "concat('u', offset % 10)", ts: "timestamp_millis(offset)"}
        event_time: ts
    operators:
      - id: counts
        input: clicks
        key_by: [user]
        window: {tumbling: 1m}
        aggregate: {n: count()}
    sinks:
      - id: out
        type: console
        input: counts
    """


@pytest.fixture
def flow() -> Dataflow:
    return compile_dataflow(load_pipeline_text(textwrap.dedent(PIPELINE), file="p.yaml",
                                               env={}))


def test_each_role_gives_its_own_spec(flow: Dataflow) -> None:
    source = flow.node("clicks").source
    assert isinstance(source, SourceSpec)
    assert (source.id, source.type, source.event_time) == ("clicks", "datagen", "ts")
    operator = flow.node("counts").operator
    assert isinstance(operator, OperatorSpec)
    assert (operator.key_by, operator.keyed_kind) == (("user",), "window")
    sink = flow.node("out").sink
    assert isinstance(sink, SinkSpec)
    assert (sink.type, sink.inputs) == ("console", ("counts",))
    for node in flow.nodes:
        assert getattr(node, node.role) is node.spec


@pytest.mark.parametrize(("node_id", "wrong"), [
    ("clicks", "operator"), ("clicks", "sink"),
    ("counts", "source"), ("counts", "sink"),
    ("out", "source"), ("out", "operator"),
])
def test_the_wrong_role_is_refused_naming_the_node(flow: Dataflow, node_id: str,
                                                  wrong: str) -> None:
    node = flow.node(node_id)
    with pytest.raises(AssertionError, match=f"'{node_id}' is a {node.role}"):
        getattr(node, wrong)


def test_a_broadcast_input_is_an_input_of_the_process_operator_and_shown_as_such() -> None:
    from streamer.cli.render import plan_tree

    flow = compile_dataflow(load_pipeline_text(textwrap.dedent("""\
        name: p
        sources:
          - {id: rules, type: datagen, fields: {r: "offset"}}
          - {id: clicks, type: datagen, fields: {user: "concat('u', offset % 10)"}}
        operators:
          - {id: flag, input: clicks, key_by: [user], process: "m:C", broadcast: rules}
        sinks:
          - {id: out, type: console, input: flag}
        """), file="p.yaml", env={}))
    node = flow.node("flag")
    assert node.inputs == ("clicks", "rules") and node.operator.inputs == ("clicks",)
    assert node.operator.broadcast == "rules"
    assert [n.id for n in flow.nodes].index("rules") < [n.id for n in flow.nodes].index("flag")
    assert node.detail == "process m:C, broadcast rules"
    assert '  rules -- "broadcast to every subtask" --> flag' in flow.to_mermaid()
    assert '"rules" -> "flag" [label="broadcast to every subtask"' in flow.to_dot()
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(plan_tree(flow))
    assert "→ flag (broadcast input, shown under clicks)" in console.export_text()
