"""Validate a pipeline file: structure against the model, then ids and references between
sources, operators and sinks (unknown inputs, cycles, unconsumed outputs, dead-letter sinks).

Every problem is collected and reported together as `file:line:col: message`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from streamer.pipeline.checker import Checker, did_you_mean
from streamer.pipeline.continuous_support import continuous_refusal
from streamer.pipeline.exceptions import PipelineError, Problem
from streamer.pipeline.schema import PipelineModel, check_pipeline
from streamer.pipeline.spec import RETRACTABLE, PipelineSpec, build_spec
from streamer.pipeline.typecheck import check_types
from streamer.pipeline.yaml_loader import Path, Positions, load_file, load_text
from streamer.text import a_noun


def _problems(ck: Checker, positions: Positions) -> list[Problem]:
    def broken(path: Path) -> bool:  # already reported while loading (bad tag, unset ${VAR})
        return any(path[:n] in positions.broken for n in range(len(path) + 1))

    return [Problem(positions.of_key(path) if at_key else positions.of(path), message)
            for path, at_key, message in ck.found if not broken(path)]


def _ref_paths(raw: Mapping[str, Any], base: Path, key: str) -> list[tuple[str, Path]]:
    value = raw.get(key)
    if isinstance(value, list):
        return [(v, (*base, key, i)) for i, v in enumerate(value) if isinstance(v, str)]
    return [(value, (*base, key))] if isinstance(value, str) else []


def _items(data: Mapping[str, Any], section: str) -> list[tuple[int, dict[str, Any]]]:
    """The mapping entries of a list section (malformed ones are reported elsewhere)."""
    value = data.get(section)
    if not isinstance(value, list):
        return []
    return [(i, raw) for i, raw in enumerate(value) if isinstance(raw, dict)]



def check_references(data: Mapping[str, Any], ck: Checker) -> None:
    """Report duplicate ids and uids, unresolved references, cycles and unconsumed outputs.

    Written to run on data that may also have structural problems, so that every problem
    is reported in one pass.
    """
    kinds: dict[str, str] = {}
    first_seen: dict[str, Path] = {}
    duplicated: set[str] = set()
    unresolved = 0
    # When a section is malformed, ids may be missing for reasons already reported; then an
    # unknown reference is not reported again, nor is anything "not used".
    incomplete = any(
        section in data and (not isinstance(data[section], list) or any(
            not isinstance(raw, dict) or not isinstance(raw.get("id"), str)
            for raw in data[section]))
        for section in ("sources", "operators", "sinks"))
    for section, kind in (("sources", "source"), ("operators", "operator"), ("sinks", "sink")):
        for i, raw in _items(data, section):
            node_id = raw.get("id")
            if not isinstance(node_id, str):
                continue
            if node_id in kinds:
                duplicated.add(node_id)
                ck.report((section, i, "id"), f"duplicate id {node_id!r}; it is already the id "
                          f"of {a_noun(kinds[node_id])} — ids must be unique across sources, "
                          "operators and sinks")
                continue
            kinds[node_id] = kind
            first_seen[node_id] = (section, i)

    uids: dict[str, str] = {}
    for section, kind in (("sources", "source"), ("operators", "operator")):
        for i, raw in _items(data, section):
            if section == "operators" and "key_by" not in raw and "join" not in raw:
                continue  # stateless operators have no state, so no uid
            uid = raw.get("uid", raw.get("id"))
            node_id = raw.get("id")
            if not isinstance(uid, str) or (isinstance(node_id, str) and node_id in duplicated):
                continue
            owner = f"{kind} {raw.get('id')!r}"
            if uid in uids:
                where: Path = (section, i, "uid") if "uid" in raw else (section, i, "id")
                ck.report(where, f"{owner} has uid {uid!r}, which is already the uid of "
                          f"{uids[uid]}; uids identify state in checkpoints and savepoints "
                          "and must be unique — set a distinct uid:")
            else:
                uids[uid] = owner

    producers = [k for k, v in kinds.items() if v != "sink"]
    consumed: set[str] = set()
    edges: dict[str, list[str]] = {}

    def resolve(ref: str, path: Path, owner: str) -> bool:
        nonlocal unresolved
        if ref not in kinds:
            unresolved += 1
            if incomplete:
                return False
            ck.report(path, f"{owner} has input {ref!r}, which is not a source or operator"
                      f"{did_you_mean(ref, producers, listing='known ids')}")
            return False
        if kinds[ref] == "sink":
            unresolved += 1
            ck.report(path, f"{owner} has input {ref!r}, which is a sink; a sink has no "
                      "output to read")
            return False
        return True

    def refs_of(raw: dict[str, Any], base: Path, owner: str) -> list[tuple[str, Path]]:
        nonlocal unresolved
        join = raw.get("join")
        if base[0] == "operators" and isinstance(join, dict):  # its inputs: left and right
            sides = [(join.get(k), (*base, "join", k)) for k in ("left", "right")]
            unresolved += sum(not isinstance(ref, str) for ref, _ in sides)
            return [(ref, path) for ref, path in sides if isinstance(ref, str)]
        value = raw.get("input")
        if not (isinstance(value, str) or (isinstance(value, list) and value and all(
                isinstance(v, str) for v in value))):
            unresolved += "input" in raw or base[0] == "operators"  # reported as structure
        out, seen = [], set()
        for ref, path in _ref_paths(raw, base, "input"):
            if ref in seen:
                ck.report(path, f"{owner} lists input {ref!r} twice; list each input once")
                continue
            seen.add(ref)
            out.append((ref, path))
        return out

    def broadcast_of(raw: dict[str, Any], base: Path, owner: str,
                     inputs: list[tuple[str, Path]]) -> list[tuple[str, Path]]:
        """A process operator's broadcast input, checked as one of its inputs."""
        nonlocal unresolved
        ref = raw.get("broadcast")
        if not isinstance(ref, str):
            return []
        path = (*base, "broadcast")
        problem = None
        if "process" not in raw:  # (reported as structure)
            pass
        elif ref in {name for name, _ in inputs}:
            problem = (f"{owner} has {ref!r} as its input and its broadcast input; the "
                       "broadcast input must be another source or operator (the rules, not "
                       "the keyed records)")
        elif ref == raw.get("id"):
            problem = f"{owner} cannot be its own broadcast input; name a source or operator"
        elif kinds.get(ref) == "sink":
            problem = (f"broadcast input {ref!r} of {owner} is a sink, which has no output "
                       "to read; name a source or operator")
        elif ref not in kinds and not incomplete:
            problem = (f"broadcast input {ref!r} of {owner} is not a source or operator"
                       f"{did_you_mean(ref, producers, listing='known ids')}")
        else:
            return [(ref, path)]
        unresolved += 1  # (so what it would have read is not reported as unused)
        if problem is not None:
            ck.report(path, problem)
        return []

    input_paths: dict[tuple[str, str], Path] = {}
    for i, raw in _items(data, "operators"):
        op_id = str(raw.get("id"))
        owner = f"operator {raw.get('id')!r}"
        refs = refs_of(raw, ("operators", i), owner)
        for name, ref_path in [*refs, *broadcast_of(raw, ("operators", i), owner, refs)]:
            if name == op_id:
                if name not in duplicated:
                    ck.report(ref_path, f"{owner} reads its own output; remove it from input")
            elif resolve(name, ref_path, owner):
                consumed.add(name)
                edges.setdefault(op_id, []).append(name)
                input_paths[(op_id, name)] = ref_path

    dead_letter: dict[str, str] = {}  # sink id -> who sends to it
    dead_letter_unresolved = 0
    for section, key in (("sources", "on_error"), ("operators", "window"), ("operators", "late")):
        for i, raw in _items(data, section):
            target: Any
            path: Path
            if key == "late":
                target, path, what = raw.get("late"), ("operators", i, "late"), "late output"
            elif key == "window":
                window = raw.get("window")
                target = window.get("late") if isinstance(window, dict) else None
                path, what = ("operators", i, "window", "late"), "late output"
            else:
                target, path, what = raw.get("on_error"), ("sources", i, "on_error"), "on_error"
            ref = target
            if not isinstance(ref, str):
                continue
            owner = f"{'source' if section == 'sources' else 'operator'} {raw.get('id')!r}"
            if kinds.get(ref) != "sink":
                sinks = [k for k, v in kinds.items() if v == "sink"]
                dead_letter_unresolved += 1
                problem = ("is not defined" if ref not in kinds
                           else f"is {a_noun(kinds[ref])}, not a sink")
                hint = did_you_mean(ref, sinks, listing="sinks") if ref not in kinds else ""
                ck.report(path, f"{what} {ref!r} of {owner} {problem}; name a sink{hint}")
                continue
            if ref in dead_letter and dead_letter[ref].startswith("late") != (what != "on_error"):
                ck.report(path, f"sink {ref!r} already receives {dead_letter[ref]}; dead-letter "
                          "records and late records have different columns, use two sinks")
            dead_letter.setdefault(ref, f"{what} of {owner}")

    for i, raw in _items(data, "operators"):
        outputs = raw.get("side_outputs")
        if not isinstance(outputs, dict):
            continue
        owner = f"operator {raw.get('id')!r}"
        for name, ref in outputs.items():
            if not isinstance(ref, str):
                continue
            path = ("operators", i, "side_outputs", name)
            if kinds.get(ref) != "sink":
                dead_letter_unresolved += 1
                sinks = [k for k, v in kinds.items() if v == "sink"]
                problem = ("is not defined" if ref not in kinds
                           else f"is {a_noun(kinds[ref])}, not a sink")
                hint = did_you_mean(ref, sinks, listing="sinks") if ref not in kinds else ""
                ck.report(path, f"side output {name!r} of {owner} names {ref!r}, which "
                          f"{problem}; name a sink{hint}")
            elif ref in dead_letter:
                ck.report(path, f"sink {ref!r} already receives {dead_letter[ref]}; give side "
                          f"output {name!r} a sink of its own")
            else:
                dead_letter[ref] = f"side output {name!r} of {owner}"

    for i, raw in _items(data, "sinks"):
        sink_id = raw.get("id")
        owner = f"sink {sink_id!r}"
        refs = refs_of(raw, ("sinks", i), owner)
        if isinstance(sink_id, str) and sink_id in dead_letter and refs:
            ck.report(("sinks", i, "input"), f"{owner} receives {dead_letter[sink_id]} and "
                      "cannot also have input; use a separate sink")
        if "input" not in raw and isinstance(sink_id, str) and sink_id not in dead_letter \
                and not dead_letter_unresolved:
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
                ck.report(input_paths[(node, dep)], "operators form a cycle: "
                          f"{' -> '.join(cycle)}; an operator can only read outputs upstream "
                          "of it")
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in edges:
        if node not in state:
            visit(node)

    # A typo'd or broken input explains any output that looks unused; say only that.
    for node_id in producers if not unresolved and not incomplete else []:
        if node_id not in consumed:
            kind = kinds[node_id]
            ck.report((*first_seen[node_id], "id"), f"the output of {kind} {node_id!r} is not "
                      f"used; add a sink or operator with input: {node_id}, or remove the "
                      f"{kind}")

    _check_changelogs(data, ck)

    for i, test in _items(data, "tests"):
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


