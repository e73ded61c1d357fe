"""Shared fixtures: one real local SparkSession for the whole test session."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

#: The development Kafka broker lives in scripts/ (users run it too), not in tests/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


#: Tests that need a server of their own are in the slow tier whatever their own time: the
#: server's start (Kafka's JVM, MinIO, PostgreSQL, a Spark standalone cluster) is most of it.
SERVER_MARKS = ("kafka", "postgres", "s3", "cluster")
#: Each test module's seconds in a whole run (tests/durations.py).
DURATIONS = Path(__file__).with_name("durations.json")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that needs a server `slow` too (`-m "not slow"` is the fast tier), and
    every test of tests/cluster `cluster` (the standalone cluster is a server).

    Under `pytest -n` (pytest-xdist, as pyproject.toml sets), modules start longest first,
    by the seconds of `durations.json` (tests/durations.py): the workers sort alike, and
    `--no-loadscope-reorder` keeps their order, so no long module starts last."""
    for item in items:
        if scope(item.nodeid) == "tests/cluster":  # each needs the cluster, marked or not
            item.add_marker(pytest.mark.cluster)
        if any(item.get_closest_marker(mark) for mark in SERVER_MARKS):
            item.add_marker(pytest.mark.slow)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    cost: dict[str, float] = {}
    for item in items:
        cost.setdefault(scope(item.nodeid), 0.0)
    for module, took in seconds.items():
        if scope(module) in cost:
            cost[scope(module)] += took
    order = {group: rank for rank, group in enumerate(sorted(cost, key=lambda g: -cost[g]))}
    items.sort(key=lambda item: order[scope(item.nodeid)])


def scope(nodeid: str) -> str:
    """What runs whole in one worker under `pytest -n`: a test module, or every module of the
    Spark standalone cluster (tests/cluster: one cluster of 2 executors on the machine at a
    time, started once)."""
    module = nodeid.split("::")[0]
    return "tests/cluster" if module.startswith("tests/cluster/") else module


@pytest.hookimpl(optionalhook=True)  # (a pytest-xdist hook: pytest -p no:xdist has none)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadfile` with the cluster's modules as one file (`scope`): each module's
    fixtures (a reference run, a warm JVM) run once."""
    from xdist.scheduler import LoadFileScheduling

    class ModuleScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    return ModuleScheduling(config, log) if config.getvalue("dist") == "loadfile" else None


@pytest.fixture(autouse=True)
def _job_storage(tmp_path_factory: pytest.TempPathFactory,
                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own default job storage (checkpoints), never `./.streamer`."""
    monkeypatch.setenv("STREAMER_STORAGE", str(tmp_path_factory.mktemp("storage")))


#: The in-process session's collector. The JVM's own choice on 2 cores is G1, whose
#: concurrent threads compete with the tests for the cores; the parallel collector stops the
#: world briefly and does nothing in between. Measured on the session's longest modules
#: (test_window_properties, test_arrow_sql, test_distinct_counts in one process, alternating,
#: 2 rounds): G1 351 and 313 s wall, 447 and 400 busy core-s; parallel 302 and 293 s, 373 and
#: 352 core-s. It changes how fast the tests run, not what they check.
SESSION_GC = "-XX:+UseParallelGC"


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """A real `local[2]` SparkSession, started once (Spark start-up takes seconds), with the
    parallel GC (`SESSION_GC`)."""
    from streamer.runtime.cluster.spark import DEFAULT_CONF, create_session

    key = "spark.driver.extraJavaOptions"
    session = create_session("streamer-tests", master="local[2]", ui=False,
                             conf={"spark.sql.shuffle.partitions": "2",
                                   key: f"{DEFAULT_CONF[key]} {SESSION_GC}"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real single-node Kafka 4 broker (KRaft) on 127.0.0.1, started once per session.

    Its jars come from Maven Central (`scripts/kafka_broker.py fetch`; CI fetches them first).
    A broker that cannot start fails the tests that need it; `STREAMER_TEST_SKIP_KAFKA=1` skips
    them instead (for machines without Maven or network)."""
    import os

    if os.environ.get("STREAMER_TEST_SKIP_KAFKA") == "1":
        pytest.skip("STREAMER_TEST_SKIP_KAFKA=1")
    from kafka_broker import KafkaBroker

    broker = KafkaBroker(tmp_path_factory.mktemp("kafka")).start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[object]:
    """A real PostgreSQL server (Debian's `postgresql` package) on 127.0.0.1, started once per
    session in a temporary directory (tests/postgres_server.py).

    A server that cannot start fails the tests that need it; `STREAMER_TEST_SKIP_POSTGRES=1` skips
    them instead (for machines without the package)."""
    import os

    if os.environ.get("STREAMER_TEST_SKIP_POSTGRES") == "1":
        pytest.skip("STREAMER_TEST_SKIP_POSTGRES=1")
    from postgres_server import PostgresServer

    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real S3 API server (MinIO, `tests/s3_server.py`) on 127.0.0.1 on a free port with a
    temporary data directory, started once per session, with the bucket `streamer` created.

    MinIO is built from its Go module once and cached (CI builds it first). A server that
    cannot start fails the tests that need it; `STREAMER_TEST_SKIP_S3=1` skips them instead (for
    machines without Go or network)."""
    import os

    if os.environ.get("STREAMER_TEST_SKIP_S3") == "1":
        pytest.skip("STREAMER_TEST_SKIP_S3=1")
    from s3_server import S3Server

    server = S3Server(tmp_path_factory.mktemp("minio")).start()
    server.create_bucket("streamer")
    yield server
    server.stop()
