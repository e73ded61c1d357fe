"""The physical plan: every pipeline compiles into stages with a strategy and a reason,
the per-epoch decision follows its one rule, and `streamer plan --physical` shows both."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from streamer.cli.main import app
from streamer.connectors.base import SourceSlice
from streamer.pipeline.job_spec import ExecutionSpec
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.checks import physical_plan
from streamer.runtime.plan.physical import PhysicalPlan, _small, render

pytestmark = pytest.mark.spark

PARQUET_WINDOW = """
name: plan-parquet
job: {{parallelism: 2, max_parallelism: 16}}
sources:
  - id: events
    type: files
    path: "{src}/*.parquet"
    format: parquet
    event_time: ts
operators:
  - id: per_minute
    input: events
    key_by: [user]
    window: {{tumbling: 1m}}
    aggregate: {{n: count(), total: sum(amount)}}
sinks:
  - id: out
    type: files
    input: per_minute
    path: "{out}"
    format: {sink_format}
"""

JSON_SESSIONS = """
name: plan-sessions
job: {{parallelism: 2, max_parallelism: 16}}
sources:
  - id: views
    type: files
    path: "{src}/*.jsonl"
    format: jsonl
    schema: {{user: string, ts: timestamp, amount: double}}
    event_time: ts
operators:
  - id: only_big
    input: views
    filter: "amount > 1"
  - id: doubled
    input: only_big
    with_columns: {{twice: "amount * 2"}}
  - id: sessions
    input: doubled
    key_by: [user]
    window: {{session: {{gap: 30s}}}}
    aggregate: {{n: count()}}
sinks:
  - id: out
    type: files
    input: sessions
    path: "{out}"
    format: jsonl
