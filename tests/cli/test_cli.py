"""The command line through typer's CliRunner (in process), plus real subprocesses where the
behaviour is about processes: instant --help, Ctrl-C, missing Java."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.core import TyperGroup, TyperOption
from typer.main import get_command
from typer.testing import CliRunner

from streamer.cli.main import app

REPO = Path(__file__).resolve().parents[2]
PIPELINES = sorted((REPO / "pipelines").glob("*.yaml"))
runner = CliRunner()


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


VALID = """\
    name: ok
    sources:
      - id: gen
        type: datagen
        limit: 20
        fields: {n: "offset", ts: "timestamp_millis(1767225600000 + offset)"}
    operators:
      - id: odd
        input: gen
        filter: "n % 2 = 1"
    sinks:
      - id: out
        type: files
        input: odd
        path: OUT
        format: jsonl
    tests:
      - name: odd numbers pass
        inputs: {gen: [{n: 1, ts: "2026-01-01T00:00:00Z"}, {n: 2, ts: "2026-01-01T00:00:00Z"}]}
        expect: {out: [{n: 1, ts: "2026-01-01T00:00:00Z"}]}
"""


def test_every_command_and_option_has_help() -> None:
    group = get_command(app)
    assert isinstance(group, TyperGroup)
    for name, command in group.commands.items():
        assert command.help, f"command {name!r} has no help"
        for param in command.params:
            if isinstance(param, TyperOption):
                assert param.help, f"option {param.opts} of {name!r} has no help"
            result = runner.invoke(app, [name, "--help"])
            assert result.exit_code == 0, result.output


def test_help_is_instant_and_does_not_import_pyspark() -> None:
    code = ("import sys, time; t = time.time(); from streamer.cli.main import app; "
            "assert 'pyspark' not in sys.modules; print(time.time() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert float(out.stdout) < 1.5


def test_validate_reports_file_line_col_and_exit_1(tmp_path: Path) -> None:
    bad = write(tmp_path, """\
        name: bad
        sources:
          - id: gen
            type: datagen
            fields: {n: offset}
            limt: 5
        sinks:
          - id: out
            type: console
            input: gen
        """)
    result = runner.invoke(app, ["validate", "--no-spark", str(bad)])
    assert result.exit_code == 1
    assert f"{bad}:6:5: unknown key 'limt' in source 'gen'; did you mean 'limit'?" in result.output
    assert "Traceback" not in result.output


@pytest.mark.spark
def test_validate_checks_expressions_with_spark(spark, tmp_path: Path) -> None:
    bad = write(tmp_path, """\
        name: bad
        sources:
          - id: gen
            type: datagen
            fields: {amount: "offset * 2"}
        operators:
          - id: big
            input: gen
            filter: "amout > 10"
          - id: shaped
            input: big
            select:
              a: "amount + 1"
              b: "no_such_function(amount)"
        sinks:
          - id: out
            type: console
            input: shaped
        """)
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1, result.output
    assert f"{bad}:9:13: filter of operator 'big': " in result.output
    assert "`amout` cannot be resolved" in result.output
    assert "Did you mean" in result.output and "`amount`" in result.output
    # select is not analysed past a failing input, so only the first problem shows
    good = write(tmp_path, VALID.replace("OUT", str(tmp_path / "o")), "good.yaml")
    ok = runner.invoke(app, ["validate", str(good)])
    assert ok.exit_code == 0 and "ok" in ok.output


@pytest.mark.spark
def test_validate_reports_bad_select_column_and_union_mismatch(spark, tmp_path: Path) -> None:
    bad = write(tmp_path, """\
        name: bad
        sources:
          - id: a
            type: datagen
            fields: {x: "offset"}
          - id: b
            type: datagen
            fields: {y: "offset"}
        operators:
          - id: shaped
            input: a
            select:
              ok: "x + 1"
              broken: "no_such_function(x)"
          - id: both
            input: [a, b]
            filter: "true"
        sinks:
          - id: out
            type: console
            input: [shaped, both]
        """)
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1
    assert f"{bad}:14:15: column 'broken' of operator 'shaped': " in result.output
    assert f"{bad}:16:12: the inputs of operator 'both' must have the same columns" in result.output


def test_plan_formats(tmp_path: Path) -> None:
    path = REPO / "pipelines" / "clickstream.yaml"
    tree = runner.invoke(app, ["plan", str(path)])
    assert tree.exit_code == 0
    assert "source clicks" in tree.output and "sink out" in tree.output
    as_json = json.loads(runner.invoke(app, ["plan", str(path), "--format", "json"]).output)
    assert next(n["id"] for n in as_json["nodes"]) == "clicks"
    assert {n["role"] for n in as_json["nodes"]} == {"source", "operator", "sink"}
    mermaid = runner.invoke(app, ["plan", str(path), "-f", "mermaid"]).output
    assert mermaid.startswith("flowchart LR") and "clicks --> humans" in mermaid
    dot = runner.invoke(app, ["plan", str(path), "-f", "dot"]).output
    assert dot.startswith('digraph "clickstream"') and '"humans" -> "enriched";' in dot


def test_plan_shows_key_group_shuffle(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        name: keyed
        job: {parallelism: 2, max_parallelism: 64}
        sources:
          - id: gen
            type: datagen
            fields: {user: "offset % 10", ts: "timestamp_millis(offset)"}
            event_time: ts
        operators:
          - id: per_user
            uid: per-user-v1
            input: gen
            key_by: [user]
            window: {tumbling: 1m}
            aggregate: {n: count()}
        sinks:
          - id: out
            type: console
            input: per_user
        """)
    tree = runner.invoke(app, ["plan", str(path)]).output
    assert "shuffle by user" in tree and "64 key groups" in tree and "uid=per-user-v1" in tree
    plan = json.loads(runner.invoke(app, ["plan", str(path), "-f", "json"]).output)
    keyed = next(n for n in plan["nodes"] if n["id"] == "per_user")
    assert keyed["shuffle"] == "key group by user" and keyed["uid"] == "per-user-v1"


