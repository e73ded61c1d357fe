"""`job.execution.mode: continuous`: what validation accepts, and the one line it gives for the
first node it cannot run yet (pipeline/continuous_support.py). The golden cases of refused
pipelines are in tests/pipeline/invalid/continuous/; these are the accepted shapes, the
refusals worth pinning by their words, the environment override and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamer.cli.main import app
from streamer.operators.direct import DIRECT_AGGREGATES
from streamer.pipeline.continuous_support import AGGREGATES, check_mode, continuous_refusal
from streamer.pipeline.exceptions import PipelineError
from streamer.pipeline.spec import PipelineSpec
from streamer.pipeline.validate import load_pipeline_text

FILES = """\
name: p
job:
  parallelism: 2
  execution:
    mode: {mode}
sources:
  - id: events
    type: files
    path: ./in
    format: {fmt}
    schema: {{user: string, amount: long, ts: timestamp}}
    event_time: ts
operators:
  - id: big
    input: events
    filter: amount > 10
  - id: cents
    input: big
    with_columns: {{cents: amount * 100}}
  - id: counts
    input: cents
    key_by: user
{keyed}
sinks:
  - id: out
    type: files
    input: counts
    path: ./out
    format: {sink_fmt}
"""
TUMBLING = "    window: {tumbling: 1m}\n    aggregate: {n: count(), total: sum(cents)}"


def pipeline(mode: str = "continuous", fmt: str = "jsonl", keyed: str = TUMBLING,
             sink_fmt: str = "jsonl") -> str:
    return FILES.format(mode=mode, fmt=fmt, keyed=keyed, sink_fmt=sink_fmt)


def load(text: str, env: dict[str, str] | None = None) -> PipelineSpec:
    return load_pipeline_text(text, file="p.yaml", env=env or {})


def refused(text: str) -> str:
    with pytest.raises(PipelineError) as info:
        load(text)
    (problem,) = info.value.problems
    return str(problem)


# ---------------------------------------------------------------------------- accepted

@pytest.mark.parametrize(("fmt", "keyed", "sink_fmt"), [
    ("jsonl", TUMBLING, "jsonl"),
    ("csv", "    window: {sliding: {size: 1m, slide: 10s}}\n    aggregate: {lo: min(amount), "
            "hi: max(amount), mean: avg(amount)}", "parquet"),
    ("parquet", "    aggregate: {n: count(), total: sum(amount)}", "jsonl"),
])
def test_a_supported_pipeline_validates_cleanly(fmt: str, keyed: str, sink_fmt: str) -> None:
    spec = load(pipeline(fmt=fmt, keyed=keyed, sink_fmt=sink_fmt))
    assert spec.job.execution.mode == "continuous"
    assert spec.job.execution.sources["mode"] == "file"
    assert continuous_refusal(spec) is None


def test_a_kafka_source_with_a_rolling_aggregate_validates_cleanly() -> None:
    text = pipeline(keyed="    aggregate: {n: count()}").replace(
        "    type: files\n    path: ./in\n    format: jsonl\n",
        "    type: kafka\n    bootstrap_servers: localhost:9092\n    topic: events\n", 1)
    spec = load(text)
    assert spec.sources[0].type == "kafka"
    assert continuous_refusal(spec) is None


def test_a_kafka_source_read_by_spark_is_refused() -> None:
    text = pipeline(keyed="    aggregate: {n: count()}").replace(
        "    type: files\n    path: ./in\n    format: jsonl\n",
        "    type: kafka\n    bootstrap_servers: localhost:9092\n    topic: events\n"
        "    client: spark\n", 1)
    assert refused(text).startswith(
        "p.yaml:7:5: source 'events' (kafka other than JSON values read with client: "
        "confluent) cannot run")


def test_the_same_refused_shapes_run_in_the_epoch_mode() -> None:
    """The refusal is the continuous mode's alone: with mode: epochs (or no mode) the
    pipeline is valid."""
    session = "    window: {session: {gap: 5m}}\n    aggregate: {n: count()}"
    spec = load(pipeline(mode="epochs", keyed=session))
    assert spec.job.execution.mode == "epochs"
    assert continuous_refusal(spec) is not None  # (what the continuous mode would say)
    assert "cannot run with job.execution.mode: continuous" in refused(
        pipeline(keyed=session))


def test_the_aggregates_are_the_direct_reads() -> None:
    """pipeline/ may not import operators/, so the tuple is a copy; it must stay equal."""
    assert AGGREGATES == DIRECT_AGGREGATES


# ----------------------------------------------------------------------------- refused

@pytest.mark.parametrize(("change", "words"), [
    (("path: ./in", "path: s3://bucket/in"), "source 'events' (files on a remote file system)"),
    (("path: ./in", "path: ./in\n    watch: true"), "source 'events' (files with watch: true)"),
    ((TUMBLING, "    dedupe: {within: 1h}"), "operator 'counts' (dedupe)"),
    ((TUMBLING, "    window: {count: 5}\n    aggregate: {n: count()}"),
     "operator 'counts' (count window)"),
    ((TUMBLING, "    top_n: {n: 3, order_by: amount desc}"), "operator 'counts' (top-N)"),
    ((TUMBLING, "    process: m:C"), "operator 'counts' (process function: user Python)"),
    (("path: ./out\n", "path: s3://bucket/out\n"), "sink 'out' (files on a remote file "
                                                    "system)"),
])
def test_refusals_name_the_node_and_why(change: tuple[str, str], words: str) -> None:
    text = pipeline()
    assert change[0] in text
    line = refused(text.replace(*change, 1))
    assert line.startswith("p.yaml:")
    assert f": {words} cannot run with job.execution.mode: continuous yet; the continuous " \
        "mode runs one files or kafka source" in line
    assert line.endswith("; fix: remove job.execution.mode or use mode: epochs")
    assert "\n" not in line


ON_ERROR = ("    event_time: ts\n", "    event_time: ts\n    on_error: dead\n")
DEAD_SINK = "  - {id: dead, type: files, path: ./dead, format: jsonl}\n"


def test_on_error_of_a_jsonl_source_validates_and_its_sink_is_no_second_sink() -> None:
    """The source subtasks stage its dead letters (tests/runtime/
    test_continuous_dead_letters.py), so its dead-letter sink beside the keyed operator's
    is accepted; a third sink is still refused."""
    text = pipeline().replace(*ON_ERROR) + DEAD_SINK
    spec = load(text)
    assert continuous_refusal(spec) is None
    line = refused(text + "  - {id: more, type: files, input: counts, path: ./m, format: jsonl}\n")
    assert "sink 'more' (a second sink) cannot run" in line


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_on_error_of_csv_or_parquet_files_is_still_refused(fmt: str) -> None:
    """Their bad records are not found record by record in the continuous mode yet."""
    line = refused(pipeline(fmt=fmt).replace(*ON_ERROR) + DEAD_SINK)
    assert line.startswith(f"p.yaml:7:5: source 'events' (on_error with files of format {fmt} "
                           "(its source subtasks find bad records in JSON lines and Kafka "
                           "values)) cannot run with job.execution.mode: continuous yet")


def test_a_text_files_source_is_refused() -> None:
    text = pipeline().replace("    format: jsonl\n    schema: {user: string, amount: long, "
                              "ts: timestamp}\n    event_time: ts\n", "    format: text\n")
    text = text.replace("amount > 10", "line != ''").replace("amount * 100", "length(line)")
    text = text.replace("key_by: user", "key_by: line").replace(TUMBLING,
                                                                "    aggregate: {n: count()}")
    assert refused(text).startswith(
        "p.yaml:7:5: source 'events' (files of format text, which the source subtasks do not "
        "decode) cannot run")


def test_a_window_with_late_output_is_refused() -> None:
    """Its late sink is a second sink too; the window is named first."""
    text = pipeline(keyed="    window: {tumbling: 1m, late: lates}\n    aggregate: {n: count()}")
    text += "  - {id: lates, type: files, path: ./late, format: jsonl}\n"
    assert refused(text).startswith(
        "p.yaml:23:34: operator 'counts' (a window with late: lates) cannot run")


def test_the_variable_that_chose_the_mode_is_in_the_fix() -> None:
    """A file in the epoch mode validates; $STREAMER_EXECUTION_MODE=continuous then refuses
    it where the overrides are applied (`check_mode`: the CLI's validate and the planner),
    and the fix says to unset the variable."""
    spec = load(pipeline(mode="epochs", keyed="    dedupe: {within: 1h}"))
    settings = spec.job.execution.with_overrides({"STREAMER_EXECUTION_MODE": "continuous"})
    check_mode(spec, spec.job.execution)  # the file's mode: nothing to refuse
    with pytest.raises(PipelineError) as info:
        check_mode(spec, settings)
    assert str(info.value) == (
        "p.yaml:20:5: operator 'counts' (dedupe) cannot run with job.execution.mode: "
        "continuous yet; the continuous mode runs one files or kafka source, filters and "
        "derived columns, at most one rolling aggregate or tumbling/sliding window, and one "
        "files or kafka sink; fix: unset STREAMER_EXECUTION_MODE or set it to epochs")


# --------------------------------------------------------------------------------- CLI

def test_validate_reports_the_refusal_without_a_traceback(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(pipeline())
    bad.write_text(pipeline(keyed="    window: {session: {gap: 5m}}\n"
                                   "    aggregate: {n: count()}"))
    result = CliRunner().invoke(app, ["validate", "--no-spark", str(good), str(bad)])
    assert result.exit_code == 1, result.output
    assert f"ok {good}" in result.output
    assert f"{bad}:23:13: operator 'counts' (session window) cannot run with " \
        "job.execution.mode: continuous yet" in result.output
    assert "Traceback" not in result.output
    # Without --no-spark the refusal comes first too (no file left for Spark's analyzer,
    # so no session starts).
    result = CliRunner().invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1, result.output
    assert "operator 'counts' (session window) cannot run" in result.output
    assert "checking expressions" not in result.output


def test_validate_applies_the_mode_variable(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "p.yaml"
    file.write_text(pipeline(mode="epochs", keyed="    dedupe: {within: 1h}"))
    monkeypatch.setenv("STREAMER_EXECUTION_MODE", "continuous")
    result = CliRunner().invoke(app, ["validate", "--no-spark", str(file)])
    assert result.exit_code == 1, result.output
    assert "operator 'counts' (dedupe)" in result.output
    assert "fix: unset STREAMER_EXECUTION_MODE or set it to epochs" in result.output
    monkeypatch.setenv("STREAMER_EXECUTION_MODE", "epochs")
    assert CliRunner().invoke(app, ["validate", "--no-spark", str(file)]).exit_code == 0

