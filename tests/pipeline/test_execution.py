"""`job.execution`: the engine settings, from the pipeline file with their defaults, the
environment variables that override them for one run, and their place in the JSON Schema."""

from __future__ import annotations

import dataclasses
import os
import textwrap

import pytest

from streamer.exceptions import ConfigError, StreamerError
from streamer.pipeline.job_spec import ExecutionSpec, JobSpec
from streamer.pipeline.schema import json_schema
from streamer.pipeline.spec import PipelineSpec
from streamer.pipeline.validate import load_pipeline_text

KEYS = ("small_epoch_rows", "local_rows", "direct_read", "driver_subtasks", "task_sink",
        "staged_input", "arrow_input", "mode", "continuous_flush_interval",
        "continuous_batch_rows")
VARIABLES = {"small_epoch_rows": "STREAMER_SMALL_EPOCH_ROWS",
             "local_rows": "STREAMER_LOCAL_ROWS",
             "direct_read": "STREAMER_DIRECT_READ",
             "driver_subtasks": "STREAMER_DRIVER_SUBTASKS",
             "task_sink": "STREAMER_TASK_SINK",
             "staged_input": "STREAMER_STAGED_INPUT",
             "arrow_input": "STREAMER_ARROW_INPUT",
             "mode": "STREAMER_EXECUTION_MODE",
             "continuous_flush_interval": "STREAMER_CONTINUOUS_FLUSH_MS",
             "continuous_batch_rows": "STREAMER_CONTINUOUS_BATCH_ROWS"}
#: A value other than the default, as its variable writes it, for each key.
OTHER = {key: "0" if key in ("small_epoch_rows", "local_rows", "continuous_flush_interval")
         else "continuous" if key == "mode" else "7" if key == "continuous_batch_rows"
         else "false" for key in KEYS}


def load(execution: str = "", env: dict[str, str] | None = None) -> PipelineSpec:
    """A minimal pipeline whose `job:` block holds `execution` (YAML lines, if any)."""
    job = "job:\n  execution:\n" + textwrap.indent(textwrap.dedent(execution), "    ") \
        if execution else ""
    text = (f"name: p\n{job}sources:\n  - id: src\n    type: datagen\n"
            "    fields: {x: offset}\nsinks:\n  - id: out\n    type: console\n    input: src\n")
    return load_pipeline_text(text, file="p.yaml", env=env or {})


# ------------------------------------------------------------------------- from the file

def test_defaults_without_an_execution_block() -> None:
    execution = load().job.execution
    assert (execution.small_epoch_rows, execution.local_rows, execution.direct_read,
            execution.driver_subtasks, execution.task_sink, execution.staged_input,
            execution.arrow_input, execution.mode) == (20_000, 1_000, True, True, True, True,
                                                       True, "epochs")
    assert execution == ExecutionSpec() == JobSpec().execution
    assert execution.sources == dict.fromkeys(KEYS, "default")


def test_empty_execution_block_is_the_defaults() -> None:
    spec = load_pipeline_text(
        "name: p\njob: {execution: {}}\nsources: [{id: src, type: datagen, fields: {x: offset}}]"
        "\nsinks: [{id: out, type: console, input: src}]\n", file="p.yaml", env={})
    assert spec.job.execution == ExecutionSpec()
    assert set(spec.job.execution.sources.values()) == {"default"}


def test_every_value_from_the_file() -> None:
    execution = load("""\
        small_epoch_rows: 0
        local_rows: 5000
        direct_read: false
        driver_subtasks: false
        task_sink: false
        staged_input: false
        arrow_input: false
        mode: epochs
        continuous_flush_interval: 20ms
        continuous_batch_rows: 500
        """).job.execution
    assert execution == ExecutionSpec(small_epoch_rows=0, local_rows=5000, direct_read=False,
                                      driver_subtasks=False, task_sink=False,
                                      staged_input=False, arrow_input=False, mode="epochs",
                                      continuous_flush_interval=20, continuous_batch_rows=500)
    assert execution.sources == dict.fromkeys(KEYS, "file")


def test_a_value_written_as_the_default_still_comes_from_the_file() -> None:
    execution = load("local_rows: 1000\ntask_sink: false\n").job.execution
    assert execution.local_rows == 1000
    assert execution.task_sink is False
    assert execution.sources == {"small_epoch_rows": "default", "local_rows": "file",
                                 "direct_read": "default", "driver_subtasks": "default",
                                 "task_sink": "file", "staged_input": "default",
                                 "arrow_input": "default", "mode": "default",
                                 "continuous_flush_interval": "default",
                                 "continuous_batch_rows": "default"}
    assert execution.describe() == {"small_epoch_rows": (20_000, "default"),
                                    "local_rows": (1000, "file"),
                                    "direct_read": (True, "default"),
                                    "driver_subtasks": (True, "default"),
                                    "task_sink": (False, "file"),
                                    "staged_input": (True, "default"),
                                    "arrow_input": (True, "default"),
                                    "mode": ("epochs", "default"),
                                    "continuous_flush_interval": (5, "default"),
                                    "continuous_batch_rows": (10000, "default")}


