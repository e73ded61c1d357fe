"""The logical dataflow compiled from a spec: nodes in topological order with their edges,
plus renderings for `streamer plan` (tree, mermaid, dot, json).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamer.pipeline.spec import AggregateSpec, OperatorSpec, PipelineSpec, SinkSpec, SourceSpec
from streamer.pipeline.units import format_duration_ms

Spec = SourceSpec | OperatorSpec | SinkSpec


@dataclass(frozen=True)
class Node:
    """One vertex of the dataflow."""

    id: str
    role: str  # source | operator | sink
    kind: str  # datagen, files, filter, select, keyed, console, ...
    inputs: tuple[str, ...]
    spec: Spec = field(compare=False, repr=False)
    uid: str | None = None
    detail: str = ""
    #: Keyed operators: rows are shuffled by key group before this node.
    shuffle: str | None = None
    #: Extra outgoing side outputs: (label, sink id).
    side_outputs: tuple[tuple[str, str], ...] = ()

    @property
    def source(self) -> SourceSpec:
        """The spec of a source node."""
        assert isinstance(self.spec, SourceSpec), f"{self.id!r} is a {self.role}"
        return self.spec

    @property
    def operator(self) -> OperatorSpec:
        """The spec of an operator node."""
        assert isinstance(self.spec, OperatorSpec), f"{self.id!r} is a {self.role}"
        return self.spec

    @property
    def sink(self) -> SinkSpec:
        """The spec of a sink node."""
        assert isinstance(self.spec, SinkSpec), f"{self.id!r} is a {self.role}"
        return self.spec


@dataclass(frozen=True)
class Dataflow:
    """All nodes, in an order where every node comes after its inputs."""

    name: str
    nodes: tuple[Node, ...]
    parallelism: int | None
    max_parallelism: int

    def node(self, node_id: str) -> Node:
        """The node with this id."""
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def consumers(self, node_id: str) -> list[Node]:
        """Nodes reading `node_id`'s main output."""
        return [n for n in self.nodes if node_id in n.inputs]

    @property
    def stateful(self) -> bool:
        """Whether any operator keeps keyed state."""
        return any(n.kind == "keyed" for n in self.nodes)

    # ------------------------------------------------------------------ renderings
    def to_json(self) -> dict[str, Any]:
        """A JSON-able description of the plan."""
        return {
            "name": self.name,
            "parallelism": self.parallelism,
            "max_parallelism": self.max_parallelism,
            "nodes": [
                {"id": n.id, "role": n.role, "kind": n.kind, "inputs": list(n.inputs),
                 "uid": n.uid, "detail": n.detail, "shuffle": n.shuffle,
                 "side_outputs": [{"label": lbl, "sink": s} for lbl, s in n.side_outputs]}
                for n in self.nodes
            ],
        }

    def to_mermaid(self) -> str:
        """A mermaid `flowchart` of the plan."""
        lines = ["flowchart LR"]
        shapes = {"source": ('[("', '")]'), "operator": ('["', '"]'), "sink": ('[/"', '"/]')}
        for n in self.nodes:
            left, right = shapes[n.role]
            text = f"{n.id}<br/>{n.kind}" + (f"<br/>{_esc(n.detail)}" if n.detail else "")
            lines.append(f"  {n.id}{left}{text}{right}")
        for n in self.nodes:
            for src in n.inputs:
                label = _edge_label(n, src)
                arrow = f"-- \"{label}\" -->" if label else "-->"
                lines.append(f"  {src} {arrow} {n.id}")
            for lbl, sink in n.side_outputs:
                lines.append(f"  {n.id} -. \"{lbl}\" .-> {sink}")
        return "\n".join(lines) + "\n"

    def to_dot(self) -> str:
        """A Graphviz digraph of the plan."""
        shapes = {"source": "cylinder", "operator": "box", "sink": "invhouse"}
        lines = [f'digraph "{self.name}" {{', "  rankdir=LR;"]
        for n in self.nodes:
            text = f"{n.id}\\n{n.kind}" + (f"\\n{_esc(n.detail)}" if n.detail else "")
            lines.append(f'  "{n.id}" [shape={shapes[n.role]}, label="{text}"];')
        for n in self.nodes:
            for src in n.inputs:
                label = _edge_label(n, src)
                attrs = f' [label="{label}", style=bold]' if label else ""
                lines.append(f'  "{src}" -> "{n.id}"{attrs};')
            for lbl, sink in n.side_outputs:
                lines.append(f'  "{n.id}" -> "{sink}" [label="{lbl}", style=dashed];')
        lines.append("}")
        return "\n".join(lines) + "\n"


def _edge_label(node: Node, src: str) -> str | None:
    """How rows of `src` reach `node`: its key-group shuffle, or to every subtask."""
    if node.role == "operator" and node.operator.broadcast == src:
        return "broadcast to every subtask"
    return node.shuffle


def _esc(text: str) -> str:
    return text.replace('"', "'")


