"""An exception in user code names the operator and shows the user's frames
(`file.py:line in function`, the line, the exception), not the stage whose Spark job ran it
nor streamer's, PySpark's or the JVM's frames; the same whether the subtasks ran in the
driver or in Spark's Python workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.exceptions import JobFailedError
from streamer.runtime.job.coordinator import JobRunner, RunOptions
from streamer.user_errors import describe, user_error, user_error_message

pytestmark = pytest.mark.spark

GOLDEN = Path(__file__).parent / "golden" / "user_code_error.txt"

MODULE = """\
from streamer.operators.process import KeyedProcessFunction


def lookup(row):
    return row["nope"]


class Boom(KeyedProcessFunction):
    output_schema = "user string, n bigint"

    def process_element(self, row, ctx):
        yield {"user": row["user"], "n": lookup(row)}
"""

PIPELINE = """\
name: boom
job: {restart: {attempts: 0}, parallelism: 2}
sources:
  - id: gen
    type: datagen
    limit: 5
    fields: {user: "concat('u', offset % 2)", ts: "timestamp_millis(1767225600000 + offset)"}
    event_time: ts
operators:
  - id: scored
    input: gen
    key_by: [user]
    process: "user_errors_boom:Boom"
sinks:
  - {id: out, type: files, input: scored, path: ./out, format: jsonl}
"""


@pytest.mark.parametrize("in_driver", ["1", "0"], ids=["driver subtasks", "spark tasks"])
def test_a_process_function_error_shows_the_users_frames(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: object, in_driver: str
) -> None:
    monkeypatch.setenv("STREAMER_DRIVER_SUBTASKS", in_driver)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "user_errors_boom.py").write_text(MODULE)
    (tmp_path / "p.yaml").write_text(PIPELINE)
    spec = load_pipeline_text(PIPELINE, file=str(tmp_path / "p.yaml"), env={})
    with pytest.raises(JobFailedError) as info:
        JobRunner(spec, RunOptions(ui=False), spark=spark).run()  # type: ignore[arg-type]
    assert str(info.value) == GOLDEN.read_text().rstrip("\n")


def test_frames_of_streamer_and_the_standard_library_are_left_out() -> None:
    import json

    def users_code() -> None:
        json.loads("{")

    try:
        users_code()
    except ValueError as exc:
        text = describe(exc, "operator 'x'")
        marked = user_error(exc, "operator 'x'")
    lines = text.splitlines()
    assert lines[0] == "operator 'x' failed in user code:"
    assert lines[1].endswith(" in test_frames_of_streamer_and_the_standard_library_are_left_out")
    assert lines[3].endswith(" in users_code")
    assert lines[-1].startswith("JSONDecodeError: ")
    assert not any("json/decoder.py" in line for line in lines)
    assert marked is not None
    assert user_error_message(f"Traceback ...\nUserCodeError: {marked}\n\tat org.x") == text
    assert user_error_message("no marker here") is None
