"""What every part of the pipeline file's model shares: id and column patterns, and the helpers
that name an entry in a message and check that a mapping has exactly one of some keys. Apart
from `schema.py` so that the models (`operator_model.py`, `sink_model.py`, ...) can build on it
without a cycle."""

from __future__ import annotations

from typing import Any

from streamer.pipeline.checker import Checker
from streamer.pipeline.yaml_loader import Path

ID_PATTERN = r"[a-z][a-z0-9_]*"
ID_HINT = "lowercase letters, digits and underscores, starting with a letter"
COLUMN_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"
COLUMN_HINT = "a column name (letters, digits and underscores, not starting with a digit)"


def named(kind: str, plural: str) -> Any:
    """A namer for messages about a list item: `source 'orders'` by its id, else `sources[2]`."""
    def what(value: Any, path: Path) -> str:
        if isinstance(value, dict) and isinstance(value.get("id"), str):
            return f"{kind} {value['id']!r}"
        index = path[-1] if path else 0
        return f"{plural}[{index}]"
    return what


def exactly_one(keys: tuple[str, ...], noun: str) -> Any:
    """A rule that a mapping has exactly one of `keys`, reported at the second one present."""
    def rule(value: dict[str, Any], path: Path, ck: Checker) -> None:
        present = [k for k in keys if k in value]
        if len(present) == 1:
            return
        what = f"{noun}"
        if not present:
            ck.report(path, f"{what} needs exactly one of {', '.join(keys)}")
        else:
            ck.report((*path, present[1]), f"{what} needs exactly one of {', '.join(keys)}; "
                      f"it has {' and '.join(present)}", at_key=True)
    return rule
