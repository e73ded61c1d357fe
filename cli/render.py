"""Rich renderings for the CLI: the plan tree and `streamer test` diffs."""

from __future__ import annotations

import json

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from streamer.pipeline.graph import Dataflow, Node
from streamer.runtime.job.testing import CaseResult

_STYLE = {"source": "cyan", "operator": "yellow", "sink": "green"}


def _label(node: Node, flow: Dataflow) -> Text:
    text = Text.assemble((node.role, f"bold {_STYLE[node.role]}"), " ", (node.id, "bold"),
                         f"  [{node.kind}]")
    if node.detail:
        text.append(f"  {node.detail}", style="dim")
    if node.uid:
        text.append(f"  uid={node.uid}", style="magenta")
    if node.shuffle:
        par = flow.parallelism or "spark default"
        text.append(f"  ⇄ shuffle by {node.shuffle.removeprefix('key group by ')} → "
                    f"{flow.max_parallelism} key groups, parallelism {par}", style="bold red")
    for label, sink in node.side_outputs:
        text.append(f"  ↳ {label} → {sink}", style="dim red")
    return text


def plan_tree(flow: Dataflow) -> Tree:
    """The dataflow as a tree from each source down to its sinks."""
    root = Tree(Text.assemble(("job ", "bold"), (flow.name, "bold"),
                              f"  max_parallelism={flow.max_parallelism}"
                              f"  parallelism={flow.parallelism or 'spark default'}"))

    def grow(branch: Tree, node: Node, path: tuple[str, ...]) -> None:
        child = branch.add(_label(node, flow))
        for consumer in flow.consumers(node.id):
            if consumer.id in path:
                continue
            if len(consumer.inputs) > 1 and consumer.inputs[0] != node.id:
                how = ("join right input" if consumer.kind == "keyed"
                       and consumer.operator.join is not None else
                       "broadcast input" if consumer.role == "operator"
                       and consumer.operator.broadcast == node.id else "union")
                child.add(Text(f"→ {consumer.id} ({how}, shown under {consumer.inputs[0]})",
                               style="dim"))
                continue
            grow(child, consumer, (*path, consumer.id))

    for node in flow.nodes:
        if node.role == "source":
            grow(root, node, (node.id,))
    return root


def print_case_result(console: Console, result: CaseResult) -> None:
    """One line per case, and for a failure the rows that are missing or unexpected."""
    if result.passed:
        console.print(f"[green]PASS[/green] {result.name}")
        return
    console.print(f"[red]FAIL[/red] {result.name}")
    for sink in result.missing:
        missing, unexpected = result.missing[sink], result.unexpected[sink]
        if not missing and not unexpected:
            continue
        console.print(f"  sink [bold]{sink}[/bold]: {len(result.actual[sink])} rows produced")
        for row in missing:
            console.print(Text(f"  - expected, not produced: {json.dumps(row)}", style="red"))
        for row in unexpected:
            console.print(Text(f"  + produced, not expected: {json.dumps(row)}", style="green"))
