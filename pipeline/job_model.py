"""The `job:` block of the pipeline file as pydantic v2 models (issue 38, item 3).

One description of each key: its type, bounds, default (written once, as a pipeline file
writes it: `epoch: 1s`) and description. From it come validation (`extra="forbid"`, strict
types: YAML's `"2"` is not 2, nor `off` false), the JSON Schema of `streamer schema` and the
docs reference, and the defaults of `job_spec.JobSpec`. Durations are validated into
milliseconds. Messages are not pydantic's: `pipeline/pydantic_bridge.py` turns each error into
the same `file:line:col: ... ; fix` line the rest of the file gets (docs/decisions/pydantic.md).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from streamer.pipeline.yaml_model import (
    RULE,
    Duration,
    DurationOrZero,
    Fix,
    NonEmptyStr,
    YamlModel,
)


class CheckpointModel(YamlModel):
    """Checkpointing."""

    interval: Duration = Field(default="10s", validate_default=True,
                               description="Minimum time between checkpoints.")
    mode: Literal["exactly_once", "at_least_once"] = Field(
        default="exactly_once", description="`exactly_once`: sinks commit when a "
        "checkpoint completes; `at_least_once`: every epoch.")
    retain: Annotated[int, Field(ge=1)] = Field(default=3,
                                                description="Completed checkpoints kept.")
    timeout: Duration = Field(default="10m", validate_default=True,
                              description="A checkpoint taking longer fails.")


class StateModel(YamlModel):
    """Keyed state."""

    backend: Literal["rocksdb", "memory"] = Field(
        default="rocksdb", description="Where keyed state lives.")
    local_dir: NonEmptyStr | SkipJsonSchema[None] = Field(
        default=None, description="Where subtasks keep working state (default: a directory "
        "under the system temp dir).")


class RestartModel(YamlModel):
    """Restart strategy."""

    attempts: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Automatic restarts from the last checkpoint.")
    delay: DurationOrZero = Field(default="5s", validate_default=True,
                                  description="Wait between restarts.")


class ExecutionModel(YamlModel):
    """Engine settings: how epochs run, not what they compute (results are the same either
    way). The environment variables named here override them for one run."""

    small_epoch_rows: Annotated[int, Field(ge=0), Fix(
        "set a number of rows, or 0 to turn the small-epoch mode off")] = Field(
        default=20_000, description="Epochs with at most this many input rows run in the "
        "small-epoch mode: interpreted Spark expressions (no code generation), no adaptive "
        "execution, one shuffle partition, and keyed records routed to their subtask before "
        "they are aggregated; 0 turns the mode off. $STREAMER_SMALL_EPOCH_ROWS overrides it.")
    local_rows: Annotated[int, Field(ge=0), Fix(
        "set a number of rows, or 0 to never read a slice on the driver")] = Field(
        default=1_000, description="A source slice of at most this many rows (over all its "
        "splits) is read on the driver as a local relation, and its epoch runs without Spark "
        "jobs where it can (a local epoch); 0 = never. $STREAMER_LOCAL_ROWS overrides it.")
    direct_read: bool = Field(
        default=True, description="Keyed subtasks (rolling aggregates, tumbling and sliding "
        "windows) read a local parquet files source themselves, and take a local epoch's "
        "rows collected on the driver; false leaves both to Spark. $STREAMER_DIRECT_READ "
        "overrides it.")
    driver_subtasks: bool = Field(
        default=True, description="In local mode (local[*]) a local epoch runs the keyed "
        "subtasks in the driver process, one after the other, instead of as a Spark job; "
        "false always runs a Spark job. No effect on a cluster. $STREAMER_DRIVER_SUBTASKS "
        "overrides it.")
    task_sink: bool = Field(
        default=True, description="A keyed operator's tasks write the staging files of a "
        "local parquet or jsonl files sink that reads only that operator (with pyarrow, in "
        "the bytes Spark's writer gives; jsonl rows they cannot be sure of go to Spark's "
        "writer); false has Spark write them. $STREAMER_TASK_SINK overrides it.")
    staged_input: bool = Field(
        default=True, description="In local mode, a rolling aggregate, a tumbling, sliding "
        "or session window or a dedupe whose input Spark computes (a JSON, CSV or Kafka "
        "source, or a filter or derived column before it) has Spark write that input once "
        "per epoch as local parquet files, which its subtasks read themselves, in place of "
        "Spark's partial aggregation and shuffles. Small epochs keep the Spark path. No "
        "effect on a cluster. $STREAMER_STAGED_INPUT overrides it.")
    arrow_input: bool = Field(
        default=True, description="Where such staged input comes from local JSON-lines, CSV "
        "or parquet files or Kafka JSON values, Python tasks read and decode them with Arrow "
        "and run the event time and the filters and derived columns before the keyed "
        "operator, for the files, ranges and expressions where Arrow's result is certainly "
        "Spark's (any other is read by Spark as before, in the same epoch). "
        "$STREAMER_ARROW_INPUT overrides it.")
    mode: Literal["epochs", "continuous"] = Field(
        default="epochs", description="`epochs` cuts the stream into epochs and runs each as "
        "Spark jobs; `continuous` runs every source and keyed subtask as one long-running "
        "task of one Spark barrier stage, with checkpoint barriers in the data. The "
        "continuous mode takes one local files or Kafka source, filters and derived columns, "
        "one rolling aggregate or tumbling or sliding window of count, sum, min, max or avg, "
        "and one local jsonl or parquet files sink or Kafka sink; validation names what else "
        "rules it out. "
        "$STREAMER_EXECUTION_MODE overrides it.")
    continuous_flush_interval: DurationOrZero = Field(
        default="5ms", validate_default=True, description="The continuous mode's buffer "
        "timeout, as Flink's: the longest a source subtask waits for more records before it "
        "sends what it has on, and an at_least_once Kafka sink's `linger.ms`. Lower is lower "
        "latency at low rates; higher sends fuller batches (docs/latency.md). "
        "$STREAMER_CONTINUOUS_FLUSH_MS overrides it (milliseconds).")
    continuous_batch_rows: Annotated[int, Field(ge=1), Fix(
        "set a number of rows, at least 1")] = Field(
        default=10_000, description="The continuous mode's batch size: the most rows a source "
        "subtask reads and sends as one exchange message, and a keyed subtask applies at "
        "once (it applies fewer whenever its input has nothing more ready). "
        "$STREAMER_CONTINUOUS_BATCH_ROWS overrides it.")


class PrometheusModel(YamlModel):
    """Export the job's metrics for Prometheus while it runs (docs/metrics.md)."""

    port: Annotated[int, Field(ge=1, le=65535)] = Field(
        description="The TCP port of the HTTP endpoint Prometheus scrapes (`/metrics`); "
        "`streamer run --metrics-port` overrides it.")
    host: NonEmptyStr = Field(default="127.0.0.1", description="The address it binds (this "
                              "machine only); 0.0.0.0 opts in to every interface.")


