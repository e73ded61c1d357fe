"""The pipeline file reference (pipeline/reference.py) covers every key of `streamer schema`.

The docs site renders the page from the schema at build time; these tests check the generator
against an independent walk of the schema, so a key the generator skipped fails here.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import pytest

from streamer.pipeline.reference import default_of, key_paths, render
from streamer.pipeline.schema import json_schema


def property_paths(schema: dict[str, Any], path: str = "") -> Iterator[str]:
    """Every key path of a JSON Schema: the keys of every `properties`, wherever it is nested
    (list items `[]`, `type:` variants `[type=kind]`, user-named mapping values `.<name>`).
    """
    for key, sub in schema.get("properties", {}).items():
        child = f"{path}.{key}" if path else key
        yield child
        yield from property_paths(sub, child)
    if isinstance(schema.get("items"), dict):
        yield from property_paths(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from property_paths(schema["additionalProperties"], f"{path}.<name>")
    for branch in schema.get("anyOf", []):
        yield from property_paths(branch, path)
    for branch in schema.get("oneOf", []):
        kind = branch["properties"]["type"]["const"]
        yield from property_paths(branch, f"{path.removesuffix('[]')}[type={kind}]")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return json_schema()


def entries(page: str) -> dict[str, tuple[str, str]]:
    """The page's keys, each with its line of facts and its description: an entry is
    `` `path` ``, then `:   facts`, a blank line and the indented description."""
    lines = page.splitlines()
    found: dict[str, tuple[str, str]] = {}
    for i, line in enumerate(lines):
        if line.startswith(":   "):
            path = re.fullmatch(r"`([^`]+)`", lines[i - 1])
            assert path is not None, lines[i - 1]
            assert path.group(1) not in found  # one entry per key
            found[path.group(1)] = (line[4:], lines[i + 2].strip())
    return found


def paths_in(page: str) -> list[str]:
    """The keys of the page, in order."""
    return list(entries(page))


def test_every_key_of_the_schema_has_a_row(schema: dict[str, Any]) -> None:
    page = render(schema)
    paths = list(property_paths(schema))
    rows = paths_in(page)
    assert len(paths) > 100  # the walk found the file's keys, not an empty schema
    missing = [p for p in paths if p not in rows]
    assert missing == []
    assert sorted(rows) == sorted(paths)  # one row per key, nothing invented
    assert key_paths(schema) == rows
    for expected in ("job.execution.task_sink", "sources[type=kafka].client",
                     "operators[].window.sliding.slide", "sinks[type=files].format",
                     "tests[].expect"):
        assert expected in rows


def test_every_key_is_described(schema: dict[str, Any]) -> None:
    """A key without a description would be a bare row in the reference: describe it in
    pipeline/schema.py (the `type` tags are described by the generator).
    """
    bare = [path for path, (_, described) in entries(render(schema)).items() if not described]
    assert bare == []


def test_a_new_key_appears_without_touching_the_generator(schema: dict[str, Any]) -> None:
    changed = copy.deepcopy(schema)
    execution = changed["properties"]["job"]["properties"]["execution"]["properties"]
    execution["new_knob"] = {"type": "integer", "minimum": 2,
                             "description": "A knob (default 7)."}
    (kafka,) = (s for s in changed["properties"]["sinks"]["items"]["oneOf"]
                if "bootstrap_servers" in s["properties"])
    kafka["properties"]["linger"] = {"type": "string",
                                     "pattern": r"^\s*\d+(\.\d+)?\s*(ms|s|m|h|d)\s*$",
                                     "description": "Wait before sending."}
    page = entries(render(changed))
    assert page["job.execution.new_knob"] == ("integer · default 7 · allowed: ≥ 2",
                                              "A knob (default 7).")
    assert page["sinks[type=kafka].linger"][0].startswith("duration ·")
    assert "job.execution.new_knob" not in render(schema)


def test_types_defaults_and_allowed_values(schema: dict[str, Any]) -> None:
    rows = entries(render(schema))
    assert rows["job.checkpoint.interval"][0].startswith("duration · default `10s` ·")
    assert rows["job.parallelism"][0] == ("integer · default Spark's default parallelism · "
                                          "allowed: ≥ 1")
    assert "allowed: `exactly_once`, `at_least_once`" in rows["job.checkpoint.mode"][0]
    assert rows["job.max_parallelism"][0].endswith("allowed: ≥ 1; ≤ 32768")
    assert rows["sources[type=files].path"][0].startswith("string · **required**")
    # required of every operator but a join, which names left and right instead (validation)
    assert rows["operators[].input"][0].startswith("string or list of string · allowed")
    assert rows["operators[].join.left"][0].startswith("string · **required**")
    # a section's link and `<` escaped outside code spans
    assert "[`job.execution`](#job-execution)" in rows["job.execution"][1]
    assert "array&lt;string&gt;" in rows["sources[type=files].schema"][1]


@pytest.mark.parametrize(("description", "default"), [
    ("Completed checkpoints kept (default 3).", "3"),
    ("Stable identity (default: the id).", "the id"),
    ("Watch for new files (unbounded); default false.", "false"),
    ("Small epochs. Default 20000; 0 turns the mode off.", "20000"),
    ("Keyed subtasks read files. Default true. $VAR overrides it.", "true"),
    ("Topics to read.", ""),
])
def test_default_is_read_from_the_description(description: str, default: str) -> None:
    assert default_of({"description": description}) == default
    assert default_of({"description": description, "default": 5}) == "`5`"
