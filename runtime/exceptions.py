"""Errors raised while starting Spark or running a job."""

from __future__ import annotations

from streamer.exceptions import StreamerError


class JavaNotFoundError(StreamerError):
    """Raised when no Java 17+ runtime is found; install one or point JAVA_HOME at it."""

    exit_code = 3


class SparkStartError(StreamerError):
    """Raised when Spark's driver cannot start because the jars a connector needs
    (`spark.jars.packages`) cannot be resolved from Maven Central; make the repository
    reachable (once: later runs read Spark's Ivy cache) and run again."""


class JobFailedError(StreamerError):
    """Raised when a running job fails; the message names the epoch and the cause."""


class UnreadableFileError(JobFailedError):
    """Raised when an epoch fails because a source file cannot be read past its footer (a
    damaged data page). With `on_error` on its source (and checkpoints on) the run restarts
    from the last checkpoint with the file as one dead letter; otherwise move the file away
    or replace it, and run again."""

    def __init__(self, message: str, path: str, reason: str) -> None:
        super().__init__(message)
        self.path = path
        self.reason = reason


class PreflightError(StreamerError):
    """Raised before Spark starts when a run cannot succeed: a missing savepoint, an
    unreachable Kafka broker, a files source whose path matches no file. The message names
    each and its fix; fix them and run again."""


class JobFinishedError(StreamerError):
    """Raised by `streamer run` when the job already finished (its bounded sources were read
    to the end) and nothing new has arrived: run with `--fresh` to start over. Exit code 0:
    the job's output is complete, not failed."""

    exit_code = 0


class PipelineTestFailedError(StreamerError):
    """Raised by `streamer test` when a sink's rows differ from the test's `expect`."""


class MasterUnreachableError(StreamerError):
    """Raised when the Spark master of `--master spark://...` does not accept connections;
    start the cluster, or check the host and port."""


class JobTerminatedError(KeyboardInterrupt):
    """Raised in the main thread when a SIGTERM cancels the run: a second SIGTERM, or a
    graceful stop that took longer than `job.shutdown_timeout`. The run ends at once, without
    a final checkpoint (the next run resumes from the last one), and the CLI exits 143.

    It is a `KeyboardInterrupt`, not a `StreamerError`, for the reason a second Ctrl-C is:
    it must pass through every `except Exception` between the signal and the CLI (an epoch's
    error handling would otherwise turn it into a failed epoch and restart the job), and
    PySpark cancels the running Spark jobs on a `KeyboardInterrupt`."""

    exit_code = 143
