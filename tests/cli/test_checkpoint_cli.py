"""`streamer run` resuming from checkpoints, and `streamer checkpoint list|inspect`."""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from streamer.cli.main import app

runner = CliRunner()

PIPELINE = """\
    name: cli-chk
    storage: STORAGE
    job:
      parallelism: 2
      checkpoint: {interval: 1ms, retain: 3}
      state: {backend: rocksdb, local_dir: LOCAL}
    sources:
      - id: gen
        type: datagen
        limit: 400
        max_records_per_epoch: 200
        fields:
          user: "concat('u', cast(offset % 7 as string))"
          ts: "timestamp_millis(1767225600000 + offset * 1000)"
        event_time: ts
    operators:
      - id: per_minute
        input: gen
        key_by: [user]
        window: {tumbling: 1m}
        aggregate: {n: count()}
    sinks:
      - id: out
        type: files
        input: per_minute
        path: OUT
        format: jsonl
"""


@pytest.fixture(scope="module")
def job(spark, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("cli-chk")
    text = textwrap.dedent(PIPELINE).replace("STORAGE", str(tmp / "storage")).replace(
        "LOCAL", str(tmp / "local")).replace("OUT", str(tmp / "out"))
    path = tmp / "p.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["run", str(path), "--json", "--no-ui", "--max-epochs", "1"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["run", str(path), "--no-ui"])
    assert result.exit_code == 0, result.output
    return {"file": str(path), "storage": str(tmp / "storage"), "resume": result.output}


def test_run_says_it_resumes(job: dict[str, str]) -> None:
    assert "resuming from checkpoint" in job["resume"]
    assert "gen: 0=" in job["resume"]  # the offsets it resumes from


def test_checkpoint_list_json(job: dict[str, str]) -> None:
    result = runner.invoke(app, ["checkpoint", "list", "cli-chk", "--storage", job["storage"],
                                 "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)
    assert 1 <= len(listed) <= 3  # retain 3
    ids = [c["id"] for c in listed]
    assert ids == sorted(ids, reverse=True)
    newest = listed[0]
    assert newest["status"] == "completed"
    assert {"time", "epoch", "state_size", "incremental_size", "duration_ms", "offsets"} <= set(
        newest)
    assert newest["state_size"] > 0 and 0 <= newest["incremental_size"] <= newest["state_size"]
    assert newest["offsets"]["gen"] == {"0": 400}


def test_checkpoint_list_table(job: dict[str, str]) -> None:
    result = runner.invoke(app, ["checkpoint", "list", "cli-chk", "--storage", job["storage"]])
    assert result.exit_code == 0, result.output
    for column in ("id", "time (UTC)", "epoch", "size", "incremental", "duration", "offsets"):
        assert column in result.output
    assert "completed" in result.output


def test_checkpoint_inspect(job: dict[str, str]) -> None:
    listed = json.loads(runner.invoke(app, ["checkpoint", "list", "cli-chk", "--storage",
                                            job["storage"], "--json"]).output)
    cid = str(listed[0]["id"])
    result = runner.invoke(app, ["checkpoint", "inspect", "cli-chk", cid, "--storage",
                                 job["storage"], "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    op = body["operators"]["per_minute"]
    assert op["parallelism"] == 2 and op["backend"] == "rocksdb"
    assert [h["subtask"] for h in op["subtasks"]] == [0, 1]
    assert sum(h["keys"]["acc"] for h in op["subtasks"]) >= 0
    assert all(h["files"] for h in op["subtasks"])
    table = runner.invoke(app, ["checkpoint", "inspect", "cli-chk", cid, "--storage",
                                job["storage"]])
    assert table.exit_code == 0, table.output
    for word in ("operator per_minute", "subtask", "key groups", "files", "shared", "keys",
                 "gen split 0: 400"):
        assert word in table.output


def test_unknown_job_and_checkpoint_are_clear_errors(job: dict[str, str]) -> None:
    result = runner.invoke(app, ["checkpoint", "list", "nope", "--storage", job["storage"]])
    assert result.exit_code == 1
    assert "job 'nope' has no checkpoints" in result.output and "cli-chk" in result.output
    result = runner.invoke(app, ["checkpoint", "inspect", "cli-chk", "999", "--storage",
                                 job["storage"]])
    assert result.exit_code == 1
    assert "checkpoint 999" in result.output and "does not exist" in result.output
    assert "Traceback" not in result.output


def test_fresh_and_from_checkpoint_contradict(job: dict[str, str]) -> None:
    result = runner.invoke(app, ["run", job["file"], "--fresh", "--from-checkpoint", "1"])
    assert result.exit_code == 2  # an invalid command line
    assert "contradict" in result.output
