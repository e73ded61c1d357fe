"""Durations and sizes as the pipeline file writes them, and the JSON Schema for editors."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from streamer.pipeline.schema import PipelineModel, json_schema
from streamer.pipeline.units import format_duration_ms, parse_duration_ms

PIPELINES_DIR = Path(__file__).resolve().parents[2] / "pipelines"
UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

# ---------------------------------------------------------------------------- durations


@pytest.mark.parametrize(("text", "ms"), [
    ("0ms", 0), ("0s", 0), ("1ms", 1), ("250ms", 250), ("10s", 10_000), ("5m", 300_000),
    ("2h", 7_200_000), ("1d", 86_400_000), ("1.5s", 1500), ("0.25m", 15_000),
    (" 10s ", 10_000), ("10 s", 10_000), ("007s", 7000),
])
def test_parse_duration_ms(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("value", [
    "10 seconds", "10", "s", "", "-1s", "1S", "1sec", "1.s", ".5s", "1e3ms", "1m30s",
    10, 1.5, None, True, ["1s"],
])
def test_parse_duration_ms_rejects(value: object) -> None:
    assert parse_duration_ms(value) is None


@pytest.mark.parametrize(("ms", "text"), [
    (0, "0ms"), (1, "1ms"), (999, "999ms"), (1000, "1s"), (1500, "1500ms"), (60_000, "1m"),
    (90_000, "90s"), (3_600_000, "1h"), (5_400_000, "90m"), (86_400_000, "1d"),
    (172_800_000, "2d"), (90_000_000, "25h"),
])
def test_format_duration_ms_is_the_shortest_exact_form(ms: int, text: str) -> None:
    assert format_duration_ms(ms) == text


@given(st.integers(min_value=0, max_value=10**13))
def test_format_then_parse_round_trips(ms: int) -> None:
    assert parse_duration_ms(format_duration_ms(ms)) == ms


@given(st.integers(min_value=1, max_value=10**13))
def test_format_uses_the_largest_exact_unit(ms: int) -> None:
    text = format_duration_ms(ms)
    number, unit = re.fullmatch(r"(\d+)(ms|s|m|h|d)", text).groups()  # type: ignore[union-attr]
    assert int(number) * UNIT_MS[unit] == ms
    bigger = [u for u, size in UNIT_MS.items() if size > UNIT_MS[unit]]
    assert all(ms % UNIT_MS[u] for u in bigger)


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(sorted(UNIT_MS)))
def test_parse_whole_number_of_any_unit(n: int, unit: str) -> None:
    assert parse_duration_ms(f"{n}{unit}") == n * UNIT_MS[unit]


@given(st.integers(min_value=0, max_value=10**7))
@example(1005)
def test_decimal_seconds_are_exact(ms: int) -> None:
    seconds = f"{ms // 1000}.{ms % 1000:03d}s"
    assert parse_duration_ms(seconds) == ms


# ---------------------------------------------------------------------------- JSON Schema

SCHEMA_KEYWORDS = {
    "$schema", "$id", "title", "description", "type", "properties", "required",
    "additionalProperties", "items", "minItems", "minProperties", "propertyNames", "pattern",
    "minLength", "minimum", "maximum", "exclusiveMinimum", "enum", "const", "oneOf", "anyOf",
    "default",  # (the meta-data vocabulary; the pydantic models give their keys' defaults)
}
JSON_TYPES = {"object", "array", "string", "integer", "number", "boolean", "null"}


def subschemas(schema: dict[str, Any], where: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object nested in `schema` (following only schema-valued keywords)."""
    yield where, schema
    for name, sub in schema.get("properties", {}).items():
        yield from subschemas(sub, f"{where}/properties/{name}")
    for key in ("items", "additionalProperties", "propertyNames"):
        if isinstance(schema.get(key), dict):
            yield from subschemas(schema[key], f"{where}/{key}")
    for key in ("oneOf", "anyOf"):
        for i, sub in enumerate(schema.get(key, [])):
            yield from subschemas(sub, f"{where}/{key}/{i}")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return json_schema()


def test_schema_header(schema: dict[str, Any]) -> None:
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].endswith(".json")
    assert schema["title"]
    assert schema["type"] == "object"
    assert json.loads(json.dumps(schema)) == schema


def test_schema_lists_every_top_level_key(schema: dict[str, Any]) -> None:
    assert list(schema["properties"]) == ["name", "description", "storage", "storage_options",
                                          "job", "spark", "sources", "operators", "sinks",
                                          "tests"]
    assert list(schema["properties"]) == list(PipelineModel.model_fields)
    assert sorted(schema["required"]) == ["name", "sinks", "sources"]
    assert schema["additionalProperties"] is False


