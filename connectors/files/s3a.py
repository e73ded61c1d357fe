"""Spark's own reads and writes of `s3://` paths, through Hadoop's S3A connector.

A `files` source or sink whose path is `s3://bucket/key` has Spark read and write
`s3a://bucket/key` directly (no local copy): `session_conf` puts `hadoop-aws` (the version of
the Hadoop that pyspark bundles) on `spark.jars.packages`, which Spark resolves from Maven
Central with the AWS SDK v2 bundle its POM names (once, then from the cache:
`connectors/maven.py`), and sets the `spark.hadoop.fs.s3a.*` settings from the pipeline's
`storage_options:` or the `AWS_*` variables, the same ones s3fs uses for streamer's own
requests.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from streamer.connectors.exceptions import ConnectorError
from streamer.connectors.maven import HADOOP_CLIENT, Packages, packages_conf

if TYPE_CHECKING:
    from streamer.pipeline.spec import PipelineSpec

#: What hadoop-aws must not bring: Hadoop's own classes are in pyspark's
#: hadoop-client-api/-runtime jars (hadoop-aws's POM marks hadoop-common `provided` today; the
#: exclusions keep it so). What comes: hadoop-aws, the AWS SDK v2 bundle, the analytics
#: accelerator and wildfly-openssl.
EXCLUDES = (*HADOOP_CLIENT, "org.apache.hadoop:hadoop-common",
            "org.apache.hadoop:hadoop-annotations")
S3_PROTOCOLS = ("s3", "s3a")


def is_s3(url: str) -> bool:
    """Whether `url` is an `s3://` (or `s3a://`) URL."""
    return url.split("://", 1)[0].lower() in S3_PROTOCOLS if "://" in url else False


def spark_url(path: str) -> str:
    """An s3fs path (`bucket/key`) or `s3://` URL as the `s3a://` URL Spark reads and writes."""
    return "s3a://" + re.sub(r"^[A-Za-z0-9]+://", "", path)


def hadoop_version() -> str:
    """The Hadoop version pyspark bundles (from its `hadoop-client-api-<v>.jar`)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    found = sorted(jars.glob("hadoop-client-api-*.jar"))
    if not found:
        msg = f"no hadoop-client-api-*.jar in {jars}: cannot tell which hadoop-aws Spark needs"
        raise ConnectorError(msg)
    return found[-1].name.removeprefix("hadoop-client-api-").removesuffix(".jar")


def s3a_packages() -> Packages:
    """`hadoop-aws` matching pyspark's Hadoop (with the AWS SDK bundle its POM names), for
    `spark.jars.packages`."""
    return Packages((f"org.apache.hadoop:hadoop-aws:{hadoop_version()}",), EXCLUDES)


def _setting(options: Mapping[str, Any], key: str, env: str) -> str | None:
    value = options.get(key)
    if value is None:
        value = os.environ.get(env) or None
    return None if value is None else str(value)


def hadoop_conf(options: Mapping[str, Any]) -> dict[str, str]:
    """The `spark.hadoop.fs.s3a.*` settings of a `storage_options:` block (keys left out
    come from the `AWS_*` variables; without a key S3A's default credential chain is used)."""
    out = {"spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
           # Tasks' files are renamed (copied, on S3) once into the staging prefix, not twice:
           # nobody reads the staging prefix, the manifest commit publishes.
           "spark.hadoop.mapreduce.fileoutputcommitter.algorithm.version": "2"}
    prefix = "spark.hadoop.fs.s3a."
    endpoint = _setting(options, "endpoint_url", "AWS_ENDPOINT_URL")
    if endpoint:
        # An S3-compatible store (MinIO, ...): its own host, buckets in the path.
        out[prefix + "endpoint"] = endpoint
        out[prefix + "path.style.access"] = "true"
        out[prefix + "connection.ssl.enabled"] = str(
            urlparse(endpoint).scheme.lower() != "http").lower()
    region = _setting(options, "region", "AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
    out[prefix + "endpoint.region"] = region or "us-east-1"
    if options.get("anon"):
        out[prefix + "aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider")
        return out
    key = _setting(options, "key", "AWS_ACCESS_KEY_ID")
    secret = _setting(options, "secret", "AWS_SECRET_ACCESS_KEY")
    token = _setting(options, "token", "AWS_SESSION_TOKEN")
    if key and secret:
        out[prefix + "access.key"], out[prefix + "secret.key"] = key, secret
        out[prefix + "aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider")
        if token:
            out[prefix + "session.token"] = token
            out[prefix + "aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider")
    return out


def uses_s3(spec: PipelineSpec) -> bool:
    """Whether Spark reads or writes an `s3://` path of the pipeline (a `files` source or
    sink on S3)."""
    paths = [s.option("path") for s in spec.sources if s.type == "files"]
    paths += [s.option("path") for s in spec.sinks if s.type == "files"]
    return any(isinstance(p, str) and is_s3(p) for p in paths)


def session_conf(spec: PipelineSpec, conf: Mapping[str, Any]) -> dict[str, str]:
    """Spark settings a pipeline's `files` sources and sinks on S3 add to `conf`: the S3A
    connector on `spark.jars.packages` (after those already there) and the `fs.s3a.*`
    settings (the pipeline's `spark:` block wins over them)."""
    if not uses_s3(spec):
        return {}
    out = {k: v for k, v in hadoop_conf(spec.storage_options).items() if k not in conf}
    out.update(packages_conf(conf, s3a_packages()))
    return out
