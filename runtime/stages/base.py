"""The stage contract (docs/architecture.md, "How an epoch runs").

A physical plan is a list of stages in dataflow order: source reads, fused stateless chains,
keyed stages and sinks. Every stage is planned once (by `runtime.plan.plan_stages`, which
gives it its strategy and the reason for it) and then runs once per epoch against an
`EpochContext`: it takes its inputs' frames from the context and leaves its own output (and
anything for the sinks: dead letters, late records, side outputs) there.

What varies per epoch is decided once, before any stage runs, by `runtime.plan.decide` (an
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
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from streamer.connectors.base import SourceSlice


#: What the rows a sink receives count as in the epoch's metrics: output, dead letters (bad
#: records, from a source's `on_error`) or late records (a window's `late:` output).
OUT, DEAD, LATE = "out", "dead_letters", "late"


@dataclass(frozen=True)
class EpochDecision:
    """What the one per-epoch decision point (`runtime.plan.decide`) chose for an epoch."""

    #: The epoch runs with the small-epoch Spark settings (`job.execution.small_epoch_rows`).
    small: bool = False
    #: Source id -> (the id when it had a slice this epoch, else None; the keyed stage's
    #: `DirectRead`; dead letters or None) for slices their keyed stage reads itself.
    direct: Mapping[str, tuple[str | None, Any, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able summary (for `--json` metrics and tests)."""
        return {"small": self.small, "direct": sorted(self.direct)}


@dataclass
class EpochContext:
    """One epoch as the stages see it: its inputs, its decision, and what they leave for
    the stages after them and for the coordinator (metrics, checkpoint handles)."""

    epoch: int
    slices: Mapping[str, SourceSlice]
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
    #: Per node id, its output this epoch (None: no rows this epoch).
    frames: dict[str, DataFrame | None] = field(default_factory=dict)
    #: Sink id -> further inputs (dead letters, late records, side outputs), each with what
    #: its rows count as (`OUT`, `DEAD`, `LATE`).
    extra: dict[str, list[tuple[DataFrame, str]]] = field(default_factory=dict)
    #: Source id -> what an `Observation` of its read gives (`.get`: `n`, `ts<i>`).
    seen_in: dict[str, Any] = field(default_factory=dict)
    #: Sink id -> the same for its input (`n`, and per kind of row `n_<kind>`).
    seen_out: dict[str, Any] = field(default_factory=dict)
    #: Per filter operator id, what its observation gives (`.get`): `filtered`, the records
    #: it removed, and its records `in` and `out`.
    seen_filtered: dict[str, Any] = field(default_factory=dict)
    #: Per window without a `late:` output (its id), what counts the late records it
    #: dropped (`.get`: `late`).
    seen_late: dict[str, Any] = field(default_factory=dict)
    #: Keyed operator id -> the sink its late records were routed to this epoch.
    late_to: dict[str, str] = field(default_factory=dict)
    #: Keyed node id -> per-subtask metadata (complete once the epoch's jobs ran).
    keyed_metas: dict[str, Any] = field(default_factory=dict)
    #: What ran as a local epoch (Spark evaluated it on the driver, no job).
    ran_local: list[str] = field(default_factory=list)
    #: Keyed node ids whose subtasks read their source's slice themselves.
    ran_direct: list[str] = field(default_factory=list)
    #: Keyed node ids whose subtasks read the input Spark staged for them as files.
    ran_staged: list[str] = field(default_factory=list)
    #: Keyed node id -> the parquet files of its input that Arrow tasks computed this epoch
    #: (`runtime.arrow_input`), read with whatever Spark staged for it.
    prestaged: dict[str, list[str]] = field(default_factory=dict)
    #: Filter id -> (records in, records out) in the Arrow tasks' part of the epoch.
    prefiltered: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Source id -> its files the Arrow tasks decoded; file -> why they left one to Spark.
    arrow_decoded: dict[str, int] = field(default_factory=dict)
    arrow_refused: dict[str, str] = field(default_factory=dict)
    #: Sink id -> the rows Arrow tasks wrote into its staging this epoch
    #: (`runtime.stages.sources.ToSink`); Spark writes the rest beside them.
    arrow_written: dict[str, int] = field(default_factory=dict)
    #: `<sink id> subtask <n>` -> why the JSON encoder left that task's rows to Spark's writer.
    sink_refused: dict[str, str] = field(default_factory=dict)
    #: Sink id -> (the job whose keyed tasks write its files, their metadata).
    task_jobs: dict[str, tuple[Callable[[], Any], Any]] = field(default_factory=dict)
    #: Sink id -> its pre-commit handle for this epoch.
    handles: dict[str, Any] = field(default_factory=dict)
    #: Frames persisted for several consumers, unpersisted when the epoch ends.
    cached: list[DataFrame] = field(default_factory=list)

    def watermark_of(self, node_id: str) -> int:
        """The watermark keyed operator `node_id` runs this epoch with: what decides which
        of its input is late and which of its event-time timers fire."""
        return self.operator_watermarks.get(node_id, self.watermark)

    def inputs(self, node_ids: tuple[str, ...]) -> list[DataFrame]:
        """The frames of `node_ids` that have rows this epoch."""
        return [f for i in node_ids if (f := self.frames.get(i)) is not None]

    def route(self, sink_id: str, df: DataFrame, kind: str = OUT) -> None:
        """Send `df` to sink `sink_id` as a further input (dead letters, late, sides), its
        rows counted as `kind`."""
        self.extra.setdefault(sink_id, []).append((df, kind))

    def count_of(self, kind: str) -> int:
        """The rows of `kind` the sinks received this epoch (after their jobs ran)."""
        return sum(int(seen.get.get(f"n_{kind}") or 0) for seen in self.seen_out.values())


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

    @abstractmethod
    def run(self, ctx: EpochContext) -> None:
        """Run the stage for one epoch: read inputs from `ctx`, leave the output there."""

    def describe(self) -> dict[str, Any]:
        """The stage as `streamer plan --physical` shows it."""
        out: dict[str, Any] = {"stage": self.node_id, "kind": self.kind,
                               "strategy": self.strategy, "reason": self.reason}
        if self.not_used:
            out["not_used"] = list(self.not_used)
        return out
