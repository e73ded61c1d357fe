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


def test_every_key_of_the_schema_has_a_row(schema: dict[str, Any]) -> None:
    page = render(schema)
    paths = list(property_paths(schema))
    rows = re.findall(r"^\| `([^`]+)` \|", page, flags=re.M)
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
    bare = []
    page = render(schema)
    for line in page.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if not cells[5]:
                bare.append(cells[0])
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
    page = render(changed)
    row = next(line for line in page.splitlines()
               if line.startswith("| `job.execution.new_knob`"))
    assert row == "| `job.execution.new_knob` | integer |  | 7 | ≥ 2 | A knob (default 7). |"
    assert "| `sinks[type=kafka].linger` | duration |" in page
    assert "job.execution.new_knob" not in render(schema)


def test_types_defaults_and_allowed_values(schema: dict[str, Any]) -> None:
    rows = {line.split(" | ")[0][3:-1]: line for line in render(schema).splitlines()
            if line.startswith("| `")}
    assert rows["job.checkpoint.interval"].startswith(
        "| `job.checkpoint.interval` | duration |  | 10s |")
    assert "| `exactly_once` · `at_least_once` |" in rows["job.checkpoint.mode"]
    assert "| ≥ 1; ≤ 32768 |" in rows["job.max_parallelism"]
    assert "| `sources[type=files].path` | string | yes |" in rows["sources[type=files].path"]
    # required of every operator but a join, which names left and right instead (validation)
    assert "| string or list of string |  |" in rows["operators[].input"]
    assert "| string | yes |" in rows["operators[].join.left"]
    # a section's link and `<` escaped outside code spans
    assert "[`job.execution`](#job-execution)" in rows["job.execution"]
    assert "array&lt;string&gt;" in rows["sources[type=files].schema"]


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
