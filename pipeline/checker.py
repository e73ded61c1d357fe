"""What the pipeline file's messages are made of: the `Checker` that collects problems at
paths of the file (reported at `file:line:col` by `pipeline/validate.py`), the words a message
uses for a value (`type_name`) and a setting (`label`), the nearest valid name (`did_you_mean`),
and the type of a rule between keys (`Rule`). The model of the file is `pipeline/schema.py`'s
pydantic `PipelineModel` (docs/decisions/pydantic.md).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import Any

from streamer.pipeline.yaml_loader import Path


class Checker:
    """Collects problems found while walking a document; `report(path, message, key=...)`."""

    def __init__(self) -> None:
        self.found: list[tuple[Path, bool, str]] = []

    def report(self, path: Path, message: str, *, at_key: bool = False) -> None:
        """Record a problem at `path` (at the mapping key naming it when `at_key`)."""
        self.found.append((path, at_key, message))


def nearest(word: str, choices: Sequence[str]) -> str | None:
    """The closest of `choices` to a misspelt `word`, if any is close enough."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(word: str, choices: Sequence[str], *, listing: str = "valid keys") -> str:
    """`; did you mean 'x'?` or `; valid keys: a, b` for an unknown name."""
    close = nearest(word, choices)
    if close:
        return f"; did you mean {close!r}?"
    return f"; {listing}: {', '.join(sorted(choices))}" if choices else ""


def type_name(value: Any) -> str:
    """What a YAML value is, in words for a message: `a list`, `true (a boolean)`."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def label(path: Path) -> str:
    """The user-facing name of the setting at `path`: its last key quoted, or `sources[0]`
    for a list entry.
    """
    if path and isinstance(path[-1], int):
        parent = path[-2] if len(path) > 1 and isinstance(path[-2], str) else "item"
        return f"{parent}[{path[-1]}]"
    for part in reversed(path):
        if isinstance(part, str):
            return repr(part)
    return "the value"


Rule = Callable[[dict[str, Any], Path, Checker], None]
