"""The Kafka source and sink options: every mistake reported at its `file:line:col`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamer.cli.main import app
from streamer.pipeline.exceptions import PipelineError
from streamer.pipeline.validate import load_pipeline_text

BAD = """\
name: p
sources:
  - id: src
    type: kafka
    bootstrap_servers: h:9092
    topic: t
    client: kafka-python
    format: raw
    schema: {a: int}
    on_error: bad
    record_timestamp: 1ts
    bounded: yes please
sinks:
  - id: out
    type: kafka
    input: src
    bootstrap_servers: h:9092
    topic: o
    propertes: {a: 1}
  - id: bad
    type: console
"""


def test_kafka_option_mistakes_are_reported_at_their_lines() -> None:
    with pytest.raises(PipelineError) as info:
        load_pipeline_text(BAD, file="p.yaml", env={})
    assert [str(p) for p in info.value.problems] == [
        "p.yaml:7:13: 'client' must be one of confluent, spark; got 'kafka-python'",
        "p.yaml:9:5: format: raw has the columns key, value, topic, partition, offset, "
        "timestamp; remove 'schema'",
        "p.yaml:10:5: format: raw cannot fail to decode; remove 'on_error'",
        "p.yaml:11:23: 'record_timestamp' '1ts' must be a column name (letters, digits and "
        "underscores, not starting with a digit)",
        "p.yaml:12:14: 'bounded' must be true or false, got 'yes please'",
        "p.yaml:19:5: unknown key 'propertes' in sink 'out'; did you mean 'properties'?",
    ]


@pytest.mark.spark
def test_json_without_schema_is_one_line_at_the_source(spark: object, tmp_path: Path) -> None:
    """No broker is contacted to validate: the message comes from the source's schema."""
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent("""\
        name: p
        sources:
          - id: src
            type: kafka
            bootstrap_servers: 127.0.0.1:9
            topic: t
        sinks:
          - id: out
            type: console
            input: src
        """))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 1
    assert (f"{path}:3:5: source 'src' reads JSON values but has no schema; add schema: "
            "{column: type}, or use format: raw") in " ".join(result.output.split())
    assert "Traceback" not in result.output


SPARK_CLIENT = """\
name: p
sources:
  - id: src
    type: kafka
    bootstrap_servers: h:9092
    topic: t
    schema: {a: int}
    client: CLIENT
sinks:
  - id: out
    type: console
    input: src
"""


@pytest.mark.kafka
def test_spark_client_puts_the_connector_jars_after_the_users_jars() -> None:
    from streamer.connectors.kafka.kafka_source import session_conf

    spec = load_pipeline_text(SPARK_CLIENT.replace("CLIENT", "spark"), env={})
    jars = session_conf(spec, {"spark.jars": "/my/udfs.jar"})["spark.jars"].split(",")
    assert jars[0] == "/my/udfs.jar"
    names = [Path(j).name for j in jars[1:]]
    assert any(n.startswith("spark-sql-kafka-0-10_2.13-") for n in names)
    assert any(n.startswith("kafka-clients-") for n in names)
    assert all(Path(j).exists() for j in jars[1:])
    confluent = load_pipeline_text(SPARK_CLIENT.replace("CLIENT", "confluent"), env={})
    assert session_conf(confluent, {"spark.jars": "/my/udfs.jar"}) == {}


@pytest.mark.kafka
def test_spark_submit_gets_the_connector_jars_on_its_command_line() -> None:
    """Under spark-submit the session exists before the driver runs: the jars a local run adds
    to the session must be in the submitted conf."""
    from streamer.runtime.cluster.submit import submit_conf

    text = SPARK_CLIENT.replace("CLIENT", "spark")
    spec = load_pipeline_text(text.replace("sources:", 'spark: {spark.jars: "/my/udfs.jar"}\n'
                                           "sources:", 1), env={})
    jars = submit_conf(spec)["spark.jars"].split(",")
    assert jars[0] == "/my/udfs.jar"
    assert any(Path(j).name.startswith("spark-sql-kafka-0-10_2.13-") for j in jars[1:])
    confluent = load_pipeline_text(SPARK_CLIENT.replace("CLIENT", "confluent"), env={})
    assert "spark.jars" not in submit_conf(confluent)