def test_schema_is_json_schema() -> None:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert schema["$schema"].endswith("2020-12/schema")
    assert {"name", "sources", "operators", "sinks", "tests"} <= set(schema["properties"])


@pytest.mark.spark
def test_run_json_lines(spark, tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace("OUT", str(tmp_path / "o")))
    result = runner.invoke(app, ["run", str(path), "--json", "--no-ui"])
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert events[0]["event"] == "started" and events[-1]["event"] == "finished"
    epochs = [e for e in events if e["event"] == "epoch"]
    assert sum(e["records_in_total"] for e in epochs) == 20
    assert sum(e["records_out"].get("out", 0) for e in epochs) == 10
    assert events[-1]["status"] == "finished"


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("pipeline", PIPELINES, ids=[p.stem for p in PIPELINES])
def test_example_pipeline_tests_pass(spark, pipeline: Path) -> None:
    result = runner.invoke(app, ["test", str(pipeline)])
    assert result.exit_code == 0, result.output
    assert "0 failed" in result.output


@pytest.mark.spark
def test_failing_test_prints_a_diff_and_exits_1(spark, tmp_path: Path) -> None:
    text = VALID.replace("OUT", str(tmp_path / "o")).replace(
        'expect: {out: [{n: 1, ts: "2026-01-01T00:00:00Z"}]}',
        'expect: {out: [{n: 3, ts: "2026-01-01T00:00:00Z"}]}')
    result = runner.invoke(app, ["test", str(write(tmp_path, text))])
    assert result.exit_code == 1
    assert "FAIL odd numbers pass" in result.output
    assert '- expected, not produced: {"n": 3, "ts": "2026-01-01T00:00:00Z"}' in result.output
    assert '+ produced, not expected: {"n": 1, "ts": "2026-01-01T00:00:00Z"}' in result.output


def test_missing_java_is_one_sentence(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace("OUT", str(tmp_path / "o")))
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "streamer.cli.main", "run", str(path)],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 3
    assert "Spark needs Java 17+" in out.stderr and "JAVA_HOME" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["run", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 1
    assert "does not exist" in result.output


@pytest.mark.slow
def test_ctrl_c_stops_an_unbounded_run_at_an_epoch_boundary(tmp_path: Path) -> None:
    out = tmp_path / "o"
    path = write(tmp_path, f"""\
        name: endless
        job: {{epoch: 250ms}}
        sources:
          - id: gen
            type: datagen
            rows_per_second: 500
            fields: {{n: "offset"}}
        sinks:
          - id: out
            type: files
            input: gen
            path: {out}
            format: jsonl
        """)
    proc = subprocess.Popen([sys.executable, "-m", "streamer.cli.main", "run", str(path),
                             "--json", "--no-ui"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    assert proc.stdout is not None
    epochs = 0
    deadline = time.time() + 120
    while epochs < 2 and time.time() < deadline:
        line = proc.stdout.readline()
        epochs += '"event": "epoch"' in line
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    finished = json.loads(rest.strip().splitlines()[-1])
    assert finished["event"] == "finished" and finished["status"] == "stopped"
    rows = [json.loads(x) for p in sorted(out.glob("part-*.jsonl")) for x in p.read_text().split()]
    assert sorted(r["n"] for r in rows) == list(range(finished["records_in"]))
