"""What a pipeline with `files` paths on S3 gives Spark (`connectors/files/s3a.py`): the S3A
settings from `storage_options:` or the `AWS_*` variables, and `s3a://` URLs for the source's
files instead of local copies. No Spark session and no server: the end-to-end reads and writes
are tests/runtime/test_s3a.py's."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, cast

import pytest

from streamer.connectors import maven
from streamer.connectors.base import ConnectorContext
from streamer.connectors.files import s3a
from streamer.connectors.files.files_source import FilesSource
from streamer.pipeline.validate import load_pipeline_text

S3A = "spark.hadoop.fs.s3a."

PIPELINE = """\
name: conf
storage_options: {{endpoint_url: "{endpoint}", key: k, secret: s, region: eu-west-1}}
sources:
  - {{id: orders, type: files, path: "{path}", format: jsonl,
      schema: {{order_id: bigint}}}}
sinks:
  - {{id: out, type: files, input: orders, path: /tmp/out, format: jsonl}}
"""


def test_storage_options_become_s3a_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    conf = s3a.hadoop_conf({"endpoint_url": "http://127.0.0.1:9000", "key": "k", "secret": "s"})
    assert conf[S3A + "endpoint"] == "http://127.0.0.1:9000"
    assert conf[S3A + "path.style.access"] == "true"
    assert conf[S3A + "connection.ssl.enabled"] == "false"
    assert (conf[S3A + "access.key"], conf[S3A + "secret.key"]) == ("k", "s")
    assert conf[S3A + "aws.credentials.provider"].endswith("SimpleAWSCredentialsProvider")
    # The AWS_* variables fill what the block leaves out; a token needs temporary credentials.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://minio.example:9000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ek")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "es")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "et")
    conf = s3a.hadoop_conf({"region": "eu-west-1"})
    assert conf[S3A + "connection.ssl.enabled"] == "true"
    assert conf[S3A + "endpoint.region"] == "eu-west-1"
    assert (conf[S3A + "access.key"], conf[S3A + "session.token"]) == ("ek", "et")
    assert conf[S3A + "aws.credentials.provider"].endswith("TemporaryAWSCredentialsProvider")
    anon = s3a.hadoop_conf({"anon": True})
    assert anon[S3A + "aws.credentials.provider"].endswith("AnonymousAWSCredentialsProvider")
    assert S3A + "access.key" not in anon


def test_session_conf_only_for_s3_paths(monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    monkeypatch.setenv("STREAMER_CACHE", str(tmp_path / "cache"))
    spec = load_pipeline_text(textwrap.dedent(PIPELINE.format(
        endpoint="http://127.0.0.1:9000", path="s3://bucket/in/*.jsonl")))
    conf = s3a.session_conf(spec, {"spark.jars": "/mine.jar",
                                   "spark.jars.packages": "com.example:udfs:1.0",
                                   S3A + "endpoint": "http://user-choice:1"})
    # Spark resolves hadoop-aws (pyspark's Hadoop version) after the user's own packages.
    assert conf["spark.jars.packages"] == (
        f"com.example:udfs:1.0,org.apache.hadoop:hadoop-aws:{s3a.hadoop_version()}")
    assert "spark.jars" not in conf  # the user's jars are left as they are
    assert "org.apache.hadoop:hadoop-client-runtime" in conf["spark.jars.excludes"].split(",")
    assert conf["spark.jars.ivy"] == str(tmp_path / "cache" / "ivy")
    assert Path(conf["spark.jars.ivySettings"]).read_text() == maven.IVY_SETTINGS
    assert S3A + "endpoint" not in conf  # the pipeline's spark: block wins
    assert conf[S3A + "endpoint.region"] == "eu-west-1"
    local = load_pipeline_text(textwrap.dedent(PIPELINE.format(
        endpoint="http://127.0.0.1:9000", path="/data/in/*.jsonl")).replace(
            "storage_options: {endpoint_url: \"http://127.0.0.1:9000\", key: k, secret: s, "
            "region: eu-west-1}\n", ""))
    assert s3a.session_conf(local, {}) == {}


def test_a_files_source_on_s3_gives_spark_s3a_urls() -> None:
    spec = load_pipeline_text(textwrap.dedent(PIPELINE.format(
        endpoint="http://127.0.0.1:9", path="s3://bucket/in/*.jsonl")))
    source = FilesSource(spec.sources[0], ConnectorContext(cast(Any, None), "conf"))
    urls = source._spark_paths(["s3://bucket/in/a[1].jsonl"])
    assert urls == {"s3://bucket/in/a[1].jsonl": "s3a://bucket/in/a[1].jsonl"}
    assert source._copies is None  # nothing downloaded
    from streamer.connectors.files.files_source import spark_path

    assert spark_path(urls["s3://bucket/in/a[1].jsonl"]) == r"s3a://bucket/in/a\[1\].jsonl"
