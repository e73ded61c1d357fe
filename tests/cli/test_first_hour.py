"""The newcomer's first hour (issue 37): mistakes reported in seconds, before Spark starts,
once, at the line, with the fix. Each message is compared exactly with a golden file in
tests/cli/golden/ (`STREAMER_TEST_UPDATE_GOLDEN=1` rewrites them after a deliberate change).

Everything here runs without Spark but the finished-job case, which first runs a job."""

from __future__ import annotations

import os
import socket
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamer.cli.main import app
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.preflight import PreflightOptions, preflight

GOLDEN = Path(__file__).parent / "golden"
runner = CliRunner()

HEAD = """\
    name: p
    sources:
      - id: orders
        type: files
        path: ./in/*.jsonl
        format: jsonl
        schema: {user: string, amount: int, ts: timestamp}
"""


def golden(name: str, text: str) -> None:
    """`text` equals the golden file `name` (rewritten under STREAMER_TEST_UPDATE_GOLDEN=1)."""
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("STREAMER_TEST_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"differs from {path}"


def invoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, *args: str,
           name: str = "p.yaml") -> tuple[int, str, float]:
    """Run `streamer ARGS` in `tmp_path` on the pipeline `text`: exit code, output with the
    directory as <tmp>, seconds."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text(textwrap.dedent(text))
    start = time.perf_counter()
    result = runner.invoke(app, list(args))
    took = time.perf_counter() - start
    assert "Traceback" not in result.output
    return result.exit_code, result.output.replace(str(tmp_path), "<tmp>"), took


def with_inputs(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"user": "a", "amount": 1, '
                                             '"ts": "2026-01-01T00:00:00Z"}\n')


# ----------------------------------------------------------------- validate without Spark
def test_a_key_by_column_the_schema_rules_out_fails_validate_no_spark(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, took = invoke(tmp_path, monkeypatch, HEAD + """\
        event_time: ts
    operators:
      - id: per_user
        input: orders
        key_by: [usr]
        window: {tumbling: 1m}
        aggregate: {n: count(), total: sum(amout)}
    sinks:
      - {id: out, type: console, input: per_user}
    """, "validate", "--no-spark", "p.yaml")
    assert code == 1
    golden("key_by_not_in_schema", out)
    assert took < 2


def test_a_window_without_event_time_names_both_fixes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = invoke(tmp_path, monkeypatch, HEAD + """\
    operators:
      - id: per_user
        input: orders
        key_by: [user]
        window: {tumbling: 1m}
        aggregate: {n: count()}
    sinks:
      - {id: out, type: console, input: per_user}
    """, "validate", "--no-spark", "p.yaml")
    assert code == 1
    golden("window_without_event_time", out)


def test_processing_time_asked_for_is_fine(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = invoke(tmp_path, monkeypatch, HEAD + """\
    operators:
      - id: per_user
        input: orders
        key_by: [user]
        window: {tumbling: 1m, time: processing}
        aggregate: {n: count()}
    sinks:
      - {id: out, type: console, input: per_user}
    """, "validate", "--no-spark", "p.yaml")
    assert (code, out) == (0, "ok p.yaml\n")


def test_a_window_after_a_process_function_is_not_silently_processing_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process function's output carries its input's event time: none here."""
    code, out, _ = invoke(tmp_path, monkeypatch, HEAD + """\
    operators:
      - id: scored
        input: orders
        key_by: [user]
        process: "scoring:Score"
      - id: per_user
        input: scored
        key_by: [user]
        window: {session: {gap: 30s}}
        aggregate: {n: count()}
    sinks:
      - {id: out, type: console, input: per_user}
    """, "validate", "--no-spark", "p.yaml")
    assert code == 1
    golden("window_after_process_function", out)


