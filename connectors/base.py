"""The source and sink contracts of the epoch runtime.

A **source** is a set of splits, each with a JSON-serializable offset. Per epoch the
coordinator asks `plan(offsets, now_ms)` for the next slice (bounded by admission limits),
then `read(slice)` for a Spark DataFrame of that slice. A slice's `end` offsets become the
source's offsets once the epoch commits, so re-reading a slice from the same `start` offsets
gives the same records (sources are replayable; checkpoints store offsets).

A **sink** takes part in a two-phase commit per epoch: `write(epoch, df)` stages the epoch's
rows (one Spark action over `df`; the coordinator counts rows with `DataFrame.observe`) and
returns a JSON-serializable handle; `commit(epoch, handle)` makes them visible and must be
idempotent (it may be called again for the same epoch after a crash); `abort` discards them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamer.pipeline.job_spec import ExecutionSpec

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType
    from rich.console import Console

    from streamer.pipeline.spec import SinkSpec, SourceSpec

Offsets = dict[str, Any]

#: Columns of every dead-letter row, whatever the source: where the record was and why it failed.
DEAD_LETTER_DDL = "source string, split string, offset string, record string, error string"
DEAD_LETTER_COLUMNS = ("source", "split", "offset", "record", "error")

#: Marker put in `raise_error` messages so the runtime can turn a Spark task failure into a
#: `DecodeError` for the user (see `connectors.formats.guard_or_split`).
DECODE_ERROR_MARKER = "streamer-decode-error: "

#: Largest slice a source reads as a local relation (rows over all its splits) unless the
#: runtime says otherwise: `job.execution.local_rows`'s default (above it the inline table
#: costs more to parse than a Spark job: 1,000 rows ~45 ms, 5,000 ~100 ms).
DEFAULT_LOCAL_ROWS: int = ExecutionSpec.local_rows


@dataclass
class ConnectorContext:
    """What a connector may use: the Spark session, the job's identity and the console."""

    spark: SparkSession
    job_name: str
    console: Console | None = None
    #: Directory of the pipeline file; relative paths are resolved against the working dir.
    base_dir: str = "."
    extra: dict[str, Any] = field(default_factory=dict)
    #: The job's storage URL (checkpoints); sinks may stage output under it.
    storage_url: str | None = None
    #: Whether sinks commit only when a checkpoint completes (`mode: exactly_once` with
    #: checkpoints on), so staged output must survive a crash until then.
    exactly_once: bool = False
    #: Rows up to which a source reads a slice as a local relation, evaluated on the driver
    #: without a Spark job (`runtime.plan.local`); 0 = never.
    local_rows: int = DEFAULT_LOCAL_ROWS


@dataclass(frozen=True)
class SourceSlice:
    """What one epoch reads from one source: per split, the offsets [start, end)."""

    source_id: str
    start: Mapping[str, Any]
    end: Mapping[str, Any]
    #: Source-specific plan details that `read` needs (e.g. the list of files).
    payload: Any = None
    #: Records in the slice when known up front (datagen), else None.
    expected_records: int | None = None


@dataclass
class SourceRead:
    """The DataFrames of one slice: decoded records, and undecodable ones as dead letters
    (columns `DEAD_LETTER_COLUMNS`), or None when the source has no `on_error`.
    """

    records: DataFrame
    dead_letters: DataFrame | None = None
    #: A column of `records` naming each record's split, for per-split watermarks; the
    #: runtime drops it. None: every record belongs to the slice's only split.
    split_column: str | None = None
    #: The source read the slice as a local relation (`runtime.plan.local`: Spark evaluates
    #: `records` on the driver, without a job).
    local: bool = False
    #: With `local`, the exact number of `records` when the source knows it without
    #: evaluating them (else the driver counts them).
    local_rows: int | None = None
    #: Columns of `records` giving each record's `split` and `offset` for a dead letter of a
    #: record that fails after decoding (its event time is null); the runtime drops them.
    #: None: the source gives no position (the dead letter's split and offset are null).
    position: tuple[str, str] | None = None
    #: With `position`, a column of `records` with each record's text as read (a line of a
    #: file), the record of such a dead letter; the runtime drops it. None: the record is
    #: the JSON of its decoded columns.
    raw_record: str | None = None
    #: With `position`, what turns such dead letters' positions into ones a user can find
    #: (a file's block into the line: `dead_letters.explain`), or None: they are.
    locate: Callable[[DataFrame], DataFrame] | None = None


