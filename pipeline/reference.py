"""The pipeline file's reference page, generated from its JSON Schema (`streamer schema`).

The docs site renders this page at build time (`docs/hooks.py`), so the reference lists exactly
the keys that `streamer validate` accepts and cannot drift from them. Every key of every mapping
gets an entry: its full path, type, whether it is required, its default, the values it allows
and its description. Paths name list items `[]` and the variants of a `type:`-tagged list item
`[type=files]`, e.g. `sources[type=files].path`; a mapping of user-chosen names is `.<name>`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from streamer.pipeline.units import DURATION_PATTERN

#: A key's default: its JSON Schema `default` (the pydantic models give one), else the one its
#: description states: "(default 10s)", "(default: the id)", "Default 20000; ...", "...;
#: default false." (a default that depends on the input or the environment is written in words).
_DEFAULT = re.compile(r"\(default:? ([^)]+)\)|(?:^|[.;] )[Dd]efault ([^;.]+(?:\.\d+)?)[;.]")


@dataclass
class Row:
    """One key of a mapping."""

    path: str
    schema: dict[str, Any]
    required: bool


@dataclass
class Section:
    """A mapping with fixed keys: its path, description and keys."""

    path: str
    description: str
    rows: list[Row] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        """The section's HTML id, from its path."""
        return re.sub(r"[^a-z0-9]+", "-", self.path.lower()).strip("-") or "pipeline"


def key_paths(schema: dict[str, Any]) -> list[str]:
    """Every key path of the schema, in the page's notation, in document order."""
    return [row.path for section in sections(schema) for row in section.rows]


def sections(schema: dict[str, Any]) -> list[Section]:
    """The schema's mappings with fixed keys, outermost first, each with its keys."""
    return list(_walk(schema, ""))


def _walk(schema: dict[str, Any], path: str) -> Iterator[Section]:
    if "properties" in schema:
        required = set(schema.get("required", []))
        section = Section(path, schema.get("description", ""))
        children: list[tuple[dict[str, Any], str]] = []
        for key, sub in schema["properties"].items():
            sub_path = f"{path}.{key}" if path else key
            section.rows.append(Row(sub_path, sub, key in required))
            children.append((sub, sub_path))
        yield section
        for sub, sub_path in children:
            yield from _walk(sub, sub_path)
        return
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")
    elif isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}.<name>")
    for branch in schema.get("anyOf", []):
        yield from _walk(branch, path)
    for branch in schema.get("oneOf", []):
        tag = _tag(branch)
        base = path[:-2] if path.endswith("[]") else path
        yield from _walk(branch, f"{base}[type={tag}]" if tag else path)


def _tag(branch: dict[str, Any]) -> str | None:
    tag = branch.get("properties", {}).get("type", {})
    return str(tag["const"]) if "const" in tag else None


def type_of(schema: dict[str, Any]) -> str:
    """A short, readable type: `duration`, `list of string`, `mapping of name to string`."""
    if "const" in schema:
        return "string" if isinstance(schema["const"], str) else "value"
    if "enum" in schema:
        return "string" if all(isinstance(v, str) for v in schema["enum"]) else "value"
    if "anyOf" in schema:
        return " or ".join(type_of(branch) for branch in schema["anyOf"])
    if "oneOf" in schema:
        tags = [t for t in (_tag(b) for b in schema["oneOf"]) if t]
        return f"mapping, by `type`: {', '.join(tags)}" if tags else "one of several"
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "string" and schema.get("pattern") == DURATION_PATTERN:
        return "duration"
    if kind == "array":
        return f"list of {_plural(type_of(schema.get('items', {})))}"
    if kind == "object" and "properties" not in schema:
        values = schema.get("additionalProperties")
        return f"mapping of name to {type_of(values)}" if isinstance(values, dict) \
            else "mapping"
    if kind == "object":
        return "mapping"
    return str(kind) if kind else "any"


def _plural(kind: str) -> str:
    return {"mapping": "mappings"}.get(kind, kind)


def allowed(schema: dict[str, Any]) -> list[str]:
    """What the schema allows beyond the type: values, bounds, patterns, sizes."""
    out: list[str] = []
    if "const" in schema:
        out.append(f"`{schema['const']}`")
    if "enum" in schema:
        out.append(", ".join(f"`{v}`" for v in schema["enum"]))
    if "minimum" in schema:
        out.append(f"≥ {schema['minimum']}")
    if "exclusiveMinimum" in schema:
        out.append(f"> {schema['exclusiveMinimum']}")
    if "maximum" in schema:
        out.append(f"≤ {schema['maximum']}")
    pattern = schema.get("pattern")
    if pattern == DURATION_PATTERN:
        out.append("e.g. `250ms`, `10s`, `5m`")
    elif pattern:
        out.append(f"matches `{pattern}`")
    if schema.get("minLength"):
        out.append("not empty")
    if schema.get("minItems"):
        out.append(f"at least {schema['minItems']}")
    if schema.get("minProperties"):
        out.append(f"at least {schema['minProperties']} entr"
                   f"{'y' if schema['minProperties'] == 1 else 'ies'}")
    names = schema.get("propertyNames", {}).get("pattern")
    if names:
        out.append(f"names match `{names}`")
    items = schema.get("items")
    if isinstance(items, dict) and "properties" not in items and "oneOf" not in items:
        out.extend(f"each: {a}" for a in allowed(items))
    values = schema.get("additionalProperties")
    if isinstance(values, dict) and "properties" not in values:
        out.extend(f"values: {a}" for a in allowed(values))
    for branch in schema.get("anyOf", []):
        for a in allowed(branch):
            if a not in out:
                out.append(a)
    return out


