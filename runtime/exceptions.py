"""Errors raised while starting Spark or running a job."""

from __future__ import annotations

from streamer.exceptions import StreamerError


class JavaNotFoundError(StreamerError):
    """Raised when no Java 17+ runtime is found; install one or point JAVA_HOME at it."""

    exit_code = 3


class JobFailedError(StreamerError):
    """Raised when a running job fails; the message names the epoch and the cause."""


class PipelineTestFailedError(StreamerError):
    """Raised by `streamer test` when a sink's rows differ from the test's `expect`."""


class MasterUnreachableError(StreamerError):
    """Raised when the Spark master of `--master spark://...` does not accept connections;
    start the cluster, or check the host and port."""