def _check_changelogs(data: Mapping[str, Any], ck: Checker) -> None:
    """A table source is read only as the right input of table joins: a Kafka source with
    `key:` (a changelog whose tombstones delete their key: rows of nulls anywhere else) of
    joins on that column; a files source with `reload: true` (whose loads replace the
    table) of processing-time ones (`table: true`)."""
    # input id -> (reader id, the join's table: and right key columns when it is a join's
    # right input, else None)
    readers: dict[str, list[tuple[str, tuple[Any, Any] | None]]] = {}
    for section in ("operators", "sinks"):
        for _, raw in _items(data, section):
            reader = str(raw.get("id"))
            join = raw.get("join") if section == "operators" else None
            if isinstance(join, dict):
                keys = join.get("right_key", join.get("on"))
                right = (join.get("table"), [keys] if isinstance(keys, str) else keys)
                for side in ("left", "right"):
                    readers.setdefault(str(join.get(side)), []).append(
                        (reader, right if side == "right" else None))
                continue
            for name in ("input", "broadcast"):
                for ref, _ in _ref_paths(raw, (section,), name):
                    readers.setdefault(ref, []).append((reader, None))
    for i, raw in _items(data, "sources"):
        key: str | None = raw.get("key")
        source = f"source {raw.get('id')!r}"
        schema = raw.get("schema")
        if isinstance(schema, dict) and isinstance(key, str) and key not in schema:
            continue  # (reported as the source's)
        if raw.get("type") == "kafka" and isinstance(key, str):
            where: Path = ("sources", i, "key")
            why = (f"{source} has key: {key} (its tombstones delete the table row of their "
                   f"key), so it can only be the right input of a table join on [{key}]")
            fix = "remove key:, or read the topic with a second source without it"
        elif raw.get("type") == "files" and raw.get("reload") is True:
            key, where = None, ("sources", i, "reload")
            why = (f"{source} has reload: true (each load replaces a table), so it can only "
                   "be the right input of a processing-time table join (table: true)")
            fix = "remove reload:, or use a Kafka changelog for a temporal join"
        else:
            continue
        for reader, table in readers.get(str(raw.get("id")), []):
            fits = table is not None and (table[0] is True if key is None else (
                table[0] is not None and table[1] == [key]))
            if not fits:
                ck.report(where, f"{why}; {reader!r} reads it otherwise: {fix}",
                          at_key=True)
                break