def test_join_keys_and_event_time_without_spark(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = invoke(tmp_path, monkeypatch, HEAD + """\
      - id: payments
        type: files
        path: ./in/*.jsonl
        format: jsonl
        schema: {order_id: string, paid: double}
    operators:
      - id: paid
        join: {left: orders, right: payments, on: [order_id], between: [0s, 1m]}
    sinks:
      - {id: out, type: console, input: paid}
    """, "validate", "--no-spark", "p.yaml")
    assert code == 1
    golden("join_without_spark", out)


# -------------------------------------------------------------- run: before Spark starts
RUNNABLE = HEAD + """\
        event_time: ts
    operators:
      - id: per_user
        input: orders
        key_by: [user]
        window: {tumbling: 1m}
        aggregate: {n: count()}
    sinks:
      - {id: out, type: files, input: per_user, path: ./out, format: jsonl}
"""


def test_a_missing_savepoint_is_reported_once_before_spark(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with_inputs(tmp_path)
    code, out, took = invoke(tmp_path, monkeypatch, RUNNABLE, "run", "p.yaml",
                             "--from-savepoint", str(tmp_path / "sp-nope"))
    assert code == 1
    golden("missing_savepoint", out)
    assert took < 10  # (Spark's start alone takes longer on a loaded machine)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_broker_that_is_down_is_reported_once_before_spark(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    code, out, took = invoke(tmp_path, monkeypatch, f"""\
    name: p
    sources:
      - id: clicks
        type: kafka
        bootstrap_servers: 127.0.0.1:{port}
        topic: clicks
        format: json
        schema: {{user: string}}
    sinks:
      - {{id: out, type: kafka, input: clicks, bootstrap_servers: "127.0.0.1:{port}",
          topic: out, format: json}}
    """, "run", "p.yaml")
    assert code == 1
    golden("broker_down", out.replace(str(port), "PORT"))
    assert took < 10


def test_a_files_path_that_matches_nothing_is_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = invoke(tmp_path, monkeypatch, RUNNABLE, "run", "p.yaml")
    assert code == 1
    golden("files_match_nothing", out)


def test_several_problems_are_listed_together(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = invoke(tmp_path, monkeypatch, RUNNABLE, "run", "p.yaml",
                          "--from-savepoint", "sp-nope")
    assert code == 1
    golden("several_preflight_problems", out)


def test_a_watched_path_with_no_files_is_a_warning(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = load_pipeline_text(textwrap.dedent(RUNNABLE).replace(
        "format: jsonl\n    schema", "format: jsonl\n    watch: true\n    schema"),
        file="p.yaml", env={})
    warnings: list[str] = []
    preflight(spec, PreflightOptions(checkpoints=False), warnings.append)
    assert warnings == [f"source 'orders' watches './in/*.jsonl', which matches no file yet "
                        f"(relative paths are resolved against {tmp_path}); it waits for "
                        "files to arrive"]


def test_streamer_test_checks_only_what_the_cases_do_not_replace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = load_pipeline_text(textwrap.dedent(RUNNABLE), file="p.yaml", env={})
    preflight(spec, PreflightOptions(checkpoints=False, replaced=frozenset({"orders"}),
                                     sinks=False), print)


@pytest.mark.spark
def test_a_finished_job_says_so_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        spark: object) -> None:
    from streamer.runtime.job.coordinator import JobRunner, RunOptions

    with_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.yaml").write_text(textwrap.dedent(RUNNABLE))
    spec = load_pipeline_text(textwrap.dedent(RUNNABLE), file="p.yaml",
                              env=dict(os.environ))
    JobRunner(spec, RunOptions(ui=False, checkpoints=True),  # type: ignore[arg-type]
              spark=spark).run()
    code, out, took = invoke(tmp_path, monkeypatch, RUNNABLE, "run", "p.yaml")
    assert code == 0
    golden("finished_job", out)
    assert took < 10
    (tmp_path / "in" / "b.jsonl").write_text((tmp_path / "in" / "a.jsonl").read_text())
    from streamer.runtime.exceptions import JobFinishedError

    preflight(spec, PreflightOptions(), print)  # (a new file: the run reads it)
    (tmp_path / "in" / "b.jsonl").unlink()
    with pytest.raises(JobFinishedError):
        preflight(spec, PreflightOptions(), print)
    preflight(spec, PreflightOptions(fresh=True), print)


def test_an_incomplete_expression_is_a_validate_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = invoke(tmp_path, monkeypatch, HEAD + """\
    operators:
      - id: big
        input: orders
        filter: "amount > 500 AND"
      - id: cols
        input: big
        with_columns: {small: "amount < 10 or", name: "upper(user)"}
    sinks:
      - {id: out, type: console, input: cols}
    """, "validate", "--no-spark", "p.yaml")
    assert code == 1
    golden("incomplete_expression", out)


@pytest.mark.spark
def test_the_analyzer_refuses_a_stray_word_spark_would_read_as_an_alias(
        tmp_path: Path, spark: object) -> None:
    from streamer.pipeline.exceptions import PipelineError
    from streamer.runtime.job.checks import analyze_spec

    with_inputs(tmp_path)
    spec = load_pipeline_text(textwrap.dedent(HEAD.replace("./in", str(tmp_path / "in")) + """\
    operators:
      - id: names
        input: orders
        select: {name: "upper(user) extra", n: "amount AS n", ok: "amount + 1"}
    sinks:
      - {id: out, type: console, input: names}
    """), file="p.yaml", env={})
    with pytest.raises(PipelineError) as info:
        analyze_spec(spec, spark)  # type: ignore[arg-type]
    assert str(info.value) == (
        "p.yaml:11:20: column 'name' of operator 'names' is incomplete or has a stray word: "
        "Spark reads 'upper(user) extra' as 'upper(user)' named 'extra'; complete the "
        "expression, or remove 'extra'")


def test_a_misspelt_process_class_suggests_the_nearest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "first_hour_scoring.py").write_text(textwrap.dedent("""\
        from streamer.operators.process import KeyedProcessFunction


        class ScoreOrders(KeyedProcessFunction):
            output_schema = "user string, score double"


        class Other(KeyedProcessFunction):
            output_schema = "user string"
        """))
    code, out, took = invoke(tmp_path, monkeypatch, HEAD + """\
        event_time: ts
    operators:
      - id: scored
        input: orders
        key_by: [user]
        process: "first_hour_scoring:ScoreOrder"
    sinks:
      - {id: out, type: console, input: scored}
    """, "validate", "--no-spark", "p.yaml")
    assert code == 1
    golden("process_class_misspelt", out)
    assert took < 2


@pytest.mark.spark
def test_validate_prints_every_files_spark_free_errors_before_spark_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: object) -> None:
    with_inputs(tmp_path)
    (tmp_path / "bad.yaml").write_text(textwrap.dedent(RUNNABLE.replace("[user]", "[usr]")))
    code, out, _ = invoke(tmp_path, monkeypatch, RUNNABLE, "validate", "good.yaml",
                          "bad.yaml", name="good.yaml")
    assert code == 1
    assert out.splitlines() == [
        "error bad.yaml:12:14: key_by column 'usr' of operator 'per_user' is not in its "
        "input; did you mean 'user'?",
        "1 problem",
        "checking expressions with Spark's analyzer (1 file; --no-spark skips this)",
        "ok good.yaml"]