class Source(ABC):
    """A replayable, splittable source of records."""

    def __init__(self, spec: SourceSpec, ctx: ConnectorContext) -> None:
        self.spec = spec
        self.ctx = ctx

    @property
    def local_reads(self) -> bool:
        """Whether a slice of at most `ctx.local_rows` rows is read as a local relation on
        the driver (`SourceRead.local`), without a Spark job."""
        return False

    @property
    def task_reads(self) -> str | None:
        """Which reads Python tasks can make of this source's slices themselves (the Arrow
        input path, `runtime.arrow.arrow_input`): "files" (local JSON lines), "csv", "parquet"
        (local files) or "kafka" (JSON values of offset ranges); None: only Spark reads it."""
        return None

    @property
    def parquet_files(self) -> bool:
        """Whether its slices are local parquet files, which keyed subtasks may read
        themselves (a direct read, `runtime.plan.stages.keyed_stage.direct_plan`)."""
        return self.task_reads == "parquet"

    @property
    @abstractmethod
    def bounded(self) -> bool:
        """True when the source ends (datagen with `limit`, files without `watch`)."""

    @abstractmethod
    def schema(self) -> StructType:
        """The schema of decoded records (may read file footers or infer from files)."""

    @abstractmethod
    def initial_offsets(self) -> Offsets:
        """Offsets of a job that has read nothing yet."""

    @abstractmethod
    def plan(self, offsets: Mapping[str, Any], now_ms: int) -> SourceSlice | None:
        """The next slice after `offsets`, within admission limits; None when nothing new."""

    @abstractmethod
    def read(self, piece: SourceSlice) -> SourceRead:
        """The records of a planned slice as a DataFrame (lazy; no Spark action here)."""

    @abstractmethod
    def exhausted(self, offsets: Mapping[str, Any]) -> bool:
        """True when a bounded source has nothing left after `offsets`."""

    def lag(self, offsets: Mapping[str, Any], now_ms: int) -> int | None:
        """Records (or files) available but not yet read, when the source can tell."""
        return None

    def lag_unit(self) -> str:
        """What `lag` counts: 'records' or 'files'."""
        return "records"

    def split_lag(self, offsets: Mapping[str, Any], now_ms: int) -> dict[str, int] | None:
        """`lag` per split (split -> records), when the source can tell."""
        return None

    def mark_unreadable(self, path: str, reason: str) -> bool:
        """Take the file `path`, which a read found damaged past what planning checks,
        as one dead letter (`reason`) from now on, if it is one of this source's files."""
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the source holds on the driver (clients); the run is over."""


class Sink(ABC):
    """A sink with a per-epoch two-phase commit."""

    def __init__(self, spec: SinkSpec, ctx: ConnectorContext) -> None:
        self.spec = spec
        self.ctx = ctx

    def open(self) -> None:  # noqa: B027 - optional hook
        """Prepare (create directories, connect)."""

    @abstractmethod
    def write(self, epoch: int, df: DataFrame) -> Any:
        """Stage the epoch's rows with one Spark action; return a JSON-serializable handle."""

    @abstractmethod
    def commit(self, epoch: int, handle: Any) -> None:
        """Make the staged rows visible; idempotent."""

    @property
    def takes_tables(self) -> bool:
        """Whether `write_table` can stage an epoch's rows collected on the driver: the
        runtime hands it the rows of a local epoch (`runtime.plan.local`), which needs no Spark
        job, instead of calling `write`."""
        return False

    def table_of(self, df: DataFrame) -> DataFrame:
        """The projection of the epoch's rows whose Arrow table `write_table` takes (one
        row per row of `df`)."""
        return df

    def write_table(self, epoch: int, table: pa.Table) -> Any:
        """Stage the Arrow table of `table_of(df)` as `write(epoch, df)` would stage `df`;
        return the same kind of handle."""
        msg = f"sink {self.spec.id!r} does not take Arrow tables"
        raise NotImplementedError(msg)

    def abort(self, epoch: int, handle: Any) -> None:  # noqa: B027 - optional hook
        """Discard staged rows of an epoch that will not commit."""

    def recover(self, committed_epoch: int) -> None:  # noqa: B027 - optional hook
        """After a restart: every epoch up to `committed_epoch` is committed (the pending
        ones were committed again from the checkpoint); discard anything a dead run staged
        for later epochs, which will be written again."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class WritesTaskFiles(ABC):
    """A sink whose staging files a keyed operator's tasks can write themselves (Flink's
    `SupportsCommitter` is the same kind of declared ability): the runtime asks
    `task_files_refused` at plan time, gives the tasks `task_target` each epoch, and hands
    what they wrote to `tasks_wrote`."""

    #: The file format the tasks write ("parquet", "jsonl", ...), for the plan's words.
    format: str

    @property
    @abstractmethod
    def staging_root(self) -> str:
        """The directory under which each epoch's staging directory is
        (`files_sink.epoch_staging(staging_root, epoch)`): a long-running task writes
        there for each checkpoint (the continuous mode)."""

    @abstractmethod
    def task_files_refused(self, schema: StructType) -> str | None:
        """Why tasks cannot write rows of `schema` for this sink (None: they can)."""

    @abstractmethod
    def task_target(self, epoch: int, schema: StructType) -> Any:
        """Where the tasks of `epoch` write (picklable), or None to let Spark write."""

    @abstractmethod
    def tasks_wrote(self, epoch: int, run: Any, beside: DataFrame | None = None) -> Any:
        """Run `run` (the job whose tasks write) and stage what they wrote, with the rows of
        `beside` (written by Spark); the handle `commit` takes."""
