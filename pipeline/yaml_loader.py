"""Load YAML into plain Python values while remembering where every value came from.

Positions are kept outside the user's data, in a table keyed by the value's path (a tuple of
mapping keys and list indices), as dbt and Beam YAML do; the validator turns a path into
`file:line:col`. `${VAR}` and `${VAR:-default}` in string values are replaced from the
environment here, so that a missing variable is reported at its own line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from streamer.pipeline.exceptions import Location, PipelineError, PipelineFileError, Problem

Path = tuple[str | int, ...]

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
#: A file whose aliases expand to more values than this is refused ("billion laughs").
MAX_VALUES = 200_000


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans: only true/false, so `on`, `yes` and `no` stay
    strings (a column named `on` must not become True).
    """


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"))


@dataclass
class Positions:
    """Where each value (and each mapping key) of a loaded document is in its file."""

    file: str
    values: dict[Path, Location] = field(default_factory=dict)
    keys: dict[Path, Location] = field(default_factory=dict)
    #: Problems found while loading (undefined variables, bad tags); reported with the rest.
    problems: list[Problem] = field(default_factory=list)
    #: Paths whose value is already reported as broken; the validator skips them.
    broken: set[Path] = field(default_factory=set)

    def of(self, path: Path) -> Location:
        """The location of the value at `path`, or of its nearest enclosing value."""
        while path not in self.values and path:
            path = path[:-1]
        return self.values.get(path, Location(self.file, 1, 1))

    def of_key(self, path: Path) -> Location:
        """The location of the mapping key that names `path` (falls back to the value)."""
        return self.keys.get(path) or self.of(path)


def _loc(file: str, node: yaml.Node) -> Location:
    mark = node.start_mark
    return Location(file, mark.line + 1, mark.column + 1)


