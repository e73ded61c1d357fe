"""The stage contract (docs/architecture.md, "How an epoch runs").

A physical plan is a list of stages in dataflow order: source reads, fused stateless chains,
keyed stages and sinks. Every stage is planned once (by `runtime.plan.physical.plan_stages`, which
gives it its strategy and the reason for it) and then runs once per epoch:

    stage.run(epoch: EpochInput, upstream: Upstream) -> StageOutput

- `EpochInput` is what every stage reads of the epoch, fixed before the first stage runs:
  its number, slices, clock, watermarks, flush, checkpoint and savepoint, the decision.
- `Upstream` is what the stages before it produced that this stage reads: the frames of its
  inputs, the rows routed to it (a sink), the files Arrow tasks wrote for it (a keyed stage),
  what Arrow tasks filtered of its operators (a chain), the rows or the job that write its
  staging (a sink). The epoch loop builds it from the earlier stages' outputs
  (`runtime.plan.stages.handoff.EpochResults.upstream_for`).
- `StageOutput` is what the stage produced, each field named for what it is: the frames it
  outputs, rows it routes to a sink, what it hands to one named later stage, and what the
  epoch loop reads (observations for the watermark and the metrics, subtask metadata for
  the barrier and the checkpoint, sinks' pre-commit handles).

No stage reads what another left by convention: each hand-off is a field of a
`StageOutput` addressed to a node id, and the loop passes it to that node's stage.

What varies per epoch is decided once, before any stage runs, by `runtime.plan.physical.decide` (an
`EpochDecision`): whether the epoch is small (Spark's small-epoch settings), and which
sources' slices the keyed stages read themselves. A stage whose input Spark evaluated on the
driver (a local relation) keeps the epoch local where its strategy allows it.

A continuous strategy fits the same contract: its `run` would hand the epoch's barrier to
long-running subtasks instead of starting them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from streamer.connectors.base import SourceSlice
    from streamer.operators.direct import DirectRead


#: What the rows a sink receives count as in the epoch's metrics: output, dead letters (bad
#: records, from a source's `on_error`) or late records (a window's `late:` output).
OUT, DEAD, LATE = "out", "dead_letters", "late"


class Seen(Protocol):
    """What an `Observation` gives once the epoch's jobs ran (`get`: name -> value), or a
    count the driver already has in the same shape (`runtime.plan.local.LocalSeen`)."""

    @property
    def get(self) -> Mapping[str, Any]:
        """The observed values (`n`, `ts<i>`, `n_<kind>`, `filtered`, `late`, ...)."""
        ...


@dataclass(frozen=True)
class SubtaskSlice:
    """A source's slice that its keyed stage's subtasks read themselves this epoch."""

    #: The source had a slice this epoch (else the read is empty: timers only).
    had_slice: bool
    #: What the subtasks read (`operators.direct.DirectRead`).
    read: DirectRead
    #: The slice's records that cannot be read that way, as dead letters, or None.
    dead_letters: DataFrame | None = None


@dataclass(frozen=True)
class EpochDecision:
    """What the one per-epoch decision point (`runtime.plan.physical.decide`) chose for an epoch."""

    #: The epoch runs with the small-epoch Spark settings (`job.execution.small_epoch_rows`).
    small: bool = False
    #: Source id -> its slice, for the slices their keyed stage reads itself.
    direct: Mapping[str, SubtaskSlice] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able summary (for `--json` metrics and tests)."""
        return {"small": self.small, "direct": sorted(self.direct)}


@dataclass(frozen=True)
class EpochInput:
    """What every stage reads of one epoch: fixed before the first stage runs."""

    epoch: int
    slices: Mapping[str, SourceSlice]
    #: The epoch's processing time (ms).
    now: int
    #: The job's watermark at the epoch's start (decides lateness).
    watermark: int
    #: The end of input or a drain: after the epoch's records, every timer up to this
    #: fires (else None: event-time timers up to `watermark`).
    flush: int | None
    checkpoint_id: int | None
    savepoint_url: str | None
    decision: EpochDecision
    #: Runs a Spark action or a driver-side read; turns its failure into a JobFailedError
    #: naming the epoch and `what`.
    guard: Callable[[str, Callable[[], Any]], Any]
    #: Keyed node id -> the watermark it runs this epoch with, when it reads another keyed
    #: operator's output (`runtime.watermarks.WatermarkTracker.for_operators`).
    operator_watermarks: Mapping[str, int] = field(default_factory=dict)

    def watermark_of(self, node_id: str) -> int:
        """The watermark keyed operator `node_id` runs this epoch with: what decides which
        of its input is late and which of its event-time timers fire."""
        return self.operator_watermarks.get(node_id, self.watermark)


@dataclass(frozen=True)
class Routed:
    """Rows a stage sends to a sink besides its inputs: dead letters, late records, side
    outputs, each counted as `counts_as` (`OUT`, `DEAD`, `LATE`)."""

    sink_id: str
    rows: DataFrame
    counts_as: str = OUT


@dataclass(frozen=True)
class SinkJob:
    """The Spark job of a keyed stage whose subtasks write a sink's staging files
    (`runtime.plan.keyed_plan.KeyedResult.run_job`), and their metadata."""

    run: Callable[[], Any]
    metas: Any


