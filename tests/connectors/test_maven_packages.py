"""Connectors' jars come through Spark's own `spark.jars.packages` (`connectors/maven.py`):
the Kafka connector's version, the jars Spark's Ivy resolves from Maven Central (exactly those
pyspark does not ship), a real driver session that can load both connectors' classes, and the
message a user gets when a package cannot be resolved. No Maven anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from streamer.connectors import maven
from streamer.connectors.files.s3a import hadoop_version, s3a_packages
from streamer.connectors.maven import KAFKA_CONNECTOR, TOKEN_PROVIDER


def cache_ivy_files(root: Path, coordinate: str, versions: list[str]) -> None:
    """Ivy's cache layout for `coordinate` at `versions`, as a resolution leaves it."""
    group, artifact = coordinate.split(":")
    folder = root / "ivy" / "cache" / group / artifact
    folder.mkdir(parents=True, exist_ok=True)
    for v in versions:
        (folder / f"ivy-{v}.xml").write_text("<ivy-module/>")


def test_the_kafka_connector_is_a_release_whose_token_provider_exists_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ivy fails on a connector whose token provider Maven Central lacks (4.1.0 has none), so
    the newest version with both wins; versions newer than pyspark never do."""
    monkeypatch.setenv("STREAMER_CACHE", str(tmp_path))
    cache_ivy_files(tmp_path, KAFKA_CONNECTOR, ["4.0.0", "4.1.0", "9.0.0", "4.0.0-preview1"])
    cache_ivy_files(tmp_path, TOKEN_PROVIDER, ["4.0.0", "4.1.1", "9.0.0"])
    assert maven.spark_kafka_version() == "4.0.0"
    cache_ivy_files(tmp_path, TOKEN_PROVIDER, ["4.1.0"])
    assert maven.spark_kafka_version() == "4.1.0"


def test_packages_are_appended_once_after_the_users(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMER_CACHE", str(tmp_path))
    packages = maven.Packages(("a:b:1", "c:d:2"), ("x:y",))
    conf = maven.packages_conf({"spark.jars.packages": "me:mine:1, a:b:1",
                                "spark.jars.excludes": "me:not"}, packages)
    assert conf["spark.jars.packages"] == "me:mine:1,a:b:1,c:d:2"
    assert conf["spark.jars.excludes"] == "me:not,x:y"
    settings = Path(conf["spark.jars.ivySettings"]).read_text()
    # Maven Central is the only repository: Spark's default chain also asks
    # spark-packages.org, which a machine may not reach.
    assert settings.count("<ibiblio ") == 1 and f'root="{maven.CENTRAL}"' in settings


@pytest.mark.kafka
def test_spark_resolves_the_kafka_connector_without_what_pyspark_ships() -> None:
    jars = maven.resolve_now(maven.spark_kafka_packages())
    names = sorted(Path(j).name.split("_", 1)[0] + ":" + Path(j).name.split("_", 1)[1]
                   .rsplit("-", 1)[0] for j in jars)
    assert names == ["org.apache.commons:commons-pool2", "org.apache.kafka:kafka-clients",
                     "org.apache.spark:spark-sql-kafka-0-10_2.13",
                     "org.apache.spark:spark-token-provider-kafka-0-10_2.13"]
    assert all(Path(j).parent == maven.ivy_dir() / "jars" and Path(j).is_file() for j in jars)


@pytest.mark.s3
def test_spark_resolves_hadoop_aws_with_the_sdk_bundle_and_no_hadoop() -> None:
    jars = [Path(j).name for j in maven.resolve_now(s3a_packages())]
    assert f"org.apache.hadoop_hadoop-aws-{hadoop_version()}.jar" in jars
    assert any(j.startswith("software.amazon.awssdk_bundle-") for j in jars)
    assert not [j for j in jars if j.startswith("org.apache.hadoop_hadoop-")
                and not j.startswith("org.apache.hadoop_hadoop-aws-")]


SESSION = """\
import json, sys
from streamer.connectors.registry import session_conf
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.cluster.spark import create_session

spec = load_pipeline_text(open(sys.argv[1]).read(), env={})
spark = create_session("packages", "local[1]", session_conf(spec, dict(spec.spark)), ui=False)
jvm, conf = spark._jvm, spark.sparkContext.getConf()
kafka = jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
    "kafka", spark._jsparkSession.sessionState().conf())
s3a = jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(
    "s3a", spark.sparkContext._jsc.hadoopConfiguration())
print(json.dumps({"kafka": kafka.getName(), "s3a": s3a.getName(),
                  **{k: conf.get(k) for k in ("spark.jars", "spark.jars.packages",
                                               "spark.jars.ivy", "spark.jars.ivySettings")}}))
spark.stop()
"""


@pytest.mark.kafka
@pytest.mark.s3
def test_a_session_for_kafka_and_s3_loads_both_connectors(tmp_path: Path) -> None:
    """The session `streamer run` starts for a `client: spark` Kafka source and an s3:// sink
    has Spark resolve both connectors (after the user's own packages) and load their classes."""
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(textwrap.dedent("""\
        name: p
        spark: {spark.jars.packages: "org.apache.commons:commons-pool2:2.13.1"}
        storage_options: {endpoint_url: "http://127.0.0.1:9", key: k, secret: s}
        sources:
          - {id: src, type: kafka, client: spark, bootstrap_servers: "127.0.0.1:9", topic: t,
             schema: {a: int}}
        sinks:
          - {id: out, type: files, input: src, path: "s3://bucket/out", format: jsonl}
        """))
    script = tmp_path / "session.py"
    script.write_text(SESSION)
    done = subprocess.run([sys.executable, str(script), str(pipeline)], capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["kafka"] == "org.apache.spark.sql.kafka010.KafkaSourceProvider"
    assert got["s3a"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    packages = got["spark.jars.packages"].split(",")
    assert packages[0] == "org.apache.commons:commons-pool2:2.13.1"
    assert packages[1].startswith(f"{KAFKA_CONNECTOR}:")
    assert packages[2] == f"org.apache.hadoop:hadoop-aws:{hadoop_version()}"
    assert (got["spark.jars.ivy"], got["spark.jars.ivySettings"]) == (
        str(maven.ivy_dir()), str(maven.ivy_dir() / "ivysettings.xml"))
    # The resolved jars are on spark.jars (executors fetch them from the driver).
    assert str(maven.ivy_dir() / "jars") in got["spark.jars"]


@pytest.mark.slow
def test_a_package_spark_cannot_resolve_is_one_clear_error(tmp_path: Path) -> None:
    """Not found on Maven Central (or no network): a message naming the package and the log,
    no traceback."""
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(textwrap.dedent(f"""\
        name: p
        storage: {tmp_path / "storage"}
        spark: {{spark.jars.packages: "org.example.streamer:no-such-artifact:0.0.1"}}
        sources:
          - {{id: gen, type: datagen, limit: 3, fields: {{n: "offset"}}}}
        sinks:
          - {{id: out, type: files, input: gen, path: {tmp_path / "out"}, format: jsonl}}
        """))
    streamer = Path(sys.executable).with_name("streamer")
    done = subprocess.run([str(streamer), "run", str(pipeline), "--no-ui", "--quiet"],
                          capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "STREAMER_CACHE": str(tmp_path)})
    assert done.returncode != 0
    message = " ".join(done.stderr.split())
    assert "could not resolve spark.jars.packages" in message, done.stderr[-3000:]
    assert "org.example.streamer:no-such-artifact:0.0.1" in message
    assert "Traceback" not in done.stderr