def test_value_from_a_pipeline_variable() -> None:
    execution = load("local_rows: ${LOCAL_ROWS:-0}\n").job.execution
    assert execution.local_rows == 0
    assert load("local_rows: ${LOCAL_ROWS:-0}\n",
                env={"LOCAL_ROWS": "250"}).job.execution.local_rows == 250


def test_building_the_spec_ignores_the_override_variables() -> None:
    """The spec is what the file says; the runtime applies the overrides."""
    env = dict.fromkeys(VARIABLES.values(), "0")
    assert load("local_rows: 7\n", env=env).job.execution == ExecutionSpec(local_rows=7)


def test_execution_spec_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ExecutionSpec().local_rows = 5  # type: ignore[misc]


def test_unknown_origin_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="origins"):
        ExecutionSpec(sources={"local_rows": "cli"})
    with pytest.raises(ValueError, match="settings"):
        ExecutionSpec(sources={"local_row": "file"})


# --------------------------------------------------------------- environment overrides

def test_no_variables_change_nothing() -> None:
    execution = load("local_rows: 3\n").job.execution
    assert execution.with_overrides({}) is execution
    assert execution.with_overrides(dict.fromkeys(VARIABLES.values(), "")) is execution
    assert execution.with_overrides({"STREAMER_LOCAL_ROWS": "  "}) is execution


def test_variables_override_the_file_and_the_defaults() -> None:
    execution = load("""\
        small_epoch_rows: 100
        local_rows: 0
        direct_read: false
        """).job.execution
    out = execution.with_overrides({
        "STREAMER_SMALL_EPOCH_ROWS": "0", "STREAMER_LOCAL_ROWS": " 2500 ",
        "STREAMER_DIRECT_READ": "1", "STREAMER_TASK_SINK": "off",
        "STREAMER_STAGED_INPUT": "no", "STREAMER_ARROW_INPUT": "false", "UNRELATED": "x"})
    assert out == ExecutionSpec(small_epoch_rows=0, local_rows=2500, direct_read=True,
                                driver_subtasks=True, task_sink=False, staged_input=False,
                                arrow_input=False)
    assert out.sources == {"small_epoch_rows": "environment", "local_rows": "environment",
                           "direct_read": "environment", "driver_subtasks": "default",
                           "task_sink": "environment", "staged_input": "environment",
                           "arrow_input": "environment", "mode": "default",
                           "continuous_flush_interval": "default",
                           "continuous_batch_rows": "default"}
    assert execution.local_rows == 0  # the original is unchanged


def test_overrides_from_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in VARIABLES.values():
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("STREAMER_DIRECT_READ", "0")
    out = load("direct_read: true\n").job.execution.with_overrides(os.environ)
    assert out.direct_read is False
    assert out.describe()["direct_read"] == (False, "STREAMER_DIRECT_READ")


@pytest.mark.parametrize("key", KEYS)
def test_each_variable_overrides_its_own_setting(key: str) -> None:
    out = ExecutionSpec().with_overrides({VARIABLES[key]: OTHER[key]})
    assert getattr(out, key) in (0, False, "continuous", 7)
    assert getattr(out, key) != getattr(ExecutionSpec(), key)
    assert out.set_by(key) == VARIABLES[key]
    assert out.describe()[key] == (getattr(out, key), VARIABLES[key])
    for other in KEYS:
        if other != key:
            assert getattr(out, other) == getattr(ExecutionSpec(), other)
            assert out.set_by(other) is None


@pytest.mark.parametrize(("raw", "value"), [
    ("1", True), ("0", False), ("true", True), ("FALSE", False), ("Yes", True), ("no", False),
    ("ON", True), ("off", False), (" true ", True),
])
def test_switch_words(raw: str, value: bool) -> None:
    start = ExecutionSpec(driver_subtasks=not value)
    assert start.with_overrides({"STREAMER_DRIVER_SUBTASKS": raw}).driver_subtasks is value