def load_text(text: str, file: str, env: Mapping[str, str] | None = None) -> tuple[Any, Positions]:
    """Parse YAML text; return the data and its positions (whose `problems` lists what the
    validator must report with its own), or raise `PipelineError` for unparseable YAML.
    """
    env = os.environ if env is None else env
    positions = Positions(file)
    problems = positions.problems
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as exc:  # a NUL or other control character
        line = text.count("\n", 0, exc.position) + 1
        col = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise PipelineError([Problem(Location(file, line, col), f"the file contains the "
                                     f"control character {exc.character!r}, which YAML does "
                                     "not allow; delete it (pipeline files are UTF-8 text)")]
                            ) from None
    try:
        node = loader.get_single_node()
    except RecursionError:
        raise PipelineError([Problem(Location(file, 1, 1), "the file nests lists or mappings "
                                     "too deeply to be a pipeline")]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        last_line = text.count("\n") + (0 if text.endswith("\n") else 1)
        if exc.context_mark and (mark is None or mark.line + 1 > last_line or
                                 "quoted scalar" in (exc.context or "")):
            mark = exc.context_mark  # e.g. an unclosed quote: point where it opens
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        what = exc.problem or "invalid YAML"
        if exc.context and "quoted scalar" in exc.context:
            what = "this quoted string is never closed"
        raise PipelineError(
            [Problem(Location(file, line, col), f"YAML syntax error: {what}; check the "
                     "indentation and quoting on this line or the one before it")]
        ) from exc
    finally:
        loader.dispose()
    if node is None:
        raise PipelineError([Problem(Location(file, 1, 1), "the file is empty; a pipeline "
                                     "needs at least name, sources and sinks")])

    def substitute(value: str, where: Location) -> str:
        def repl(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if env.get(name):
                return env[name]
            if default is not None:  # like the shell's ${VAR:-x}: unset or empty
                return default
            if name in env:
                return ""
            problems.append(Problem(where, f"environment variable {name!r} is not set; set "
                                    f"it, or give a default with ${{{name}:-value}}"))
            unset.append(name)
            return match.group(0)
        return _ENV.sub(repl, value)

    unset: list[str] = []
    active: set[int] = set()  # nodes being built, to catch aliases that contain themselves
    count = [0]

    class TooLarge(Exception):
        pass

    def build(n: yaml.Node, path: Path) -> Any:
        positions.values[path] = _loc(file, n)
        count[0] += 1
        if count[0] > MAX_VALUES:
            raise TooLarge
        if id(n) in active:
            problems.append(Problem(_loc(file, n), "this alias refers to a value that "
                                    "contains it; YAML aliases must not be recursive"))
            positions.broken.add(path)
            return None
        default_tag = ("tag:yaml.org,2002:map" if isinstance(n, yaml.MappingNode) else
                       "tag:yaml.org,2002:seq" if isinstance(n, yaml.SequenceNode) else None)
        if default_tag and n.tag != default_tag:
            problems.append(Problem(_loc(file, n), f"unsupported YAML tag {n.tag!r}; "
                                    "pipeline files hold plain strings, numbers, booleans, "
                                    "lists and mappings"))
            positions.broken.add(path)
            return None
        if isinstance(n, yaml.MappingNode):
            active.add(id(n))
            try:
                return build_mapping(n, path)
            finally:
                active.discard(id(n))
        if isinstance(n, yaml.SequenceNode):
            active.add(id(n))
            try:
                return [build(item, (*path, i)) for i, item in enumerate(n.value)]
            finally:
                active.discard(id(n))
        try:
            value = loader.construct_object(n, deep=True)
        except yaml.constructor.ConstructorError:
            problems.append(Problem(_loc(file, n), f"unsupported YAML tag {n.tag!r}; "
                                    "pipeline files hold plain strings, numbers, booleans, "
                                    "lists and mappings"))
            positions.broken.add(path)
            return None
        except ValueError as exc:  # e.g. an int of more than 4300 digits, a bad !!timestamp
            problems.append(Problem(_loc(file, n), f"cannot read this value ({exc}); "
                                    "quote it if it is meant as a string"))
            positions.broken.add(path)
            return None
        if isinstance(value, str) and "${" in value:
            before = len(unset)
            value = substitute(value, _loc(file, n))
            if len(unset) > before:
                positions.broken.add(path)
            if isinstance(n, yaml.ScalarNode) and n.style is None and _ENV.fullmatch(n.value):
                # An unquoted `${VAR:-2}` takes the type its value would have had in YAML.
                resolved = loader.resolve(yaml.ScalarNode, value, (True, False))
                value = loader.construct_object(yaml.ScalarNode(resolved, value), deep=True)
        return value

    def build_mapping(n: yaml.MappingNode, path: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        merges: list[yaml.Node] = []
        for key_node, value_node in n.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                merges.append(value_node)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                problems.append(Problem(_loc(file, key_node), "mapping keys must be "
                                        "plain names, not lists or mappings"))
                continue
            key = key_node.value  # the text as written: `on:` stays "on"
            if key in out:
                first = positions.keys[(*path, key)]
                problems.append(Problem(_loc(file, key_node), f"duplicate key {key!r}; "
                                        f"it is already set at line {first.line}"))
                continue
            positions.keys[(*path, key)] = _loc(file, key_node)
            out[key] = build(value_node, (*path, key))
        # `<<: *base` (or a list of them): keys written here win, then earlier merges win.
        for merge in merges:
            sources = merge.value if isinstance(merge, yaml.SequenceNode) else [merge]
            for src in sources:
                if not isinstance(src, yaml.MappingNode):
                    problems.append(Problem(_loc(file, src), "a merge key `<<` takes an "
                                            "alias of a mapping (or a list of them), e.g. "
                                            "<<: *defaults"))
                    continue
                merged = build(src, path)
                for key, value in (merged or {}).items():
                    out.setdefault(key, value)
        positions.values[path] = _loc(file, n)
        return out

    try:
        data = build(node, ())
    except RecursionError:
        raise PipelineError([Problem(Location(file, 1, 1), "the file nests lists or mappings "
                                     "too deeply to be a pipeline")]) from None
    except TooLarge:
        raise PipelineError([Problem(Location(file, 1, 1), f"the file expands to more than "
                                     f"{MAX_VALUES:,} values through aliases; a pipeline file "
                                     "should not need that many")]) from None
    return data, positions


def load_file(path: str, env: Mapping[str, str] | None = None) -> tuple[Any, Positions]:
    """Read and parse a pipeline file (a local path)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError as exc:
        msg = f"pipeline file {path!r} does not exist"
        raise PipelineFileError(msg) from exc
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"cannot read pipeline file {path!r}: {exc}"
        raise PipelineFileError(msg) from exc
    return load_text(text, path, env)
