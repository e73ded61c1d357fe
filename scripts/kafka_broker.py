"""A real single-node Apache Kafka 4 broker (KRaft, combined broker + controller) on 127.0.0.1,
for the Kafka tests, the benchmark and the docs example (docs/operations/kafka.md). No docker:
the broker's jars are resolved from Maven Central with Maven's dependency plugin (`mvn`: the
broker is a development tool; `streamer run` itself never needs Maven) into a cache directory,
the storage is formatted with `kafka.tools.StorageTool`, and `kafka.Kafka` runs in a child JVM.

    .venv/bin/python scripts/kafka_broker.py fetch [broker|spark]   # the jars (CI does this)
    .venv/bin/python scripts/kafka_broker.py run [--port 9092] [--dir DIR] [--topic NAME:N]
    .venv/bin/python scripts/kafka_broker.py consume TOPIC [--bootstrap 127.0.0.1:9092]

`fetch` also has Spark resolve its own Kafka connector (`spark-sql-kafka-0-10`, for
`client: spark`) into its Ivy cache, as a session's start would (`connectors/maven.py`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from streamer.connectors.exceptions import ConnectorError
from streamer.connectors.maven import cache_dir, resolve_now, spark_kafka_packages

KAFKA_VERSION = "4.1.1"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>streamer</groupId><artifactId>{name}-deps</artifactId><version>1</version>
  <dependencies>{deps}
  </dependencies>
</project>
"""
#: Every repository a pom names is fetched from Maven Central.
_SETTINGS = """<settings><mirrors><mirror><id>central-only</id><mirrorOf>*</mirrorOf>
  <url>https://repo1.maven.org/maven2</url></mirror></mirrors></settings>
"""
_DEP = """
    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>
      </dependency>"""


def resolve(name: str, coordinates: list[str]) -> Path:
    """The directory holding `coordinates` (group:artifact:version) and their runtime
    dependencies, resolved once with `mvn dependency:copy-dependencies` from Maven Central."""
    target = cache_dir() / name
    jars = target / "jars"
    done = target / ".complete"
    if done.exists():
        return jars
    if shutil.which("mvn") is None:
        msg = f"Maven (mvn) is needed to fetch {name} from Maven Central; install it"
        raise ConnectorError(msg)
    target.mkdir(parents=True, exist_ok=True)
    deps = "".join(_DEP.format(g=g, a=a, v=v) for g, a, v in (c.split(":") for c in coordinates))
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


def kafka_jars() -> Path:
    """The broker's jars (kafka core with its server, tools and a log4j2 binding)."""
    v = KAFKA_VERSION
    return resolve(f"kafka-{v}", [
        f"org.apache.kafka:kafka_2.13:{v}",
        f"org.apache.kafka:kafka-tools:{v}",
        "org.apache.logging.log4j:log4j-slf4j2-impl:2.24.3",
        "org.apache.logging.log4j:log4j-core:2.24.3",
    ])



def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_LOG4J = """status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = WARN
"""