"""


def parquet_input(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "user": ["a", "b"], "amount": [1.0, 2.0],
        "ts": pa.array([1_000_000, 2_000_000], pa.timestamp("us", tz="UTC"))}),
        directory / "p0.parquet")
    return directory


def plan_of(spark, text: str, **values: object) -> PhysicalPlan:
    return physical_plan(load_pipeline_text(textwrap.dedent(text.format(**values))), spark)


def stage(plan: PhysicalPlan, node_id: str) -> dict:
    found = [s.describe() for s in plan.stages if s.node_id == node_id]
    assert found, f"no stage {node_id!r} in {[s.node_id for s in plan.stages]}"
    return found[0]


def test_parquet_window_to_parquet_reads_and_writes_in_the_subtasks(
        spark, tmp_path: Path, monkeypatch) -> None:
    for name in ("STREAMER_DIRECT_READ", "STREAMER_TASK_SINK", "STREAMER_LOCAL_ROWS"):
        monkeypatch.delenv(name, raising=False)
    plan = plan_of(spark, PARQUET_WINDOW, src=parquet_input(tmp_path / "in"),
                   out=tmp_path / "out", sink_format="parquet")
    assert [(s.kind, s.node_id) for s in plan.stages] == [
        ("source", "events"), ("keyed", "per_minute"), ("sink", "out")]
    assert stage(plan, "events")["strategy"] == "read-by-subtasks"
    keyed = stage(plan, "per_minute")
    assert [r["name"] for r in keyed["strategies"]] == [
        "subtasks-read-files", "local", "spark-routed"]
    assert keyed["writes_sink"] == "out"
    assert stage(plan, "out")["strategy"] == "written-by-subtasks"
    assert "written by the subtasks of keyed stage 'per_minute'" in stage(plan, "out")["reason"]
    assert plan.task_sinks == {"per_minute": "out"}


def test_settings_turn_strategies_off_and_the_plan_says_which_variable(
        spark, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("STREAMER_DIRECT_READ", "0")
    monkeypatch.setenv("STREAMER_TASK_SINK", "0")
    plan = plan_of(spark, PARQUET_WINDOW, src=parquet_input(tmp_path / "in"),
                   out=tmp_path / "out", sink_format="parquet")
    keyed = stage(plan, "per_minute")
    assert [r["name"] for r in keyed["strategies"]] == ["spark-routed"]
    why = {r["name"]: r["why"] for r in keyed["not_used"]}
    assert "set by STREAMER_DIRECT_READ" in why["subtasks-read-files / local"]
    assert "set by STREAMER_TASK_SINK" in why["writes its sink"]
    assert stage(plan, "events")["strategy"] == "spark-scan"
    assert stage(plan, "out")["strategy"] == "spark-writer"
    assert plan.task_sinks == {}


def test_json_filter_session_to_json_plans_a_fused_chain_and_staged_input(
        spark, tmp_path: Path, monkeypatch) -> None:
    for name in ("STREAMER_DIRECT_READ", "STREAMER_TASK_SINK", "STREAMER_STAGED_INPUT"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "in").mkdir()
    plan = plan_of(spark, JSON_SESSIONS, src=tmp_path / "in", out=tmp_path / "out")
    kinds = [(s.kind, s.node_id) for s in plan.stages]
    assert kinds == [("source", "views"), ("stateless", "doubled"), ("keyed", "sessions"),
                     ("sink", "out")]
    assert stage(plan, "doubled")["operators"] == ["only_big", "doubled"]
    keyed = stage(plan, "sessions")
    assert keyed["strategy"] == "local | spark-staged-files | spark-routed"
    why = {r["name"]: r["why"] for r in keyed["not_used"]}
    assert why["subtasks-read-files"] == "its input is not a source it alone reads"
    assert "writes its sink" not in why
    assert keyed["writes_sink"] == "out"  # (a local jsonl sink of columns the encoder takes)
    assert stage(plan, "out")["strategy"] == "written-by-subtasks"
    assert "local jsonl in Spark's bytes" in stage(plan, "out")["reason"]
    assert "arrow-tasks" not in why  # (JSON lines, a filter and a derived column Arrow takes)
    source = stage(plan, "views")
    assert source["strategy"] == "arrow-tasks"
    assert "run 'only_big', 'doubled' and write" in source["reason"]
    text = render(plan)
    assert "stateless stage only_big -> doubled: spark-sql" in text
    assert "per epoch: small-epoch mode" in text


def test_json_filter_tumbling_stages_its_input_for_the_subtasks_in_local_mode(
        spark, tmp_path: Path, monkeypatch) -> None:
    for name in ("STREAMER_DIRECT_READ", "STREAMER_STAGED_INPUT"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "in").mkdir()
    text = JSON_SESSIONS.replace("{{session: {{gap: 30s}}}}", "{{tumbling: 1m}}")
    keyed = stage(plan_of(spark, text, src=tmp_path / "in", out=tmp_path / "out"), "sessions")
    assert [r["name"] for r in keyed["strategies"]] == [
        "local", "spark-staged-files", "spark-routed"]
    monkeypatch.setenv("STREAMER_STAGED_INPUT", "no")
    keyed = stage(plan_of(spark, text, src=tmp_path / "in", out=tmp_path / "out"), "sessions")
    assert [r["name"] for r in keyed["strategies"]] == ["local", "spark-routed"]
    why = {r["name"]: r["why"] for r in keyed["not_used"]}
    assert why["spark-staged-files"] == (
        "job.execution.staged_input is off (set by STREAMER_STAGED_INPUT)")
    # Count windows are not among the shapes the subtasks aggregate themselves.
    monkeypatch.delenv("STREAMER_STAGED_INPUT")
    counted = JSON_SESSIONS.replace("{{session: {{gap: 30s}}}}", "{{count: 10}}")
    keyed = stage(plan_of(spark, counted, src=tmp_path / "in", out=tmp_path / "out"),
                  "sessions")
    assert keyed["strategy"] == "spark-routed"
    why = {r["name"]: r["why"] for r in keyed["not_used"]}
    assert why["spark-staged-files"] == why["local"] == "a count or until window, or a late: output"


def test_the_small_epoch_rule() -> None:
    settings = ExecutionSpec(small_epoch_rows=100, local_rows=10)

    def piece(n: int | None) -> SourceSlice:
        return SourceSlice("s", {}, {}, expected_records=n)

    assert _small(settings, {"a": piece(60), "b": piece(40)}, None)
    assert not _small(settings, {"a": piece(60), "b": piece(41)}, 0)
    assert _small(settings, {}, None)  # timers only
    # A source that cannot tell up front: the previous epoch's input decides.
    assert _small(settings, {"a": piece(None)}, 100)
    assert not _small(settings, {"a": piece(None)}, 101)
    assert not _small(settings, {"a": piece(None)}, None)
    off = ExecutionSpec(small_epoch_rows=0)
    assert not _small(off, {"a": piece(1)}, 1)


def test_plan_physical_cli_prints_the_stages_as_text_and_json(
        spark, tmp_path: Path, monkeypatch) -> None:
    for name in ("STREAMER_DIRECT_READ", "STREAMER_TASK_SINK", "STREAMER_EXECUTION_MODE"):
        monkeypatch.delenv(name, raising=False)
    file = tmp_path / "p.yaml"
    file.write_text(textwrap.dedent(PARQUET_WINDOW.format(
        src=parquet_input(tmp_path / "in"), out=tmp_path / "out", sink_format="csv")))
    runner = CliRunner()
    text = runner.invoke(app, ["plan", str(file), "--physical"])
    assert text.exit_code == 0, text.output
    assert text.output.startswith("mode: epochs (default)\nsource stage events: ")
    assert "keyed stage per_minute: subtasks-read-files | local | spark-routed" in text.output
    assert "source stage events: read-by-subtasks" in text.output
    assert ("not writes its sink: sink 'out' is not a local parquet or jsonl files sink"
            in text.output)
    as_json = runner.invoke(app, ["plan", str(file), "--physical", "--format", "json"])
    assert as_json.exit_code == 0, as_json.output
    found = json.loads(as_json.output)
    assert [s["stage"] for s in found["stages"]] == ["events", "per_minute", "out"]
    assert found["mode"] == {"value": "epochs", "from": "default"}
    assert "gang" not in found
    assert found["settings"]["small_epoch_rows"] == {"value": 20_000, "from": "default"}
    wrong = runner.invoke(app, ["plan", str(file), "--physical", "--format", "mermaid"])
    assert wrong.exit_code == 2
    assert not (tmp_path / "out").exists(), "planning must not open the sinks"


CONTINUOUS = PARQUET_WINDOW.replace("max_parallelism: 16}}",
                                    "max_parallelism: 16, execution: {{mode: continuous}}}}")


def test_plan_physical_cli_shows_the_continuous_mode_and_its_gang(
        spark, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("STREAMER_EXECUTION_MODE", raising=False)
    file = tmp_path / "p.yaml"
    file.write_text(textwrap.dedent(CONTINUOUS.format(
        src=parquet_input(tmp_path / "in"), out=tmp_path / "out", sink_format="jsonl")))
    runner = CliRunner()
    text = runner.invoke(app, ["plan", str(file), "--physical"])
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert lines[0] == f"mode: continuous (job.execution.mode in {file}:3:56)"
    assert lines[1].startswith("gang: one Spark barrier stage of 4 tasks")
    assert lines[2].startswith("    - source 'events': 2 subtasks: one per split group")
    assert "file i is read by subtask i mod n" in lines[2]
    assert lines[3].startswith("    - keyed 'per_minute': 2 subtasks: job.parallelism; ")
    assert lines[4].startswith("    - sink: 'out' (jsonl files), written by the keyed subtasks")
    assert "per epoch:" not in text.output and "keyed stage" not in text.output
    as_json = runner.invoke(app, ["plan", str(file), "--physical", "--format", "json"])
    assert as_json.exit_code == 0, as_json.output
    found = json.loads(as_json.output)
    assert found["mode"] == {"value": "continuous",
                             "from": f"job.execution.mode in {file}:3:56"}
    assert "stages" not in found and "per_epoch" not in found
    gang = found["gang"]
    assert gang["tasks"] == 4 and gang["stage"] == "one Spark barrier stage of 4 tasks"
    assert [(g["role"], g["node"], g["subtasks"]) for g in gang["subtasks"]] == [
        ("source", "events", 2), ("keyed", "per_minute", 2)]
    assert found["settings"]["mode"] == {"value": "continuous", "from": "file"}
    assert not (tmp_path / "out").exists(), "planning must not open the sinks"


def test_the_mode_variable_chooses_the_continuous_mode_and_refuses_what_it_cannot_run(
        spark, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("STREAMER_EXECUTION_MODE", "continuous")
    plan = plan_of(spark, PARQUET_WINDOW.replace("parallelism: 2,", "parallelism: 3,"),
                   src=parquet_input(tmp_path / "in"), out=tmp_path / "out",
                   sink_format="parquet")
    assert (plan.mode.mode, plan.mode.why) == ("continuous", "STREAMER_EXECUTION_MODE")
    assert plan.gang is not None and plan.gang.tasks == 6
    assert render(plan).startswith("mode: continuous (STREAMER_EXECUTION_MODE)\n"
                                   "gang: one Spark barrier stage of 6 tasks")
    (tmp_path / "views").mkdir()
    file = tmp_path / "sessions.yaml"
    file.write_text(textwrap.dedent(JSON_SESSIONS.format(src=tmp_path / "views",
                                                         out=tmp_path / "out")))
    refused = CliRunner().invoke(app, ["plan", str(file), "--physical"])
    assert refused.exit_code == 1, refused.output
    assert (f"{file}:21:13: operator 'sessions' (session window) cannot run with "
            "job.execution.mode: continuous yet;") in refused.output
    assert "fix: unset STREAMER_EXECUTION_MODE or set it to epochs\n" in refused.output
    assert "Traceback" not in refused.output
    monkeypatch.setenv("STREAMER_EXECUTION_MODE", "epochs")
    plan = plan_of(spark, CONTINUOUS, src=tmp_path / "in", out=tmp_path / "out",
                   sink_format="parquet")
    assert (plan.mode.mode, plan.mode.why, plan.gang) == (
        "epochs", "STREAMER_EXECUTION_MODE", None)
    assert render(plan).startswith("mode: epochs (STREAMER_EXECUTION_MODE)\nsource stage")


def test_plan_physical_says_what_the_gang_cannot_run_as_the_run_would(
        spark, tmp_path: Path, monkeypatch) -> None:
    """What only the analyzed plan shows (here a column type Arrow does not decode) is the
    run's error, from `streamer plan --physical` already."""
    monkeypatch.delenv("STREAMER_EXECUTION_MODE", raising=False)
    (tmp_path / "in").mkdir()
    text = JSON_SESSIONS.replace("{{session: {{gap: 30s}}}}", "{{tumbling: 1m}}").replace(
        "amount: double}}", "amount: double, day: date}}").replace(
        "job: {{parallelism: 2,", "job: {{execution: {{mode: continuous}}, parallelism: 2,")
    file = tmp_path / "p.yaml"
    file.write_text(textwrap.dedent(text.format(src=tmp_path / "in", out=tmp_path / "out")))
    result = CliRunner().invoke(app, ["plan", str(file), "--physical"])
    assert result.exit_code == 2, result.output
    assert (f"{file}: job.execution.mode is continuous, but operator 'sessions': column 'day' "
            "of source 'views' has type date") in result.output
    assert "run it with job.execution.mode: epochs" in result.output
    assert "Traceback" not in result.output


