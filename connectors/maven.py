"""Jars from Maven Central, resolved by Spark itself: a connector names Maven coordinates
(`Packages`: Spark's own Kafka connector for `client: spark`, Spark's S3A connector in
`connectors/files/s3a.py`), `packages_conf` puts them on the session's `spark.jars.packages`,
and Spark's Ivy resolves them when the session's JVM starts (spark-submit does the same from
its command line, and ships the jars to the executors). Ivy keeps what it downloads under the
cache directory (`~/.cache/streamer/ivy`, or `$STREAMER_CACHE/ivy`: `spark.jars.ivy`), and asks
Maven Central only (`spark.jars.ivySettings`, the settings file written there): Spark's own
default chain also asks spark-packages.org. The first run downloads, later runs read the cache.
"""

from __future__ import annotations

import os
import tempfile
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamer.connectors.exceptions import ConnectorError

SCALA = "2.13"
CENTRAL = "https://repo1.maven.org/maven2/"
KAFKA_CONNECTOR = f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}"
#: Spark's Kafka token provider (delegation tokens), which the connector depends on at its own
#: version: Maven Central has not always served it for every connector release (at the time
#: of writing: the connector 4.0.0 to 4.2.0, the token provider 4.0.0, 4.1.1 and 4.2.0), and
#: Ivy cannot resolve a connector whose token provider is missing.
TOKEN_PROVIDER = f"org.apache.spark:spark-token-provider-kafka-0-10_{SCALA}"
#: Hadoop's client jars, which pyspark ships (its `jars/`): no connector may bring them again.
HADOOP_CLIENT = ("org.apache.hadoop:hadoop-client-api", "org.apache.hadoop:hadoop-client-runtime")
#: What the Kafka connector's POM brings that pyspark already ships: second copies would only
#: shadow them. Kept: the connector, the token provider, kafka-clients and commons-pool2.
KAFKA_EXCLUDES = (
    *HADOOP_CLIENT, f"org.scala-lang.modules:scala-parallel-collections_{SCALA}",
    "com.google.code.findbugs:jsr305", "org.slf4j:slf4j-api", "org.xerial.snappy:snappy-java",
    "at.yawk.lz4:lz4-java", "org.lz4:lz4-java", "com.github.luben:zstd-jni",
)

IVY_SETTINGS = f"""<ivysettings>
  <!-- Written by streamer (connectors/maven.py): resolve from Maven Central only. -->
  <settings defaultResolver="central"/>
  <caches lockStrategy="artifact-lock-nio"/>
  <resolvers>
    <ibiblio name="central" m2compatible="true" root="{CENTRAL}"/>
  </resolvers>
</ivysettings>
"""


@dataclass(frozen=True)
class Packages:
    """What a connector needs from Maven Central: `coordinates` (group:artifact:version) with
    their runtime dependencies, less `excludes` (group:artifact, also for every other package
    of the session: Spark applies exclusions to the whole resolution)."""

    coordinates: tuple[str, ...]
    excludes: tuple[str, ...] = ()


def cache_dir() -> Path:
    """Where downloads are kept (`~/.cache/streamer`, or `$STREAMER_CACHE`)."""
    return Path(os.environ.get("STREAMER_CACHE", Path.home() / ".cache" / "streamer"))


def ivy_dir() -> Path:
    """Spark's Ivy directory (`spark.jars.ivy`): its cache, and the jars it retrieved."""
    return cache_dir() / "ivy"


def ivy_settings() -> Path:
    """The Ivy settings file (Maven Central only), written when missing or out of date."""
    path = ivy_dir() / "ivysettings.xml"
    if not path.exists() or path.read_text() != IVY_SETTINGS:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(IVY_SETTINGS)
        tmp.replace(path)
    return path


def appended(conf: Mapping[str, Any], key: str, items: Iterable[str]) -> str:
    """The comma-separated setting `key` of `conf` (the user's entries first) with `items`
    after them (each once)."""
    mine = [i.strip() for i in str(conf.get(key) or "").split(",") if i.strip()]
    return ",".join([*mine, *(i for i in dict.fromkeys(items) if i not in mine)])