class KafkaBroker:
    """One broker + controller in a child JVM; `start()` returns once clients can use it."""

    def __init__(self, directory: str | Path, port: int | None = None,
                 heap: str = "512m") -> None:
        self.dir = Path(directory)
        self.port = port or free_port()
        self.controller_port = free_port()
        self.heap = heap
        self.host = "127.0.0.1"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """`host:port` for clients."""
        return f"{self.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        """Where the broker logs (warnings and errors only)."""
        return self.dir / "broker.log"

    def _properties(self) -> Path:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
                         f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.dir / "data"),
            "num.partitions": "1",
            # One node: every internal topic has one replica (transactions need these three).
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
        }
        path = self.dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def _java(self, main: str, *args: str, log: Path | None = None) -> list[str]:
        jars = kafka_jars()
        log4j = self.dir / "log4j2.properties"
        log4j.write_text(_LOG4J.format(log=log or self.log_file))
        return ["java", f"-Xmx{self.heap}", "-Xms128m", "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1", f"-Dlog4j2.configurationFile=file:{log4j}",
                "-cp", f"{jars}/*", main, *args]

    def start(self, timeout: float = 120.0) -> KafkaBroker:
        """Format the storage (first start only), start the JVM and wait until it serves."""
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self._properties()
        if not (self.dir / "data" / "meta.properties").exists():
            cluster = uuid.uuid4().hex[:22]
            fmt = subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", cluster,
                                            "-c", str(config), "--standalone"),
                                 capture_output=True, text=True, check=False)
            if fmt.returncode != 0:
                fmt = subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t",
                                                cluster, "-c", str(config)),
                                     capture_output=True, text=True, check=False)
            if fmt.returncode != 0:
                msg = f"formatting the Kafka storage failed:\n{fmt.stdout}{fmt.stderr}"
                raise RuntimeError(msg)
        out = open(self.dir / "stdout.log", "ab")  # noqa: SIM115 - lives as long as the JVM
        self.proc = subprocess.Popen(self._java("kafka.Kafka", str(config)), stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                msg = (f"the Kafka broker exited with {self.proc.returncode}; see "
                       f"{self.dir / 'stdout.log'} and {self.log_file}")
                raise RuntimeError(msg)
            if self._ready():
                return self
            time.sleep(0.5)
        self.stop()
        msg = f"the Kafka broker did not get ready in {timeout:.0f}s; see {self.log_file}"
        raise RuntimeError(msg)

    def _ready(self) -> bool:
        from confluent_kafka.admin import AdminClient

        try:  # the port first: a client on a closed port logs "Connection refused" lines
            socket.create_connection((self.host, self.port), timeout=1).close()
        except OSError:
            return False
        try:
            admin = AdminClient({"bootstrap.servers": self.bootstrap})
            brokers = admin.list_topics(timeout=2).brokers
            return bool(brokers)
        except Exception:
            return False

    def stop(self) -> None:
        """Stop the JVM (SIGTERM, then SIGKILL after 20 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    # ------------------------------------------------------------------ helpers for tests
    def create_topic(self, name: str, partitions: int = 1) -> str:
        """Create a topic (one replica) and wait until it has leaders."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30)
        futures[name].result(60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            meta = admin.list_topics(name, timeout=5).topics.get(name)
            if meta is not None and meta.error is None and len(meta.partitions) == partitions \
                    and all(p.leader >= 0 for p in meta.partitions.values()):
                return name
            time.sleep(0.2)
        msg = f"topic {name!r} has no leaders after 30 s"
        raise RuntimeError(msg)

    def produce(self, topic: str, records: list[tuple[Any, Any, int | None]],
                **conf: Any) -> None:
        """Produce (key, value, partition or None) records; values that are not bytes or
        str are JSON-encoded. Waits for delivery."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 20, **conf})
        for key, value, partition in records:
            if value is not None and not isinstance(value, bytes | str):
                value = json.dumps(value)
            kwargs = {} if partition is None else {"partition": partition}
            while True:
                try:
                    producer.produce(topic, value=value, key=key, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.1)
        left = producer.flush(60)
        assert left == 0, f"{left} records not delivered"

    def read(self, topic: str, isolation: str = "read_committed",
             timeout: float = 60.0,
             settle: float = 10.0) -> list[tuple[str | None, str | None, int, int]]:
        """Every record of `topic` a consumer with `isolation` sees now, as (key, value,
        partition, offset), partition by partition.

        A transaction's commit returns before the broker has written its markers into the
        partitions, so a `read_committed` reader can stop short of the high watermark just
        after a commit: it keeps reading for up to `settle` seconds until the partition's
        stable end reaches the high watermark (a transaction left open stays unseen)."""
        from confluent_kafka import Consumer, TopicPartition

        conf = {"bootstrap.servers": self.bootstrap, "group.id": f"reader-{uuid.uuid4().hex}",
                "enable.auto.commit": False, "enable.partition.eof": True,
                "isolation.level": isolation}
        consumer = Consumer(conf)
        # The end offsets of a read_committed consumer are the stable ends; the high
        # watermarks come from a read_uncommitted one.
        ends = Consumer({**conf, "isolation.level": "read_uncommitted"})
        try:
            meta = consumer.list_topics(topic, timeout=30).topics[topic]
            out: list[tuple[str | None, str | None, int, int]] = []
            for part in sorted(meta.partitions):
                low, high = ends.get_watermark_offsets(TopicPartition(topic, part),
                                                       timeout=30, cached=False)
                if high <= low:
                    continue
                consumer.assign([TopicPartition(topic, part, low)])
                deadline = time.monotonic() + timeout
                settled = time.monotonic() + settle
                short = False  # at the end of what is stable, below the high watermark
                while True:
                    m = consumer.poll(0.2 if short else 1.0)
                    if m is None:
                        if short and time.monotonic() > settled:
                            break  # a transaction left open: what it wrote stays unseen
                        if time.monotonic() > deadline:
                            msg = f"reading {topic}:{part} timed out"
                            raise TimeoutError(msg)
                        continue
                    if m.error():  # partition EOF (of what this isolation level can see)
                        short = isolation == "read_committed" and m.offset() < high
                        if short and time.monotonic() < settled:
                            continue  # commit markers not yet written: read on
                        break
                    out.append((None if m.key() is None else m.key().decode(),
                                None if m.value() is None else m.value().decode(),
                                part, m.offset()))
                    if m.offset() >= high - 1:
                        break
            return out
        finally:
            consumer.close()
            ends.close()


@contextlib.contextmanager
def running_broker(directory: str | Path | None = None, port: int | None = None):  # type: ignore[no-untyped-def]
    """A started broker, stopped (and its temporary directory removed) on exit."""
    tmp = None
    if directory is None:
        tmp = tempfile.mkdtemp(prefix="streamer-kafka-")
        directory = tmp
    broker = KafkaBroker(directory, port)
    try:
        yield broker.start()
    finally:
        broker.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    """The command line: fetch, run or consume."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="resolve the broker's jars (mvn) and Spark's Kafka "
                           "connector (Spark's Ivy) into the cache")
    fetch.add_argument("what", nargs="?", choices=("all", "broker", "spark"), default="all")
    run = sub.add_parser("run", help="run a broker until Ctrl-C")
    run.add_argument("--port", type=int, default=9092)
    run.add_argument("--dir", default=None, help="data directory (default: a temporary one)")
    run.add_argument("--topic", action="append", default=[],
                     help="NAME[:PARTITIONS] to create at start (repeatable)")
    read = sub.add_parser("consume", help="print a topic's records as a read_committed "
                          "consumer sees them (key, then value), and their count")
    read.add_argument("topic")
    read.add_argument("--bootstrap", default="127.0.0.1:9092")
    args = parser.parse_args()
    if args.command == "consume":
        host, _, port = args.bootstrap.rpartition(":")
        broker = KafkaBroker(tempfile.gettempdir(), int(port))  # not started: a client only
        broker.host = host
        records = broker.read(args.topic)
        for key, value, _part, _off in records:
            print(f"{key}\t{value}")
        print(f"{len(records)} records in {args.topic} (read_committed)", file=sys.stderr)
        return
    if args.command == "fetch":
        if args.what in ("all", "broker"):
            print(f"kafka {KAFKA_VERSION}: {kafka_jars()}")
        if args.what in ("all", "spark"):
            jars = resolve_now(spark_kafka_packages())
            print(f"Spark's Kafka connector: {', '.join(Path(j).name for j in jars)}")
        return
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # `kill` stops the broker as Ctrl-C does
    with running_broker(args.dir, args.port) as broker:
        for item in args.topic:
            name, _, parts = item.partition(":")
            broker.create_topic(name, int(parts or 1))
        print(f"Kafka {KAFKA_VERSION} is ready at {broker.bootstrap} (Ctrl-C stops it)",
              flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while broker.proc is not None and broker.proc.poll() is None:
                time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
