"""A small declarative model of the pipeline file: one description that both validates user
YAML (with messages that point at `file:line:col` and name the nearest valid key) and renders
the JSON Schema that editors use. The concrete model is in `pipeline/schema.py`; its `job:`
block, its sources, its sinks, `storage_options:` and its tests are pydantic models
(`pipeline/*_model.py`, run by `pipeline/pydantic_bridge.py`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamer.pipeline.units import (
    DURATION_HINT,
    DURATION_PATTERN,
    SIZE_HINT,
    parse_duration_ms,
    parse_signed_duration_ms,
    parse_size_bytes,
)
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


class Node:
    """One kind of value in the pipeline file."""

    description: str = ""

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        """Report every problem with `value` at `path`."""
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        """Render as JSON Schema (draft 2020-12)."""
        raise NotImplementedError

    def _with_doc(self, schema: dict[str, Any]) -> dict[str, Any]:
        if self.description:
            schema["description"] = self.description
        return schema


@dataclass
class Str(Node):
    """A string, optionally restricted by a pattern (with a readable hint) or a set of values."""

    description: str = ""
    pattern: str | None = None
    pattern_hint: str = ""
    enum: tuple[str, ...] = ()
    non_empty: bool = True

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        if self.enum:
            if value not in self.enum:
                shown = value if isinstance(value, str) else type_name(value)
                hint = nearest(str(value), self.enum) if isinstance(value, str) else None
                extra = f" (did you mean {hint!r}?)" if hint else ""
                ck.report(path, f"{label(path)} must be one of {', '.join(self.enum)}; got "
                          f"{shown!r}{extra}" if isinstance(value, str) else
                          f"{label(path)} must be one of {', '.join(self.enum)}; got {shown}")
            return
        if not isinstance(value, str):
            ck.report(path, f"{label(path)} must be a string, got {type_name(value)}")
            return
        if self.non_empty and not value.strip():
            ck.report(path, f"{label(path)} must not be empty")
            return
        if self.pattern and not re.fullmatch(self.pattern, value):
            ck.report(path, f"{label(path)} {value!r} must be {self.pattern_hint or self.pattern}")

    def schema(self) -> dict[str, Any]:
        if self.enum:
            return self._with_doc({"enum": list(self.enum)})
        out: dict[str, Any] = {"type": "string"}
        if self.pattern:
            out["pattern"] = f"^{self.pattern}$"
        if self.non_empty:
            out["minLength"] = 1
        return self._with_doc(out)


@dataclass
class Int(Node):
    """An integer with optional bounds; `hint` (the fix, e.g. "0 turns it off") ends every
    message about it.
    """

    description: str = ""
    minimum: int | None = None
    maximum: int | None = None
    hint: str = ""

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        fix = f"; {self.hint}" if self.hint else ""
        if isinstance(value, bool) or not isinstance(value, int):
            ck.report(path, f"{label(path)} must be a whole number, got {type_name(value)}"
                      f"{fix}")
        elif self.minimum is not None and value < self.minimum:
            ck.report(path, f"{label(path)} must be at least {self.minimum}, got {value}{fix}")
        elif self.maximum is not None and value > self.maximum:
            ck.report(path, f"{label(path)} must be at most {self.maximum}, got {value}{fix}")

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "integer"}
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return self._with_doc(out)


@dataclass
class Bool(Node):
    """true or false."""

    description: str = ""

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        if not isinstance(value, bool):
            ck.report(path, f"{label(path)} must be true or false, got {type_name(value)}")

    def schema(self) -> dict[str, Any]:
        return self._with_doc({"type": "boolean"})


@dataclass
class Duration(Node):
    """A duration string such as `10s`."""

    description: str = ""
    allow_zero: bool = False

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        ms = parse_duration_ms(value)
        if ms is None and parse_duration_ms(value, whole=False) is not None:
            ck.report(path, f"{label(path)} must be a whole number of milliseconds, got "
                      f"{type_name(value)}")
        elif ms is None:
            ck.report(path, f"{label(path)} must be {DURATION_HINT}, got {type_name(value)}")
        elif ms == 0 and not self.allow_zero:
            ck.report(path, f"{label(path)} must be longer than 0")

    def schema(self) -> dict[str, Any]:
        return self._with_doc({"type": "string", "pattern": DURATION_PATTERN})


@dataclass
class SignedDuration(Node):
    """A duration that may be negative or zero, such as `-10m` (a join's `between` bounds)."""

    description: str = ""

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        if parse_signed_duration_ms(value) is None:
            ck.report(path, f"{label(path)} must be {DURATION_HINT}, optionally with a "
                      f"leading '-', got {type_name(value)}")

    def schema(self) -> dict[str, Any]:
        return self._with_doc({"type": "string",
                               "pattern": r"^\s*-?\d+(\.\d+)?\s*(ms|s|m|h|d)\s*$"})


@dataclass
class Size(Node):
    """A size such as `64MB`."""

    description: str = ""

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        if parse_size_bytes(value) is None:
            ck.report(path, f"{label(path)} must be {SIZE_HINT}, got {type_name(value)}")

    def schema(self) -> dict[str, Any]:
        return self._with_doc({"type": ["string", "integer"]})


@dataclass
class Scalar(Node):
    """Any string, number or boolean (Spark configuration values, test rows' cells)."""

    description: str = ""

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        if isinstance(value, dict | list) or value is None:
            ck.report(path, f"{label(path)} must be a string, number or boolean, got "
                      f"{type_name(value)}")

    def schema(self) -> dict[str, Any]:
        return self._with_doc({"type": ["string", "number", "boolean"]})


@dataclass
class AnyValue(Node):
    """Anything (rows in a tests block, client properties)."""

    description: str = ""

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        return

    def schema(self) -> dict[str, Any]:
        return self._with_doc({})


@dataclass
class ListOf(Node):
    """A list whose items are all of one kind."""

    item: Node
    description: str = ""
    min_items: int = 0

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        if not isinstance(value, list):
            ck.report(path, f"{label(path)} must be a list, got {type_name(value)}")
            return
        if len(value) < self.min_items:
            ck.report(path, f"{label(path)} needs at least {self.min_items} "
                      f"entr{'y' if self.min_items == 1 else 'ies'}")
        for i, item in enumerate(value):
            self.item.check(item, (*path, i), ck)

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array", "items": self.item.schema()}
        if self.min_items:
            out["minItems"] = self.min_items
        return self._with_doc(out)


@dataclass
class OneOrList(Node):
    """A single value, or a non-empty list of them (`input: a` or `input: [a, b]`)."""

    item: Node
    description: str = ""
    noun: str = "id"
    #: `[]` is a value too (`key_by: []`: one key for every record).
    allow_empty: bool = False

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        if isinstance(value, list):
            if not value and not self.allow_empty:
                ck.report(path, f"{label(path)} must name at least one {self.noun}")
            for i, item in enumerate(value):
                self.item.check(item, (*path, i), ck)
        else:
            self.item.check(value, path, ck)

    def schema(self) -> dict[str, Any]:
        item = self.item.schema()
        return self._with_doc({"anyOf": [item, {"type": "array", "items": item,
                                                "minItems": 0 if self.allow_empty else 1}]})


@dataclass
class MapOf(Node):
    """A mapping from user-chosen names to values of one kind (`fields:`, `select:`)."""

    value: Node
    description: str = ""
    key_pattern: str | None = None
    key_hint: str = ""
    min_items: int = 0

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        if not isinstance(value, dict):
            ck.report(path, f"{label(path)} must be a mapping of name: value, got "
                      f"{type_name(value)}")
            return
        if len(value) < self.min_items:
            ck.report(path, f"{label(path)} needs at least {self.min_items} entr"
                      f"{'y' if self.min_items == 1 else 'ies'}")
        for key, item in value.items():
            if self.key_pattern and not re.fullmatch(self.key_pattern, key):
                ck.report((*path, key), f"name {key!r} must be {self.key_hint}", at_key=True)
            self.value.check(item, (*path, key), ck)

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object", "additionalProperties": self.value.schema()}
        if self.key_pattern:
            out["propertyNames"] = {"pattern": f"^{self.key_pattern}$"}
        if self.min_items:
            out["minProperties"] = self.min_items
        return self._with_doc(out)


@dataclass
class Field:
    """A key of an `Obj`."""

    node: Node
    required: bool = False


Rule = Callable[[dict[str, Any], Path, Checker], None]


@dataclass
class Obj(Node):
    """A mapping with a fixed set of keys. `what(value, path)` names it in messages
    (e.g. "operator 'clean'"); `rules` check relations between keys.
    """

    fields: dict[str, Field]
    description: str = ""
    what: Callable[[Any, Path], str] | None = None
    rules: list[Rule] = field(default_factory=list)
    extra_keys: tuple[str, ...] = ()  # keys valid here but described by a wrapper (e.g. `type`)

    def name_of(self, value: Any, path: Path) -> str:
        """How messages refer to this mapping."""
        if self.what:
            return self.what(value, path)
        return f"{label(path)}" if path else "the pipeline"

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        if not isinstance(value, dict):
            ck.report(path, f"{label(path)} must be a mapping, got {type_name(value)}")
            return
        valid = list(self.fields) + list(self.extra_keys)
        for key in value:
            if key not in valid:
                ck.report((*path, key), f"unknown key {key!r} in {self.name_of(value, path)}"
                          f"{did_you_mean(key, valid)}", at_key=True)
        for name, f in self.fields.items():
            if name in value:
                f.node.check(value[name], (*path, name), ck)
            elif f.required:
                ck.report(path, f"{self.name_of(value, path)} is missing required key {name!r}")
        for rule in self.rules:
            rule(value, path, ck)

    def schema(self) -> dict[str, Any]:
        props = {name: f.node.schema() for name, f in self.fields.items()}
        required = [name for name, f in self.fields.items() if f.required]
        out: dict[str, Any] = {"type": "object", "properties": props,
                               "additionalProperties": False}
        if required:
            out["required"] = required
        return self._with_doc(out)