def packages_conf(conf: Mapping[str, Any], packages: Packages) -> dict[str, str]:
    """The Spark settings that resolve `packages` at the session's start, added to `conf`:
    `spark.jars.packages` and `spark.jars.excludes` after the user's own, and Spark's Ivy
    directory and settings under the cache directory unless the user chose theirs (a user's
    `spark.jars.repositories` is asked after Maven Central)."""
    out = {"spark.jars.packages": appended(conf, "spark.jars.packages", packages.coordinates)}
    if packages.excludes or conf.get("spark.jars.excludes"):
        out["spark.jars.excludes"] = appended(conf, "spark.jars.excludes", packages.excludes)
    if not conf.get("spark.jars.ivy"):
        out["spark.jars.ivy"] = str(ivy_dir())
    if not conf.get("spark.jars.ivySettings"):
        out["spark.jars.ivySettings"] = str(ivy_settings())
    return out


def resolve_now(packages: Packages) -> list[str]:
    """Resolve `packages` into the Ivy cache now, exactly as a session's start does (Spark's
    launcher with the same settings, without a SparkContext), and return the jars' paths.
    CI calls this before the tests, so a missing network fails there, once."""
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    conf = SparkConf(loadDefaults=False)
    for key, value in packages_conf({}, packages).items():
        conf.set(key, value)
    with tempfile.TemporaryFile() as log:
        try:
            gateway = launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": log})
        except Exception as exc:  # pyspark's "gateway exited": Ivy's report is in the log
            log.seek(0)
            report = log.read().decode(errors="replace")[-4000:]
            msg = (f"Spark could not resolve {', '.join(packages.coordinates)} from Maven "
                   f"Central ({CENTRAL}) into {ivy_dir()}:\n{report}")
            raise ConnectorError(msg) from exc
    try:
        jars = str(gateway.jvm.java.lang.System.getProperty("spark.jars") or "")
    finally:
        gateway.shutdown()
        gateway.proc.stdin.close()  # the launcher's JVM exits when its stdin closes
        gateway.proc.wait()
    return [j.removeprefix("file://") for j in jars.split(",") if j]


def central_versions(coordinate: str) -> list[str]:
    """The releases (no previews, snapshots or milestones) Maven Central lists for
    `coordinate` (group:artifact), from its `maven-metadata.xml`."""
    group, artifact = coordinate.split(":")
    url = f"{CENTRAL}{group.replace('.', '/')}/{artifact}/maven-metadata.xml"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            root = ET.fromstring(response.read())
    except (OSError, ET.ParseError) as exc:
        msg = f"cannot read the releases of {coordinate} from Maven Central ({url}): {exc}"
        raise ConnectorError(msg) from exc
    found = (v.text or "" for v in root.iterfind("./versioning/versions/version"))
    return [v for v in found if v and all(p.isdigit() for p in v.split("."))]


def cached_versions(coordinate: str) -> list[str]:
    """The versions of `coordinate` (group:artifact) Ivy has resolved into the cache before."""
    group, artifact = coordinate.split(":")
    found = (ivy_dir() / "cache" / group / artifact).glob("ivy-*.xml")
    versions = (p.name.removeprefix("ivy-").removesuffix(".xml") for p in found)
    return [v for v in versions if all(p.isdigit() for p in v.split("."))]


def version_key(version: str) -> tuple[int, ...]:
    """`4.2.0` as `(4, 2, 0)`, for comparing releases."""
    return tuple(int(p) for p in version.split("."))


def spark_kafka_version() -> str:
    """The Kafka connector's version for the installed pyspark: the newest release not newer
    than pyspark (of its major version) for which both the connector and its token provider
    are on Maven Central (the Ivy cache's first: no network once resolved). Maven Central had
    no 4.3.0 build of the connector when this was written; 4.2.0 works with pyspark 4.3.0, as
    the connector uses only Spark's public DataSource V2 API."""
    import pyspark

    wanted = version_key(pyspark.__version__)

    def usable(versions: set[str]) -> list[str]:
        return sorted((v for v in versions
                       if version_key(v)[0] == wanted[0] and version_key(v) <= wanted),
                      key=version_key)

    cached = usable(set(cached_versions(KAFKA_CONNECTOR)) & set(cached_versions(TOKEN_PROVIDER)))
    if cached:
        return cached[-1]
    found = usable(set(central_versions(KAFKA_CONNECTOR)) & set(central_versions(TOKEN_PROVIDER)))
    if not found:
        msg = (f"Maven Central has no {KAFKA_CONNECTOR} release with its token provider for "
               f"Spark {pyspark.__version__}; use the default `client: confluent`")
        raise ConnectorError(msg)
    return found[-1]


def spark_kafka_packages() -> Packages:
    """Spark's Kafka connector for the installed pyspark, less what pyspark ships."""
    return Packages((f"{KAFKA_CONNECTOR}:{spark_kafka_version()}",), KAFKA_EXCLUDES)
