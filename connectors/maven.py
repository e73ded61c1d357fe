"""Jars from Maven Central, resolved with Maven's dependency plugin into a cache directory
(`~/.cache/streamer`, or `$STREAMER_CACHE`): Spark's own Kafka connector for `client: spark`,
Spark's S3A connector (`connectors/files/s3a.py`), and the Kafka broker that the tests and the docs
example (docs/operations/kafka.md) run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streamer.connectors.exceptions import ConnectorError

SCALA = "2.13"
#: Spark's Kafka token provider: Maven Central serves it only up to 4.0.0 at the time of
#: writing (the connector itself up to 4.2.0); the connector only calls its config helpers.
TOKEN_PROVIDER = "4.0.0"


def cache_dir() -> Path:
    """Where resolved jars are kept."""
    return Path(os.environ.get("STREAMER_CACHE", Path.home() / ".cache" / "streamer"))


_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>streamer</groupId><artifactId>{name}-deps</artifactId><version>1</version>
  <dependencies>{deps}
  </dependencies>
</project>
"""
#: Every repository a pom names (Spark's poms add a Google mirror) is fetched from Maven Central.
_SETTINGS = """<settings><mirrors><mirror><id>central-only</id><mirrorOf>*</mirrorOf>
  <url>https://repo1.maven.org/maven2</url></mirror></mirrors></settings>
"""
_DEP = """
    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>
      <exclusions>{x}</exclusions></dependency>"""
_EXCLUSION = "<exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId></exclusion>"


def after_jars(conf: Mapping[str, Any], jars: list[str]) -> str:
    """`spark.jars` of `conf` (the user's own first) with `jars` after them."""
    mine = conf.get("spark.jars")
    return ",".join([*([str(mine)] if mine else []), *jars])


def resolve(name: str, coordinates: list[str], exclude: tuple[str, ...] = ()) -> Path:
    """The directory holding `coordinates` (group:artifact:version) and their runtime
    dependencies (less `exclude`, group:artifact), resolved once with
    `mvn dependency:copy-dependencies` from Maven Central."""
    target = cache_dir() / name
    jars = target / "jars"
    done = target / ".complete"
    if done.exists():
        return jars
    if shutil.which("mvn") is None:
        msg = f"Maven (mvn) is needed to fetch {name} from Maven Central; install it"
        raise ConnectorError(msg)
    target.mkdir(parents=True, exist_ok=True)
    excluded = "".join(_EXCLUSION.format(g=g, a=a) for g, a in (x.split(":") for x in exclude))
    deps = "".join(_DEP.format(g=g, a=a, v=v, x=excluded)
                   for g, a, v in (c.split(":") for c in coordinates))
    (target / "pom.xml").write_text(_POM.format(name=name, deps=deps))
    (target / "settings.xml").write_text(_SETTINGS)
    cmd = ["mvn", "-q", "-B", "-U", "-s", str(target / "settings.xml"),
           "-f", str(target / "pom.xml"), "dependency:copy-dependencies",
           f"-DoutputDirectory={jars}", "-DincludeScope=runtime"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        msg = f"mvn could not resolve {coordinates}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        raise ConnectorError(msg)
    done.write_text("\n".join(sorted(p.name for p in jars.glob("*.jar"))))
    return jars


def spark_kafka_version() -> str:
    """The newest release of `spark-sql-kafka-0-10` on Maven Central not newer than the
    installed pyspark (Maven Central had no 4.3.0 build of it when this was written; 4.2.0
    works with pyspark 4.3.0: the connector uses only Spark's public DataSource V2 API)."""
    import urllib.request

    import pyspark

    wanted = _version_key(pyspark.__version__)
    url = (f"https://repo1.maven.org/maven2/org/apache/spark/spark-sql-kafka-0-10_{SCALA}/"
           "maven-metadata.xml")
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    found = [v for v in re.findall(r"<version>([0-9.]+)</version>", text)
             if _version_key(v)[0] == wanted[0] and _version_key(v) <= wanted]
    if not found:
        msg = f"Maven Central has no spark-sql-kafka-0-10 release for Spark {pyspark.__version__}"
        raise ConnectorError(msg)
    return max(found, key=_version_key)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def spark_kafka_jars() -> list[str]:
    """Jar paths of Spark's Kafka connector for the installed pyspark (for `spark.jars`)."""
    import pyspark

    done = sorted(cache_dir().glob("spark-sql-kafka-*/.complete"))
    # Resolved before: no network needed.
    v = done[-1].parent.name.removeprefix("spark-sql-kafka-") if done else spark_kafka_version()
    # The token provider (delegation tokens; the connector calls its config helpers) is
    # published on Maven Central only up to 4.0.0 at the time of writing; 4.0.0 works.
    token = f"org.apache.spark:spark-token-provider-kafka-0-10_{SCALA}"
    jars = resolve(f"spark-sql-kafka-{v}", [
        f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{v}", f"{token}:{TOKEN_PROVIDER}"],
        exclude=(token,))
    # pyspark ships Spark's, Hadoop's and Scala's jars; second copies of them would clash.
    del pyspark
    wanted = ("spark-sql-kafka", "spark-token-provider", "kafka-clients", "commons-pool2")
    return sorted(str(p) for p in jars.glob("*.jar") if p.name.startswith(wanted))


