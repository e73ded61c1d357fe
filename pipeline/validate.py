"""Validate a pipeline file: structure against the model, then ids and references between
sources, operators and sinks (unknown inputs, cycles, unconsumed outputs, dead-letter sinks).

Every problem is collected and reported together as `file:line:col: message`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamer.pipeline.exceptions import PipelineError, Problem
from streamer.pipeline.model import Checker, did_you_mean
from streamer.pipeline.schema import PIPELINE
from streamer.pipeline.spec import PipelineSpec, build_spec
from streamer.pipeline.yaml_loader import Path, Positions, load_file, load_text


def _problems(ck: Checker, positions: Positions) -> list[Problem]:
    return [Problem(positions.of_key(path) if at_key else positions.of(path), message)
            for path, at_key, message in ck.found]


def _ref_paths(raw: Mapping[str, Any], base: Path, key: str) -> list[tuple[str, Path]]:
    value = raw.get(key)
    if isinstance(value, list):
        return [(v, (*base, key, i)) for i, v in enumerate(value) if isinstance(v, str)]
    return [(value, (*base, key))] if isinstance(value, str) else []


def check_references(data: Mapping[str, Any], ck: Checker) -> None:
    """Report duplicate ids, unresolved references, cycles and unconsumed outputs."""
    kinds: dict[str, str] = {}
    first_seen: dict[str, Path] = {}
    for section, kind in (("sources", "source"), ("operators", "operator"), ("sinks", "sink")):
        for i, raw in enumerate(data.get(section) or []):
            node_id = raw.get("id")
            if not isinstance(node_id, str):
                continue
            if node_id in kinds:
                ck.report((section, i, "id"), f"duplicate id {node_id!r}; it is already the id "
                          f"of a {kinds[node_id]} — ids must be unique across sources, "
                          "operators and sinks")
                continue
            kinds[node_id] = kind
            first_seen[node_id] = (section, i)

    producers = [k for k, v in kinds.items() if v != "sink"]
    consumed: set[str] = set()
    edges: dict[str, list[str]] = {}

    def resolve(ref: str, path: Path, owner: str) -> bool:
        if ref not in kinds:
            ck.report(path, f"{owner} has input {ref!r}, which is not a source or operator"
                      f"{did_you_mean(ref, producers, listing='known ids')}")
            return False
        if kinds[ref] == "sink":
            ck.report(path, f"{owner} has input {ref!r}, which is a sink; a sink has no "
                      "output to read")
            return False
        return True

    for i, raw in enumerate(data.get("operators") or []):
        owner = f"operator {raw.get('id')!r}"
        for ref, path in _ref_paths(raw, ("operators", i), "input"):
            if ref == raw.get("id"):
                ck.report(path, f"{owner} reads its own output; remove it from input")
            elif resolve(ref, path, owner):
                consumed.add(ref)
                edges.setdefault(raw.get("id"), []).append(ref)

    dead_letter: dict[str, str] = {}  # sink id -> who sends to it
    for section, key in (("sources", "on_error"), ("operators", "window")):
        for i, raw in enumerate(data.get(section) or []):
            if key == "window":
                window = raw.get("window")
                ref = window.get("late") if isinstance(window, dict) else None
                path: Path = ("operators", i, "window", "late")
                what = "late output"
            else:
                ref, path, what = raw.get("on_error"), ("sources", i, "on_error"), "on_error"
            if not isinstance(ref, str):
                continue
            owner = f"{'source' if section == 'sources' else 'operator'} {raw.get('id')!r}"
            if kinds.get(ref) != "sink":
                sinks = [k for k, v in kinds.items() if v == "sink"]
                problem = ("is not defined" if ref not in kinds
                           else f"is a {kinds[ref]}, not a sink")
                ck.report(path, f"{what} {ref!r} of {owner} {problem}; name a sink"
                          f"{did_you_mean(ref, sinks, listing='sinks') if ref not in kinds else ''}")
                continue
            if ref in dead_letter and dead_letter[ref].startswith("late") != (what != "on_error"):
                ck.report(path, f"sink {ref!r} already receives {dead_letter[ref]}; dead-letter "
                          "records and late records have different columns, use two sinks")
            dead_letter.setdefault(ref, f"{what} of {owner}")

    for i, raw in enumerate(data.get("sinks") or []):
        sink_id = raw.get("id")
        owner = f"sink {sink_id!r}"
        refs = _ref_paths(raw, ("sinks", i), "input")
        if sink_id in dead_letter:
            if refs:
                ck.report(("sinks", i, "input"), f"{owner} receives {dead_letter[sink_id]} and "
                          "cannot also have input; use a separate sink")
            continue
        if "input" not in raw and isinstance(sink_id, str):
            ck.report(("sinks", i), f"{owner} has no input; add input: <source or operator id>")
        for ref, path in refs:
            if resolve(ref, path, owner):
                consumed.add(ref)

    # Cycles among operators (depth-first, reporting each cycle once at its first operator).
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in edges.get(node, []):
            if state.get(dep) == 1:
                cycle = [*stack[stack.index(dep):], dep]
                cycle.reverse()
                ck.report((*first_seen[dep], "input"), "operators form a cycle: "
                          f"{' -> '.join(cycle)}; an operator can only read outputs upstream "
                          "of it")
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in edges:
        if node not in state:
            visit(node)

    for node_id in producers:
        if node_id not in consumed:
            kind = kinds[node_id]
            ck.report((*first_seen[node_id], "id"), f"the output of {kind} {node_id!r} is not "
                      f"used; add a sink or operator with input: {node_id}, or remove the "
                      f"{kind}")

    for i, test in enumerate(data.get("tests") or []):
        if not isinstance(test, dict):
            continue
        for key, kind in (("inputs", "source"), ("expect", "sink")):
            rows = test.get(key)
            if not isinstance(rows, dict):
                continue
            wanted = [k for k, v in kinds.items() if v == kind]
            for ref in rows:
                if kinds.get(ref) != kind:
                    ck.report(("tests", i, key, ref), f"{key} of test {test.get('name')!r} names "
                              f"{ref!r}, which is not a {kind}"
                              f"{did_you_mean(ref, wanted, listing=kind + 's')}", at_key=True)


def validate_data(data: Any, positions: Positions) -> PipelineSpec:
    """Validate loaded YAML and build the spec, or raise `PipelineError` with every problem."""
    ck = Checker()
    if not isinstance(data, dict):
        ck.report((), "a pipeline file must be a mapping with name, sources and sinks at the "
                  "top level")
        raise PipelineError(_problems(ck, positions))
    PIPELINE.check(data, (), ck)
    if ck.found:
        raise PipelineError(_problems(ck, positions))
    check_references(data, ck)
    if ck.found:
        raise PipelineError(_problems(ck, positions))
    return build_spec(data, positions)


def load_pipeline(path: str, env: Mapping[str, str] | None = None) -> PipelineSpec:
    """Read, validate and build the pipeline in the file at `path` (no Spark involved)."""
    data, positions = load_file(path, env)
    return validate_data(data, positions)


def load_pipeline_text(text: str, file: str = "<string>",
                       env: Mapping[str, str] | None = None) -> PipelineSpec:
    """Like `load_pipeline`, for YAML held in a string."""
    data, positions = load_text(text, file, env)
    return validate_data(data, positions)