#: Kinds whose update streams take back a row's old value before its new one (a rolling
#: aggregate read by a keyed operator, a top-N without a window).
RETRACTING = ("aggregate", "top_n")


def check_update_streams(spec: PipelineSpec, ck: Checker) -> None:
    """Which keyed operators may read an update stream (`OperatorSpec.emits_updates`): a
    rolling aggregate whose aggregates take retractions (count, sum, avg) consumes a
    rolling aggregate's or a top-N's updates as a changelog, taking back each key's old value before
    adding the new one. Any other keyed operator would take every update as a new record
    (a max over a rolling aggregate's updates would keep values the key no longer has:
    wrong results, and no error), so it is refused with the fix. Stateless operators pass
    updates on; sinks take them (a files sink keeps every update, an upsert table the
    latest)."""
    by_id = {o.id: o for o in spec.operators}
    for op in spec.operators:
        if not op.stateful:
            continue
        if op.join is not None:
            refs: list[tuple[str, Path]] = [
                (op.join.left, (*op.path, "join", "left")),
                (op.join.right, (*op.path, "join", "right"))]
        else:
            listed = (*op.path, "input", 0) in spec.positions.values
            refs = [(ref, (*op.path, "input", j) if listed else (*op.path, "input"))
                    for j, ref in enumerate(op.inputs)]
        for ref, path in refs:
            origin = spec.updates_behind(ref)
            if origin is None:
                continue
            why = by_id[origin].emits_updates
            via = "" if origin == ref else f" through {ref!r}"
            head = f"operator {op.id!r} reads{via} the updates of {origin!r}, {why}"
            if op.keyed_kind == "aggregate" and by_id[origin].keyed_kind in RETRACTING:
                for agg in op.aggregates:
                    if agg.function not in RETRACTABLE:
                        why = (" (it keeps each distinct value once, not how many rows "
                               "have it)" if agg.function == "count_distinct" else "")
                        shown = ("count(distinct ...)" if agg.function == "count_distinct"
                                 else f"{agg.function}()")
                        ck.report((*op.path, "aggregate", agg.name),
                                  f"{head}; its aggregate {agg.name!r} = {shown} "
                                  "cannot take an old value back when a key's value "
                                  f"changes{why}; use "
                                  f"{', '.join(f + '()' for f in RETRACTABLE)} over "
                                  f"updates, or key and window the records before {origin!r}")
                break
            what = {"aggregate": "rolling aggregate", "process": "process function",
                    "top_n": "top-N"}.get(
                str(op.keyed_kind), str(op.keyed_kind))
            ck.report(path, f"{head}; {a_noun(what)} would take every update as a new "
                      "record (only a rolling aggregate of count, sum or avg takes "
                      f"retractions). Key and window the records before {origin!r} "
                      f"instead, or send {origin!r} to a sink")
            break