def test_schema_uses_only_draft_2020_12_keywords(schema: dict[str, Any]) -> None:
    for where, sub in subschemas(schema):
        assert set(sub) <= SCHEMA_KEYWORDS, where
        types = sub.get("type", [])
        assert set([types] if isinstance(types, str) else types) <= JSON_TYPES, where
        if "pattern" in sub:
            re.compile(sub["pattern"])
        if "required" in sub:
            assert set(sub["required"]) <= set(sub["properties"]), where
        if "description" in sub:
            assert isinstance(sub["description"], str) and sub["description"], where
        if "default" in sub:  # a default is a value the key itself accepts, as written
            jsonschema = pytest.importorskip("jsonschema")
            assert jsonschema.Draft202012Validator(sub).is_valid(sub["default"]), where


def test_every_object_with_properties_forbids_unknown_keys(schema: dict[str, Any]) -> None:
    objects = [(w, s) for w, s in subschemas(schema) if "properties" in s]
    assert len(objects) > 15
    for where, sub in objects:
        assert sub["type"] == "object", where
        assert sub["additionalProperties"] is False, where


@pytest.mark.parametrize(("section", "kinds"), [
    ("sources", ["datagen", "files", "kafka"]),
    ("sinks", ["console", "delta", "files", "kafka", "postgres"]),
])
def test_sources_and_sinks_are_one_of_their_types(schema: dict[str, Any], section: str,
                                                  kinds: list[str]) -> None:
    listing = schema["properties"][section]
    assert listing["type"] == "array"
    assert listing["minItems"] == 1
    branches = listing["items"]["oneOf"]
    # `{"const": k}`, and `"type": "string"` beside it where the pydantic models give it
    assert [b["properties"]["type"]["const"] for b in branches] == kinds
    assert all(set(b["properties"]["type"]) <= {"const", "type"}
               and b["properties"]["type"].get("type", "string") == "string" for b in branches)
    for branch in branches:
        assert {"id", "type"} <= set(branch["required"])
        assert branch["additionalProperties"] is False
        assert branch["properties"]["id"]["pattern"] == "^[a-z][a-z0-9_]*$"


def test_type_specific_keys(schema: dict[str, Any]) -> None:
    datagen, files, kafka = schema["properties"]["sources"]["items"]["oneOf"]
    assert "fields" in datagen["required"]
    assert files["properties"]["format"]["enum"] == ["jsonl", "csv", "parquet", "text"]
    assert kafka["properties"]["start"]["enum"] == ["earliest", "latest"]
    operator = schema["properties"]["operators"]["items"]
    assert {"filter", "select", "with_columns", "key_by", "window", "aggregate", "dedupe",
            "process", "join", "late"} <= set(operator["properties"])
    assert sorted(operator["required"]) == ["id"]  # (a join has no input: it has left, right)
    window = operator["properties"]["window"]["properties"]
    assert {"tumbling", "sliding", "session", "count", "until", "time", "allowed_lateness",
            "late", "emit"} == set(window)


@pytest.mark.parametrize("text", ["250ms", "10s", "1.5m", "2h", "1d", " 5s ", "10 seconds",
                                  "10", "1S", "-1s", "1m30s"])
def test_schema_duration_pattern_agrees_with_the_parser(schema: dict[str, Any],
                                                        text: str) -> None:
    pattern = schema["properties"]["job"]["properties"]["epoch"]["pattern"]
    assert bool(re.search(pattern, text)) == (parse_duration_ms(text) is not None)


EXAMPLES = sorted([*PIPELINES_DIR.glob("*.yaml"), *PIPELINES_DIR.glob("*.yml")])

VALID_DOC = """\
    name: clicks-per-user
    job: {parallelism: 2, epoch: 1s, checkpoint: {interval: 10s, mode: exactly_once}}
    spark: {spark.sql.shuffle.partitions: "4"}
    sources:
      - id: clicks
        type: datagen
        fields: {user: "concat('u', offset % 10)", ts: "timestamp_millis(offset)"}
        event_time: ts
        watermark: {max_out_of_orderness: 5s}
    operators:
      - id: counts
        input: [clicks]
        key_by: [user]
        window: {tumbling: 1m}
        aggregate: {clicks: count()}
    sinks:
      - id: out
        type: console
        input: counts
    tests:
      - name: smoke
        inputs: {clicks: [{user: a, ts: "2026-01-01T00:00:01Z"}]}
        expect: {out: []}
    """


def test_schema_is_valid_draft_2020_12(schema: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(schema)


def test_schema_accepts_a_valid_document_and_rejects_unknown_keys(
    schema: dict[str, Any],
) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(schema)
    doc = yaml.safe_load(textwrap.dedent(VALID_DOC))
    assert list(validator.iter_errors(doc)) == []
    doc["sources"][0]["feilds"] = doc["sources"][0].pop("fields")
    assert list(validator.iter_errors(doc))
    doc = yaml.safe_load(textwrap.dedent(VALID_DOC))
    doc["sinks"][0]["type"] = "consle"
    assert list(validator.iter_errors(doc))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_pipelines_match_the_schema(schema: dict[str, Any], path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    # As editors' YAML 1.2 language servers read it (PyYAML's YAML 1.1 would turn a join's
    # `on:` key into True); streamer's loader is YAML 1.2 too.
    from streamer.pipeline.yaml_loader import load_file

    doc, _ = load_file(str(path), {})
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]
    assert errors == []
