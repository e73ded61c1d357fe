"""Fixtures of the runtime tests that run `streamer run` in processes of their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from warm_jvm import WarmJvm


@pytest.fixture(scope="module")
def warm_jvm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmJvm]:
    """One warm Spark JVM for the `streamer run` processes of a test module
    (`warm_jvm.run_warm`): each run skips the JVM's start (about 6.5 s to a SparkSession on 2
    cores) and its JIT warm-up, and does what it did on a JVM of its own. Closed at the end
    of the module."""
    jvm = WarmJvm(tmp_path_factory.mktemp("warm-jvm"))
    yield jvm
    jvm.close()