#: A window function call (`row_number() OVER (...)`), outside string literals.
_OVER = re.compile(r"\)\s*over\s*[(\w]", re.IGNORECASE)
_STRINGS = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`")


def check_window_functions(spec: PipelineSpec, ck: Checker) -> None:
    """A window function (`row_number() OVER (PARTITION BY ...)`) in a stateless operator
    would run over each epoch's rows alone: a "top 1" per key once per epoch, not once. It
    is refused with the keyed operators that keep the state it needs."""
    for op in spec.operators:
        exprs = [((*op.path, "filter"), op.filter)] if op.filter else []
        exprs += [((*op.path, op.kind, name), text) for name, text in op.columns]
        for path, text in exprs:
            if isinstance(text, str) and _OVER.search(_STRINGS.sub("''", text)):
                ck.report(path, f"operator {op.id!r} uses a window function (OVER), which "
                          "would see only one epoch's rows at a time; keep state across "
                          "epochs with a keyed operator instead: key_by with a window and "
                          "max_by/min_by for the top row per key, or dedupe for the first")


def validate_data(data: Any, positions: Positions,
                  env: Mapping[str, str] | None = None) -> PipelineSpec:
    """Validate loaded YAML and build the spec, or raise `PipelineError` with every problem."""
    ck = Checker()
    if not isinstance(data, dict):
        ck.report((), "a pipeline file must be a mapping with name, sources and sinks at the "
                  "top level")
        raise PipelineError(_problems(ck, positions))
    model = check_pipeline(data, ck)
    check_references(data, ck)
    problems = positions.problems + _problems(ck, positions)
    if problems:
        raise PipelineError(problems)
    spec = build_spec(model or PipelineModel.model_validate(data), positions, env)
    check_update_streams(spec, ck)
    check_window_functions(spec, ck)
    problems = _problems(ck, positions) + check_types(spec)
    refusal = (continuous_refusal(spec) if spec.job.execution.mode == "continuous"
               and not problems else None)  # (the file's mode; `check_mode` applies the
    if refusal is not None:                 # environment's override)
        problems.append(refusal.problem(spec.job.execution))
    if problems:
        raise PipelineError(problems)
    return spec


def load_pipeline(path: str, env: Mapping[str, str] | None = None) -> PipelineSpec:
    """Read, validate and build the pipeline in the file at `path` (no Spark involved): its
    structure, references, and what its declared schemas allow (`pipeline.typecheck`)."""
    data, positions = load_file(path, env)
    return validate_data(data, positions, env)


def load_pipeline_text(text: str, file: str = "<string>",
                       env: Mapping[str, str] | None = None) -> PipelineSpec:
    """Like `load_pipeline`, for YAML held in a string."""
    data, positions = load_text(text, file, env)
    return validate_data(data, positions, env)