@pytest.mark.kafka
def test_a_kafka_source_has_a_source_subtask_per_partition_at_most(
        spark, tmp_path: Path, kafka, monkeypatch) -> None:
    """The gang gives a Kafka source no more subtasks than the topic has partitions (one
    without would hold the watermark back); the plan shows the run's count."""
    monkeypatch.delenv("STREAMER_EXECUTION_MODE", raising=False)
    topic = kafka.create_topic(f"plan-{uuid.uuid4().hex[:8]}", partitions=1)
    text = f"""
name: plan-kafka-gang
job: {{parallelism: 3, execution: {{mode: continuous}}}}
sources:
  - id: clicks
    type: kafka
    bootstrap_servers: {kafka.bootstrap}
    topic: {topic}
    bounded: true
    schema: {{user: string, amount: double, ts: bigint}}
operators:
  - {{id: per_user, input: clicks, key_by: [user], aggregate: {{n: count()}}}}
sinks:
  - {{id: out, type: files, input: per_user, path: "{tmp_path / 'out'}", format: jsonl}}
"""
    plan = physical_plan(load_pipeline_text(text), spark)
    assert plan.gang is not None
    assert [(g.role, g.subtasks) for g in plan.gang.groups] == [("source", 1), ("keyed", 3)]
    assert plan.gang.tasks == 4
    assert "no more than the topic's partitions" in plan.gang.groups[0].reason
    assert "one Spark barrier stage of 4 tasks" in render(plan)
