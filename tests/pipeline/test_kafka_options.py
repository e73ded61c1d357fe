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
def test_spark_client_puts_the_connector_after_the_users_packages() -> None:
    """Spark resolves the connector (its version found on Maven Central, or in the Ivy cache
    after the first run) through `spark.jars.packages`, from Maven Central only."""
    from streamer.connectors.kafka.kafka_source import session_conf
    from streamer.connectors.maven import IVY_SETTINGS, KAFKA_CONNECTOR, ivy_dir

    spec = load_pipeline_text(SPARK_CLIENT.replace("CLIENT", "spark"), env={})
    conf = session_conf(spec, {"spark.jars": "/my/udfs.jar",
                               "spark.jars.packages": "com.example:udfs:1.0"})
    mine, connector = conf["spark.jars.packages"].split(",")
    assert mine == "com.example:udfs:1.0"
    assert connector.startswith(f"{KAFKA_CONNECTOR}:4.")
    assert "spark.jars" not in conf  # the user's jars are left as they are
    assert "org.apache.kafka:kafka-clients" not in conf["spark.jars.excludes"]
    assert conf["spark.jars.ivy"] == str(ivy_dir())
    assert Path(conf["spark.jars.ivySettings"]).read_text() == IVY_SETTINGS
    # A user's own Ivy choices are theirs: left as they are.
    theirs = session_conf(spec, {"spark.jars.ivy": "/ivy", "spark.jars.ivySettings": "/s.xml"})
    assert not {"spark.jars.ivy", "spark.jars.ivySettings"} & set(theirs)
    confluent = load_pipeline_text(SPARK_CLIENT.replace("CLIENT", "confluent"), env={})
    assert session_conf(confluent, {"spark.jars": "/my/udfs.jar"}) == {}


@pytest.mark.kafka
def test_spark_submit_gets_the_connector_packages_on_its_command_line() -> None:
    """Under spark-submit the session exists before the driver runs: the packages a local run
    adds to the session must be in the submitted conf (spark-submit resolves them and ships
    their jars to the executors)."""
    from streamer.connectors.maven import KAFKA_CONNECTOR
    from streamer.runtime.cluster.submit import submit_conf

    text = SPARK_CLIENT.replace("CLIENT", "spark")
    spec = load_pipeline_text(text.replace(
        "sources:", 'spark: {spark.jars.packages: "com.example:udfs:1.0"}\nsources:', 1), env={})
    conf = submit_conf(spec)
    packages = conf["spark.jars.packages"].split(",")
    assert packages[0] == "com.example:udfs:1.0"
    assert packages[1].startswith(f"{KAFKA_CONNECTOR}:")
    # `--conf spark.jars.packages=...` is the user's too: the connector goes after it.
    cli = submit_conf(spec, {"spark.jars.packages": "com.example:cli:2.0"})
    assert cli["spark.jars.packages"].split(",")[0] == "com.example:cli:2.0"
    assert cli["spark.jars.packages"].split(",")[1].startswith(f"{KAFKA_CONNECTOR}:")
    assert Path(conf["spark.jars.ivySettings"]).is_file()
    confluent = load_pipeline_text(SPARK_CLIENT.replace("CLIENT", "confluent"), env={})
    assert "spark.jars.packages" not in submit_conf(confluent)