@dataclass(frozen=True)
class Upstream:
    """What the stages before one stage produced that it reads (built by the epoch loop)."""

    #: Each of the stage's inputs (`Stage.reads`) -> its rows this epoch (None: no rows).
    frames: Mapping[str, DataFrame | None] = field(default_factory=dict)
    #: The node ids that ran as a local epoch so far (their rows are local relations).
    ran_local: tuple[str, ...] = ()
    #: A sink: the rows the stages before it routed to it, in the order they were routed.
    routed: tuple[Routed, ...] = ()
    #: A keyed stage: the parquet files of its input Arrow tasks wrote this epoch
    #: (`runtime.arrow.arrow_input`; None: the tasks did not run).
    prestaged: tuple[str, ...] | None = None
    #: A chain: per filter of it, (records in, records out) in the Arrow tasks' part.
    prefiltered: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    #: A sink: the rows its source's Arrow tasks wrote into its staging (None: they did
    #: not run this epoch).
    arrow_written: int | None = None
    #: A sink: the keyed stage's job whose subtasks write its files, or None.
    sink_job: SinkJob | None = None

    def inputs(self, node_ids: tuple[str, ...]) -> list[DataFrame]:
        """The frames of `node_ids` that have rows this epoch."""
        return [f for i in node_ids if (f := self.frames.get(i)) is not None]


@dataclass(frozen=True)
class StageOutput:
    """What one stage produced in an epoch. The epoch loop combines them
    (`runtime.plan.stages.handoff.EpochResults`): frames and hand-offs go to the later stages
    that read them, the rest to the barrier, the checkpoint and the metrics."""

    #: Per node id the stage runs, its output (None: no rows this epoch).
    frames: Mapping[str, DataFrame | None] = field(default_factory=dict)
    #: Rows for sinks besides their inputs (dead letters, late records, side outputs).
    routed: tuple[Routed, ...] = ()
    #: Node ids of the stage that ran as a local epoch (no Spark job).
    ran_local: tuple[str, ...] = ()
    #: Keyed node ids whose subtasks read their source's slice themselves.
    ran_direct: tuple[str, ...] = ()
    #: Keyed node ids whose subtasks read the input Spark staged for them as files.
    ran_staged: tuple[str, ...] = ()
    #: Source id -> what observes its read (`n`, `ts<i>`): the records in and the newest
    #: event time per split, for the watermark.
    records_in: Mapping[str, Seen] = field(default_factory=dict)
    #: Sink id -> what observes its input (`n`, and per kind of row `n_<kind>`).
    sink_rows: Mapping[str, Seen] = field(default_factory=dict)
    #: Filter id -> what observes it (`filtered`, the records it removed, `in`, `out`).
    filtered: Mapping[str, Seen] = field(default_factory=dict)
    #: Window (or join) without a `late:` output -> what counts the late records it
    #: dropped (`late`).
    late_dropped: Mapping[str, Seen] = field(default_factory=dict)
    #: Keyed operator id -> the sink its late records were routed to this epoch.
    late_to: Mapping[str, str] = field(default_factory=dict)
    #: Keyed node id -> per-subtask metadata (complete once the epoch's jobs ran).
    subtask_metas: Mapping[str, Any] = field(default_factory=dict)
    #: Sink id -> the job of the keyed stage whose subtasks write its staging files.
    sink_jobs: Mapping[str, SinkJob] = field(default_factory=dict)
    #: Keyed node id -> the parquet files of its input Arrow tasks wrote this epoch.
    prestaged: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Filter id -> (records in, records out) in the Arrow tasks' part of the epoch.
    prefiltered: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    #: Sink id -> the rows Arrow tasks wrote into its staging this epoch.
    arrow_written: Mapping[str, int] = field(default_factory=dict)
    #: Source id -> its files (or ranges) the Arrow tasks decoded.
    arrow_decoded: Mapping[str, int] = field(default_factory=dict)
    #: File (or range) -> why the Arrow tasks left it to Spark.
    arrow_refused: Mapping[str, str] = field(default_factory=dict)
    #: `<sink id> subtask <n>` (or `task <unit>`) -> why the JSON encoder left that task's
    #: rows to Spark's writer.
    sink_refused: Mapping[str, str] = field(default_factory=dict)
    #: Sink id -> its pre-commit handle for this epoch.
    handles: Mapping[str, Any] = field(default_factory=dict)


class Stage(ABC):
    """One stage of the physical plan: planned once, run once per epoch."""

    #: source | stateless | keyed | sink
    kind: ClassVar[str]
    #: A short name of how the stage runs (shown by `streamer plan --physical`).
    strategy: ClassVar[str]

    def __init__(self, node_id: str, reason: str) -> None:
        self.node_id = node_id
        self.reason = reason
        #: Strategies that do not apply, each with why (set by the planner).
        self.not_used: list[dict[str, str]] = []

    @property
    def node_ids(self) -> tuple[str, ...]:
        """The dataflow nodes the stage runs (a stateless chain runs several)."""
        return (self.node_id,)

    @property
    def reads(self) -> tuple[str, ...]:
        """The nodes whose frames the stage reads (`Upstream.frames`)."""
        return ()

    @abstractmethod
    def run(self, epoch: EpochInput, upstream: Upstream) -> StageOutput:
        """Run the stage for one epoch over what the stages before it produced."""

    def describe(self) -> dict[str, Any]:
        """The stage as `streamer plan --physical` shows it."""
        out: dict[str, Any] = {"stage": self.node_id, "kind": self.kind,
                               "strategy": self.strategy, "reason": self.reason}
        if self.not_used:
            out["not_used"] = list(self.not_used)
        return out
