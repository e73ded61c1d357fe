"""A real Spark standalone cluster on 127.0.0.1 for the whole test session: a master and two
workers (1 core, 1 GB each, so each worker is one executor) from pyspark's own distribution,
stopped at the end even when tests fail."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamer.runtime.cluster.standalone import StandaloneCluster

# The `streamer run` process helpers of the crash tests.
sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))


@pytest.fixture(scope="session")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """The running cluster; a test that kills a worker starts it again (`restart_worker`)."""
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1,
                                memory="1g")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