@pytest.mark.parametrize("raw", ["maybe", "2", "-1", "y", "enabled", "tru"])
def test_invalid_switch_value_names_variable_value_choices_and_key(raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        ExecutionSpec().with_overrides({"STREAMER_TASK_SINK": raw})
    assert str(info.value) == (
        f"STREAMER_TASK_SINK={raw!r} is not valid: it overrides job.execution.task_sink and "
        "must be one of 1/0, true/false, yes/no, on/off; fix it, or unset it to use the "
        "pipeline's value (true)")
    assert isinstance(info.value, StreamerError)
    assert info.value.exit_code == 2


@pytest.mark.parametrize("raw", ["lots", "-1", "1.5", "1e3", "20_000", "²", "1,000"])
def test_invalid_row_count_names_variable_value_choices_and_key(raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        ExecutionSpec(local_rows=0).with_overrides({"STREAMER_LOCAL_ROWS": raw})
    assert str(info.value) == (
        f"STREAMER_LOCAL_ROWS={raw!r} is not valid: it overrides job.execution.local_rows and "
        "must be a whole number of rows >= 0 (0 never reads a slice on the driver); fix it, "
        "or unset it to use the pipeline's value (0)")


@pytest.mark.parametrize("raw", ["Continuous", "epoch", "1", "true", "streaming"])
def test_invalid_mode_names_variable_value_choices_and_key(raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        ExecutionSpec().with_overrides({"STREAMER_EXECUTION_MODE": raw})
    assert str(info.value) == (
        f"STREAMER_EXECUTION_MODE={raw!r} is not valid: it overrides job.execution.mode and "
        "must be one of epochs, continuous; fix it, or unset it to use the pipeline's value "
        "(epochs)")


def test_the_mode_variable_overrides_the_file() -> None:
    """(A file with mode: continuous is in tests/pipeline/test_continuous_support.py: this
    datagen pipeline cannot run continuously.)"""
    out = ExecutionSpec(mode="continuous", sources={"mode": "file"}).with_overrides(
        {"STREAMER_EXECUTION_MODE": " epochs "})
    assert (out.mode, out.describe()["mode"]) == ("epochs", ("epochs", "STREAMER_EXECUTION_MODE"))


def test_every_invalid_variable_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        ExecutionSpec().with_overrides({"STREAMER_SMALL_EPOCH_ROWS": "many",
                                        "STREAMER_LOCAL_ROWS": "10",
                                        "STREAMER_DIRECT_READ": "perhaps"})
    lines = str(info.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("STREAMER_SMALL_EPOCH_ROWS='many' is not valid: it overrides "
                               "job.execution.small_epoch_rows")
    assert "0 turns the small-epoch mode off" in lines[0]
    assert lines[1].startswith("STREAMER_DIRECT_READ='perhaps' is not valid: it overrides "
                               "job.execution.direct_read")


def test_override_variables_are_the_documented_ones() -> None:
    assert ExecutionSpec.VARIABLES == VARIABLES


# -------------------------------------------------------------------------- the schema

def test_schema_has_job_execution_with_all_its_keys() -> None:
    execution = json_schema()["properties"]["job"]["properties"]["execution"]
    assert execution["type"] == "object"
    assert execution["additionalProperties"] is False
    assert "required" not in execution
    props = execution["properties"]
    assert list(props) == list(KEYS)
    for key in ("small_epoch_rows", "local_rows"):
        assert props[key]["type"] == "integer"
        assert props[key]["minimum"] == 0
    for key in ("direct_read", "driver_subtasks", "task_sink", "staged_input", "arrow_input"):
        assert props[key]["type"] == "boolean"
    assert props["mode"]["enum"] == ["epochs", "continuous"]
    assert props["continuous_batch_rows"]["minimum"] == 1


@pytest.mark.parametrize("key", KEYS)
def test_each_key_documents_its_default_and_its_variable(key: str) -> None:
    """The schema's `default` is the spec's (both come from pipeline/job_model.py), and the
    description names the variable that overrides it."""
    schema = json_schema()["properties"]["job"]["properties"]["execution"]["properties"][key]
    if key == "continuous_flush_interval":  # (a duration, as a file writes it)
        assert schema["default"] == "5ms" and ExecutionSpec().continuous_flush_interval == 5
    else:
        assert schema["default"] == getattr(ExecutionSpec(), key)
        assert isinstance(schema["default"], str if key == "mode" else int)
    assert f"${VARIABLES[key]} overrides it" in schema["description"]


def test_schema_agrees_with_the_validator_on_execution_values() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json_schema())

    def doc(execution: dict[str, object]) -> dict[str, object]:
        return {"name": "p", "job": {"execution": execution},
                "sources": [{"id": "src", "type": "datagen", "fields": {"x": "offset"}}],
                "sinks": [{"id": "out", "type": "console", "input": "src"}]}

    good = {"small_epoch_rows": 0, "local_rows": 5000, "direct_read": False,
            "driver_subtasks": True, "task_sink": False, "staged_input": False,
            "arrow_input": False}
    assert list(validator.iter_errors(doc(good))) == []
    assert list(validator.iter_errors(doc({"mode": "continuous"}))) == []
    for bad in ({"local_rows": -1}, {"small_epoch_rows": "1k"}, {"direct_read": "off"},
                {"task_sinks": True}, {"mode": "streaming"}):
        assert list(validator.iter_errors(doc(bad))), bad
