"""The `job:` block as the runtime reads it: frozen dataclasses with every default filled in
from `pipeline/job_model.py` (durations in milliseconds), and the `job.execution` settings'
environment overrides."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from streamer.exceptions import ConfigError
from streamer.pipeline.job_model import JobModel, PrometheusModel

#: The `job:` block as a file that leaves every key out: the defaults, written once in
#: `pipeline/job_model.py` (durations here in milliseconds).
_JOB = JobModel()


@dataclass(frozen=True)
class CheckpointSpec:
    """`job.checkpoint`."""

    interval_ms: int = _JOB.checkpoint.interval
    mode: str = _JOB.checkpoint.mode
    retain: int = _JOB.checkpoint.retain
    timeout_ms: int = _JOB.checkpoint.timeout


_SWITCH = {"1": True, "true": True, "yes": True, "on": True,
           "0": False, "false": False, "no": False, "off": False}


@dataclass(frozen=True)
class ExecutionSpec:
    """`job.execution`: engine settings, which change how epochs run but not their results.

    The pipeline file sets them; an environment variable (`VARIABLES`) may override one for
    an experiment, through `with_overrides(os.environ)`. `sources` says where each value
    came from: "default", "file" or "environment".
    """

    #: Epochs with at most this many input rows run in the small-epoch mode (0 = off).
    small_epoch_rows: int = _JOB.execution.small_epoch_rows
    #: Source slices of at most this many rows are read on the driver (0 = never).
    local_rows: int = _JOB.execution.local_rows
    #: Keyed subtasks read local parquet files, and local epochs' rows, themselves.
    direct_read: bool = _JOB.execution.direct_read
    #: In local mode, local epochs run keyed subtasks in the driver process.
    driver_subtasks: bool = _JOB.execution.driver_subtasks
    #: Keyed tasks write a local parquet files sink's staging files themselves.
    task_sink: bool = _JOB.execution.task_sink
    #: In local mode, Spark writes a keyed stage's computed input once as local parquet
    #: files that its subtasks read themselves (in place of aggregating and shuffling it).
    staged_input: bool = _JOB.execution.staged_input
    #: Staged input from local JSON-lines, CSV or parquet files or Kafka JSON values is decoded,
    #: filtered and derived by Arrow in Python tasks where that is certainly Spark's result
    #: (`runtime.arrow.arrow_input`).
    arrow_input: bool = _JOB.execution.arrow_input
    #: "epochs", or "continuous": one barrier stage of long-running subtasks (issue 36).
    mode: str = _JOB.execution.mode
    #: The continuous mode's buffer timeout (ms) and batch size (rows).
    continuous_flush_interval: int = _JOB.execution.continuous_flush_interval
    continuous_batch_rows: int = _JOB.execution.continuous_batch_rows
    #: Setting -> "default", "file" or "environment" (filled in for every setting).
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    #: Setting -> the environment variable that overrides it.
    VARIABLES: ClassVar[Mapping[str, str]] = {
        "small_epoch_rows": "STREAMER_SMALL_EPOCH_ROWS",
        "local_rows": "STREAMER_LOCAL_ROWS",
        "direct_read": "STREAMER_DIRECT_READ",
        "driver_subtasks": "STREAMER_DRIVER_SUBTASKS",
        "task_sink": "STREAMER_TASK_SINK",
        "staged_input": "STREAMER_STAGED_INPUT",
        "arrow_input": "STREAMER_ARROW_INPUT",
        "mode": "STREAMER_EXECUTION_MODE",
        "continuous_flush_interval": "STREAMER_CONTINUOUS_FLUSH_MS",
        "continuous_batch_rows": "STREAMER_CONTINUOUS_BATCH_ROWS",
    }
    #: The values of the settings that take a word.
    _WORDS: ClassVar[Mapping[str, tuple[str, ...]]] = {"mode": ("epochs", "continuous")}
    #: What 0 means for the row-count settings, for messages.
    _ZERO: ClassVar[Mapping[str, str]] = {
        "small_epoch_rows": "0 turns the small-epoch mode off",
        "local_rows": "0 never reads a slice on the driver",
        "continuous_flush_interval": "milliseconds; 0 sends at once",
    }

    def __post_init__(self) -> None:
        unknown = set(self.sources) - set(self.VARIABLES)
        bad = set(self.sources.values()) - {"default", "file", "environment"}
        if unknown or bad:
            msg = f"ExecutionSpec.sources has unknown settings or origins: {unknown | bad}"
            raise ValueError(msg)
        object.__setattr__(self, "sources", {
            key: self.sources.get(key, "default") for key in self.VARIABLES})

    def with_overrides(self, env: Mapping[str, str]) -> ExecutionSpec:
        """These settings with the environment's overrides applied (an unset or empty
        variable overrides nothing); raises `ConfigError` naming every variable whose value
        is not valid, rather than falling back to a default."""
        changes: dict[str, Any] = {}
        errors: list[str] = []
        for key, variable in self.VARIABLES.items():
            raw = env.get(variable, "").strip()
            if not raw:
                continue
            current = getattr(self, key)
            if key in self._WORDS:
                value: bool | int | str | None = raw if raw in self._WORDS[key] else None
                accepted, shown = "one of " + ", ".join(self._WORDS[key]), current
            elif isinstance(current, bool):
                value = _SWITCH.get(raw.lower())
                accepted = "one of 1/0, true/false, yes/no, on/off"
                shown = str(current).lower()
            else:
                value = int(raw) if re.fullmatch(r"[0-9]+", raw) else None
                unit = "" if key == "continuous_flush_interval" else " of rows"
                if key == "continuous_batch_rows":
                    value = value if value else None
                    accepted = "a whole number of rows >= 1"
                else:
                    accepted = f"a whole number{unit} >= 0 ({self._ZERO[key]})"
                shown = str(current)
            if value is None:
                errors.append(f"{variable}={raw!r} is not valid: it overrides "
                              f"job.execution.{key} and must be {accepted}; fix it, or unset "
                              f"it to use the pipeline's value ({shown})")
            else:
                changes[key] = value
        if errors:
            raise ConfigError("\n".join(errors))
        if not changes:
            return self
        return dataclasses.replace(self, **changes, sources={
            **self.sources, **dict.fromkeys(changes, "environment")})

    def set_by(self, key: str) -> str | None:
        """The environment variable that set `key` (for "(set by $VARIABLE)" in a plan's
        reasons), or None when the value is the file's or the default."""
        return self.VARIABLES[key] if self.sources[key] == "environment" else None

    def describe(self) -> dict[str, tuple[int | bool | str, str]]:
        """Setting -> (value, origin), origin being "default", "file" or the environment
        variable that set it."""
        return {key: (getattr(self, key), self.set_by(key) or self.sources[key])
                for key in self.VARIABLES}


