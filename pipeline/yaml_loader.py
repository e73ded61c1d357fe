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


@dataclass
class Positions:
    """Where each value (and each mapping key) of a loaded document is in its file."""

    file: str
    values: dict[Path, Location] = field(default_factory=dict)
    keys: dict[Path, Location] = field(default_factory=dict)

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
    """Parse YAML text; return the data and its positions, or raise `PipelineError`."""
    env = os.environ if env is None else env
    positions = Positions(file)
    problems: list[Problem] = []
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        what = exc.problem or "invalid YAML"
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
            if name in env:
                return env[name]
            if default is not None:
                return default
            problems.append(Problem(where, f"environment variable {name!r} is not set; set "
                                    f"it, or give a default with ${{{name}:-value}}"))
            return match.group(0)
        return _ENV.sub(repl, value)

    def build(n: yaml.Node, path: Path) -> Any:
        positions.values[path] = _loc(file, n)
        if isinstance(n, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in n.value:
                key = loader.construct_object(key_node, deep=True)
                if not isinstance(key, str | int | bool | float) or key is None:
                    problems.append(Problem(_loc(file, key_node), "mapping keys must be "
                                            "plain names"))
                    continue
                key = str(key) if not isinstance(key, str) else key
                if key in out:
                    first = positions.keys[(*path, key)]
                    problems.append(Problem(_loc(file, key_node), f"duplicate key {key!r}; "
                                            f"it is already set at line {first.line}"))
                    continue
                positions.keys[(*path, key)] = _loc(file, key_node)
                out[key] = build(value_node, (*path, key))
            return out
        if isinstance(n, yaml.SequenceNode):
            return [build(item, (*path, i)) for i, item in enumerate(n.value)]
        value = loader.construct_object(n, deep=True)
        if isinstance(value, str) and "${" in value:
            value = substitute(value, _loc(file, n))
        return value

    try:
        data = build(node, ())
    except yaml.YAMLError as exc:  # e.g. an unknown tag such as !!python/object
        raise PipelineError([Problem(Location(file, 1, 1), f"unsupported YAML: {exc}")]) from exc
    if problems:
        raise PipelineError(problems)
    return data, positions


def load_file(path: str, env: Mapping[str, str] | None = None) -> tuple[Any, Positions]:
    """Read and parse a pipeline file (a local path)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError as exc:
        raise PipelineFileError(f"pipeline file {path!r} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise PipelineFileError(f"cannot read pipeline file {path!r}: {exc}") from exc
    return load_text(text, path, env)