def default_of(schema: dict[str, Any]) -> str:
    """The default: the schema's `default`, else the one its description states, else ""."""
    if "default" in schema:  # a string as the file writes it: `10s`, `exactly_once`
        default = schema["default"]
        if default == "":  # `description:`'s: nothing, which a code span cannot show
            return "empty"
        return f"`{default if isinstance(default, str) else json.dumps(default)}`"
    match = _DEFAULT.search(schema.get("description", ""))
    if not match:
        return ""
    return (match.group(1) or match.group(2)).strip()


def description_of(schema: dict[str, Any]) -> str:
    """The description of a key, or of what its list or mapping holds."""
    text = str(schema.get("description", ""))
    if "const" in schema and not text:
        text = f"The kind that the keys below belong to: `type: {schema['const']}`."
    inner = schema.get("items") or schema.get("additionalProperties")
    if isinstance(inner, dict) and inner.get("description") and "properties" not in inner \
            and "oneOf" not in inner:
        text = f"{text} Each: {inner['description']}".strip()
    return text


def _text(text: str) -> str:
    """Markdown for generated text: outside code spans, `<`, `>` and `&` made entities so
    that `array<string>` is text, not an HTML tag."""
    parts = text.replace("\n", " ").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _link(row: Row, anchors: dict[str, str]) -> str:
    """A link to the section of the mapping(s) a key holds, if it holds any."""
    holds = re.compile(re.escape(row.path) + r"(?:\[\]|\[type=[^\]]+\]|\.<name>)*")
    targets = [(path, anchor) for path, anchor in anchors.items() if holds.fullmatch(path)]
    return ", ".join(f"[`{path}`](#{anchor})" for path, anchor in targets)


def facts(row: Row) -> str:
    """A key's one line of facts: its type, whether it is required, its default and what
    it allows, separated by `·`."""
    out = [_text(type_of(row.schema))]
    if row.required:
        out.append("**required**")
    default = default_of(row.schema)
    if default:
        out.append(f"default {_text(default)}")
    limits = allowed(row.schema)
    if limits:
        out.append(f"allowed: {_text('; '.join(limits))}")
    return " · ".join(out)


def render(schema: dict[str, Any]) -> str:
    """The reference page (Markdown) for a pipeline-file JSON Schema.

    One entry per key, stacked (a definition list): the key's full path, a line of facts
    (type, required, default, allowed) and its description below. Six columns of a table
    broke the paths mid-word and clipped the descriptions at a laptop's width.
    """
    found = sections(schema)
    anchors = {s.path: s.anchor for s in found if s.path}
    lines = [
        "# Pipeline file reference",
        "",
        "<!-- Generated from `streamer schema` (the pydantic models of pipeline/schema.py and "
        "pipeline/*_model.py) by pipeline/reference.py when the site is built: edit the "
        "schema's descriptions, not this page. -->",
        "",
        "Every key of the pipeline file (version 1), generated from its JSON Schema, the one "
        "`streamer schema` prints and `streamer validate` enforces. A key's path names list "
        "items `[]`, the kinds of source and sink `[type=...]` and user-chosen names "
        "`<name>`: `sources[type=files].path` is the `path:` of a `type: files` source. "
        "Durations are a number and a unit: `250ms`, `10s`, `5m`, `2h`, `1d`. "
        "A `${VAR}` or `${VAR:-default}` anywhere is read from the environment.",
        "",
        "Under each key: its type, **required** when it must be given, its default and the "
        "values it allows, then what it does.",
        "",
        f"{len(found)} mappings, {sum(len(s.rows) for s in found)} keys.",
        "",
    ]
    for section in found:
        title = f"`{section.path}`" if section.path else "The file"
        lines += [f"## {title} {{#{section.anchor}}}", ""]
        if section.description:
            lines += [_text(section.description), ""]
        for row in section.rows:
            see = _link(row, anchors)
            described = _text(description_of(row.schema)) + (f" See {see}." if see else "")
            lines += [f"`{row.path}`", f":   {facts(row)}", "", f"    {described}", ""]
    return "\n".join(lines)


def reference_markdown() -> str:
    """The reference page for this version of streamer's pipeline file."""
    from streamer.pipeline.schema import json_schema

    return render(json_schema())