def _source_detail(s: SourceSpec) -> str:
    if s.type == "datagen":
        limit = s.option("limit")
        rate = s.option("rows_per_second")
        parts = [f"splits={s.option('splits')}",
                 f"limit={limit}" if limit is not None else "unbounded"]
        if rate:
            parts.append(f"{rate}/s")
        return ", ".join(parts)
    if s.type == "files":
        return f"{s.option('format')} {s.option('path')}" + (" (watch)" if s.option("watch")
                                                                  else "")
    return str(s.option("topic") or s.option("topics"))


def _aggregate_text(a: AggregateSpec) -> str:
    """`name=function(arg)`, with its filter (`count(distinct x)` as `count_distinct(x)`)."""
    where = f" filter (where {a.filter})" if a.filter else ""
    return f"{a.name}={a.function}({a.arg or ''}){where}"


def _operator_detail(o: OperatorSpec) -> str:
    if o.kind == "filter":
        return o.filter or ""
    if o.kind in ("select", "with_columns"):
        return ", ".join(name for name, _ in o.columns)
    if o.join:
        return _join_detail(o)
    if o.top_n:
        t = o.top_n
        order = ", ".join(f"{c}{' desc' if d else ''}" for c, d in t.order_by)
        return f"top {t.n} by {order}" + (f" per {o.window.kind} window" if o.window else "")
    if o.window:
        w = o.window
        size = {"tumbling": lambda: format_duration_ms(w.size_ms or 0),
                "sliding": lambda: f"{format_duration_ms(w.size_ms or 0)}/"
                                   f"{format_duration_ms(w.slide_ms or 0)}",
                "session": lambda: f"gap {format_duration_ms(w.gap_ms or 0)}",
                "count": lambda: str(w.count), "until": lambda: f"until {w.until}"}[w.kind]()
        aggs = ", ".join(map(_aggregate_text, o.aggregates))
        return f"{w.kind} {size}: {aggs}"
    if o.aggregates:
        return "rolling: " + ", ".join(map(_aggregate_text, o.aggregates))
    if o.dedupe_within_ms is not None:
        return f"dedupe within {format_duration_ms(o.dedupe_within_ms)}"
    if o.broadcast:
        return f"process {o.process}, broadcast {o.broadcast}"
    return f"process {o.process}"


def _join_detail(o: OperatorSpec) -> str:
    j = o.join
    assert j is not None
    if j.left_key == j.right_key:
        on = ", ".join(j.left_key)
    else:
        on = ", ".join(f"{a} = {b}" for a, b in zip(j.left_key, j.right_key, strict=True))
    if j.mode == "interval":
        how = (f"between [{format_duration_ms(j.lower_ms)}, {format_duration_ms(j.upper_ms)}]")
    elif j.mode == "table":
        how = "as of event time" if j.as_of else "current row"
    elif j.mode == "regular":
        how = f"ttl {format_duration_ms(j.ttl_ms)}" if j.ttl_ms is not None else "no ttl"
    else:
        w = j.window
        assert w is not None
        size = format_duration_ms(w.size_ms or 0)
        how = (f"tumbling {size}" if w.kind == "tumbling" else
               f"sliding {size}/{format_duration_ms(w.slide_ms or 0)}")
    return f"{j.type} {j.mode} join {j.left} x {j.right} on {on}, {how}"


def compile_dataflow(spec: PipelineSpec) -> Dataflow:
    """Build the dataflow of a validated spec (inputs resolved, order topological)."""
    by_id: dict[str, Node] = {}
    side: tuple[tuple[str, str], ...]
    for s in spec.sources:
        side = (("on_error", s.on_error),) if s.on_error else ()
        by_id[s.id] = Node(s.id, "source", s.type, (), s, uid=s.uid,
                           detail=_source_detail(s), side_outputs=side)
    for o in spec.operators:
        kind = o.kind
        side = (("late", o.window.late),) if o.window and o.window.late else ()
        side += (("late", o.join.late),) if o.join and o.join.late else ()
        side += tuple((f"side {name}", sink) for name, sink in o.side_outputs)
        shuffle = f"key group by {', '.join(o.key_by)}" if o.kind == "keyed" else None
        inputs = (*o.inputs, o.broadcast) if o.broadcast else o.inputs
        by_id[o.id] = Node(o.id, "operator", kind, inputs, o,
                           uid=o.uid if o.stateful else None, detail=_operator_detail(o),
                           shuffle=shuffle, side_outputs=side)
    for k in spec.sinks:
        by_id[k.id] = Node(k.id, "sink", k.type, k.inputs, k,
                           detail=str(k.option("path") or k.option("topic") or ""))
    order: list[Node] = []
    done: set[str] = set()

    def place(node_id: str) -> None:
        if node_id in done:
            return
        done.add(node_id)
        for dep in by_id[node_id].inputs:
            place(dep)
        order.append(by_id[node_id])

    for node_id in by_id:
        place(node_id)
    return Dataflow(spec.name, tuple(order), spec.job.parallelism, spec.job.max_parallelism)