class MetricsModel(YamlModel):
    """Where the job's metrics are exported."""

    prometheus: PrometheusModel | SkipJsonSchema[None] = Field(default=None)


class JobModel(YamlModel):
    """How the job runs."""

    parallelism: Annotated[int, Field(ge=1)] | SkipJsonSchema[None] = Field(
        default=None, description="Keyed subtasks (default: Spark's default parallelism).")
    max_parallelism: Annotated[int, Field(ge=1, le=32768)] = Field(
        default=128, description="Key groups; fixed for the life of the state.")
    epoch: Duration = Field(default="1s", validate_default=True,
                            description="Epoch length for unbounded sources.")
    checkpoint: CheckpointModel = Field(default_factory=CheckpointModel)
    state: StateModel = Field(default_factory=StateModel)
    restart: RestartModel = Field(default_factory=RestartModel)
    shutdown_timeout: Duration = Field(
        default="30s", validate_default=True,
        description="After SIGTERM, how long the job may take to stop at its next epoch "
        "boundary with a final checkpoint before it is cancelled.")
    cancel_timeout: Duration = Field(
        default="15s", validate_default=True,
        description="How long a cancel (a second SIGTERM, or a stop past shutdown_timeout) "
        "may take before the process exits at once with 143, recording what it can: a "
        "cancel stuck in a call that does not return ends anyway.")
    heartbeat_timeout: Duration = Field(
        default="30s", validate_default=True,
        description="How old a running job's heartbeat (written to job.json on its storage, "
        "every 5 s or every third of this, whichever is sooner) may get before the run "
        "counts as dead: `streamer list` shows it dead, and a new run takes the job over "
        "(the old run, if it was only paused or cut off, then stops without committing). A "
        "run on this machine whose process is gone is dead at once. At least 1s.")
    slot_timeout: Duration = Field(
        default="15s", validate_default=True,
        description="The continuous mode on a cluster: how long the executors may offer "
        "fewer task slots than the gang needs before the run is refused with the fix (a "
        "cluster that gave the job no executor yet is waited for, and said so after this "
        "long). On local[N] a gang too large is refused at once.")
    execution: ExecutionModel = Field(default_factory=ExecutionModel)
    metrics: MetricsModel = Field(default_factory=MetricsModel)

    @model_validator(mode="after")
    def _parallelism_fits(self) -> JobModel:
        if self.parallelism is not None and self.parallelism > self.max_parallelism:
            raise PydanticCustomError(
                RULE, "parallelism ({p}) cannot exceed max_parallelism ({mp}); raise "
                "max_parallelism or lower parallelism",
                {"at": "parallelism", "p": self.parallelism, "mp": self.max_parallelism})
        return self

    @model_validator(mode="after")
    def _heartbeat_timeout_fits(self) -> JobModel:
        if self.heartbeat_timeout < 1000:
            raise PydanticCustomError(
                RULE, "heartbeat_timeout ({ms} ms) must be at least 1s: the run would be "
                "taken over between its own heartbeats",
                {"at": "heartbeat_timeout", "ms": self.heartbeat_timeout})
        return self
