"""`streamer run --submit`: the options it refuses (one line, no traceback) and the spark-submit
command and package it builds. The jobs themselves run in tests/cluster."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamer.cli.main import app
from streamer.runtime.cluster.submit import SubmitOptions, build_package, submit_command

runner = CliRunner()
EXAMPLE = Path(__file__).parents[2] / "pipelines" / "clicks_per_user.yaml"


@pytest.mark.parametrize(("args", "message"), [
    (["--submit", "--master", "spark://127.0.0.1:7077", "--deploy-mode", "cluster"],
     "Spark standalone refuses Python applications in cluster deploy mode"),
    (["--submit", "--master", "spark://127.0.0.1:7077", "--deploy-mode", "yarn"],
     "--deploy-mode must be client or cluster"),
    (["--submit"], "--submit needs a cluster master"),
    (["--submit", "--master", "local[2]"], "--submit needs a cluster master"),
    (["--executor-memory", "1g"], "--executor-memory only apply with --submit"),
    (["--spark-arg=--verbose"], "--spark-arg / -- only apply with --submit"),
    (["--", "--verbose"], "--spark-arg / -- only apply with --submit"),
    (["--submit", "--master", "spark://127.0.0.1:7077", "--python-env", "/nope.tar.gz"],
     "is not a file"),
])
def test_refused_submit_options(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["run", str(EXAMPLE), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_the_package_holds_streamer_and_nothing_else(tmp_path: Path) -> None:
    with zipfile.ZipFile(build_package(tmp_path)) as zf:
        names = set(zf.namelist())
    for needed in ("streamer/__init__.py", "streamer/runtime/job/coordinator.py",
                   "streamer/operators/keyed.py", "streamer/runtime/cluster/log4j2.properties"):
        assert needed in names
    assert not [n for n in names if n.startswith(("streamer/tests/", "streamer/bench/",
                                                  "streamer/.venv/"))]


def test_the_spark_submit_command(tmp_path: Path) -> None:
    options = SubmitOptions(master="spark://127.0.0.1:7077", conf={"spark.x": "cli"},
                            executor_memory="2g", num_executors=3,
                            spark_args=["--total-executor-cores", "2"])
    cmd = submit_command(EXAMPLE, ["run", str(EXAMPLE), "--json"], options,
                         {"spark.x": "file", "spark.y": "file"}, tmp_path, app_name="streamer:x")
    assert cmd[0].endswith("bin/spark-submit")
    text = " ".join(cmd)
    assert "--master spark://127.0.0.1:7077 --deploy-mode client" in text
    assert f"--py-files {tmp_path / 'streamer.zip'}" in text
    assert f"--files {EXAMPLE}" in text
    assert "--executor-memory 2g --num-executors 3" in text
    assert "spark.x=cli" in text and "spark.x=file" not in text and "spark.y=file" in text
    assert "spark.driver.host=127.0.0.1" in text  # a loopback master: a loopback driver
    entry = tmp_path / "streamer_driver.py"
    assert cmd[-4:] == [str(entry), "run", str(EXAMPLE), "--json"]
    assert cmd[-6:-4] == ["--total-executor-cores", "2"]
    assert "from streamer.cli.main import main" in entry.read_text()


def test_an_unreachable_master_is_one_line(tmp_path: Path) -> None:
    from streamer.runtime.cluster.standalone import free_port

    master = f"spark://127.0.0.1:{free_port()}"
    for args in (["--submit", "--master", master], ["--master", master]):
        result = runner.invoke(app, ["run", str(EXAMPLE), *args, "--storage", str(tmp_path)])
        assert result.exit_code == 1, result.output
        assert f"cannot reach the Spark master {master}" in result.output
        assert "Traceback" not in result.output