@dataclass(frozen=True)
class MetricsSpec:
    """`job.metrics`: where the job's metrics are exported (docs/metrics.md)."""

    #: Serve Prometheus metrics over HTTP on this port (None: no exporter).
    prometheus_port: int | None = None
    #: The address the exporter binds; loopback unless the file opts in to others.
    prometheus_host: str = PrometheusModel.model_fields["host"].default


@dataclass(frozen=True)
class JobSpec:
    """`job:` settings with their defaults filled in."""

    parallelism: int | None = _JOB.parallelism
    max_parallelism: int = _JOB.max_parallelism
    epoch_ms: int = _JOB.epoch
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    state_backend: str = _JOB.state.backend
    state_local_dir: str | None = _JOB.state.local_dir
    restart_attempts: int = _JOB.restart.attempts
    restart_delay_ms: int = _JOB.restart.delay
    #: After SIGTERM: how long a graceful stop may take before the run is cancelled.
    shutdown_timeout_ms: int = _JOB.shutdown_timeout
    #: How long a cancel may take before the process exits at once (143).
    cancel_timeout_ms: int = _JOB.cancel_timeout
    #: How old a running job's heartbeat may get before the run counts as dead.
    heartbeat_timeout_ms: int = _JOB.heartbeat_timeout
    #: The continuous mode on a cluster: how long too few task slots are waited out.
    slot_timeout_ms: int = _JOB.slot_timeout
    execution: ExecutionSpec = field(default_factory=ExecutionSpec)
    metrics: MetricsSpec = field(default_factory=MetricsSpec)


def build_job(job: JobModel) -> JobSpec:
    """The runtime's `JobSpec` from the validated `job:` block (durations in ms)."""
    execution = job.execution
    prometheus = job.metrics.prometheus
    return JobSpec(
        parallelism=job.parallelism, max_parallelism=job.max_parallelism,
        epoch_ms=job.epoch,
        checkpoint=CheckpointSpec(interval_ms=job.checkpoint.interval,
                                  mode=job.checkpoint.mode, retain=job.checkpoint.retain,
                                  timeout_ms=job.checkpoint.timeout),
        state_backend=job.state.backend, state_local_dir=job.state.local_dir,
        restart_attempts=job.restart.attempts, restart_delay_ms=job.restart.delay,
        shutdown_timeout_ms=job.shutdown_timeout, cancel_timeout_ms=job.cancel_timeout,
        heartbeat_timeout_ms=job.heartbeat_timeout, slot_timeout_ms=job.slot_timeout,
        execution=ExecutionSpec(
            **{key: getattr(execution, key) for key in ExecutionSpec.VARIABLES},
            sources=dict.fromkeys(execution.model_fields_set, "file")),
        metrics=MetricsSpec(
            prometheus_port=prometheus.port if prometheus else None,
            prometheus_host=prometheus.host if prometheus else MetricsSpec.prometheus_host),
    )
