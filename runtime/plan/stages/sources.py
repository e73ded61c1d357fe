"""Source stages: how an epoch's slice of a source becomes the records its consumers read.

- `ScanSource`: the source reads its slice into a Spark plan (a scan; a small slice of a
  source that can, such as datagen or Kafka through confluent-kafka, becomes a local relation
  that Spark evaluates on the driver without a job). An observation counts the records and
  takes the newest event time per split for the watermark.
- `SubtaskReadSource`: the only consumer is a keyed stage whose subtasks read the slice's
  parquet files themselves (`runtime.plan.stages.keyed_stage.SubtaskReadRun`); no Spark plan at all.
  A slice whose files do not allow it is scanned as above.
- `ArrowDecodeSource`: Python tasks read the slice with Arrow, run the stateless operators
  after it and write the result for the one stage that reads it (`runtime.arrow.arrow_input`):
  a keyed stage's input files (`ToKeyedStage`) or a sink's staging files (`ToSink`). Spark
  scans only the files or ranges the tasks refuse.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from streamer import failpoints
from streamer.columns import EVENT_TIME
from streamer.runtime.plan.local import LocalSeen, local_table
from streamer.runtime.plan.stages.base import (
    DEAD,
    EpochInput,
    Routed,
    Seen,
    Stage,
    StageOutput,
    Upstream,
)
from streamer.runtime.plan.stages.event_time import with_event_time

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from streamer.connectors.base import Source, SourceRead, SourceSlice
    from streamer.pipeline.spec import SourceSpec
    from streamer.runtime.arrow.arrow_input import ArrowInput


class ScanSource(Stage):
    """The source's read of the epoch's slice, as a Spark plan (or a local relation)."""

    kind = "source"
    strategy = "spark-scan"

    def __init__(self, node_id: str, reason: str, source: Source, spec: SourceSpec) -> None:
        super().__init__(node_id, reason)
        self.source = source
        self.spec = spec

    def run(self, epoch: EpochInput, upstream: Upstream) -> StageOutput:
        """Read the epoch's slice, if any."""
        return self.scan(epoch, epoch.slices.get(self.node_id))

    def scan(self, epoch: EpochInput, piece: SourceSlice | None) -> StageOutput:
        """Read `piece` (the slice, or a part of it), observe what the watermark needs,
        route dead letters."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        if piece is None:
            return StageOutput(frames={self.node_id: None})
        what = f"reading source {self.node_id!r}"
        read = epoch.guard(what, partial(self.source.read, piece))
        routed: list[Routed] = []
        records = read.records
        stats = [F.count(F.lit(1)).alias("n")]
        event_time = self.spec.event_time
        if event_time:  # a record without event time is a bad record (`stages.event_time`)
            records, null_times = with_event_time(records, read, self.spec)
            if null_times is not None and self.spec.on_error:
                routed.append(Routed(self.spec.on_error, null_times, DEAD))
            ms = F.expr(f"unix_millis({EVENT_TIME})")
            if read.split_column:
                split_col = F.col(read.split_column)
                for i, split in enumerate(piece.end):
                    stats.append(F.max(F.when(split_col == F.lit(str(split)), ms))
                                 .alias(f"ts{i}"))
            else:
                stats += [F.max(ms).alias(f"ts{i}") for i, _ in enumerate(piece.end)]
        # (Spark evaluates a local relation's expressions while it optimizes the plan, so a
        # record that fails them fails here.)
        local: Seen | None = (None if not read.local else epoch.guard(what, partial(
            local_stats, records, read, list(piece.end), bool(event_time))))
        seen: Seen
        if local is not None:  # no observation: it would need a Spark job
            seen = local
        else:
            obs = Observation(f"in_{self.node_id}_{epoch.epoch}")
            seen = obs
            records = records.observe(obs, *stats)
        dropped = {read.split_column, *(read.position or ()), read.raw_record} - {None, EVENT_TIME}
        if dropped:
            records = records.drop(*dropped)
        if read.dead_letters is not None and self.spec.on_error:
            routed.append(Routed(self.spec.on_error, read.dead_letters, DEAD))
        return StageOutput(frames={self.node_id: records}, routed=tuple(routed),
                           ran_local=(self.node_id,) if local is not None else (),
                           records_in={self.node_id: seen})


class SubtaskReadSource(ScanSource):
    """A slice read by its keyed stage's subtasks: only its dead letters go through Spark."""

    strategy = "read-by-subtasks"

    def run(self, epoch: EpochInput, upstream: Upstream) -> StageOutput:
        """Leave the slice to the keyed stage when the epoch's decision gave it to it."""
        found = epoch.decision.direct.get(self.node_id)
        if found is None or self.node_id not in epoch.slices:
            # no slice, or its files need Spark's reader this epoch
            return super().run(epoch, upstream)
        dead_letters = found.dead_letters
        routed = ((Routed(self.spec.on_error, dead_letters, DEAD),)
                  if dead_letters is not None and self.spec.on_error else ())
        return StageOutput(frames={self.node_id: None}, routed=routed)


class ArrowDecodeSource(ScanSource):
    """A JSON, CSV or parquet slice (or Kafka JSON values) decoded, and the operators after
    it run, by Arrow in Python tasks (`runtime.arrow.arrow_input`) for the one stage that reads
    the result: a keyed stage (the tasks write its input files) or a sink (the tasks write
    its staging files). The files or ranges refused there are read by Spark as `ScanSource`
    reads a slice, and go through the operators and to that stage as any Spark rows do."""

    strategy = "arrow-tasks"

    def __init__(self, node_id: str, reason: str, source: Source, spec: SourceSpec,
                 plan: ArrowInput, target: ArrowTarget) -> None:
        super().__init__(node_id, reason, source, spec)
        self.plan = plan
        self.target = target

    def run(self, epoch: EpochInput, upstream: Upstream) -> StageOutput:
        """Decode the slice's files or ranges in Arrow tasks; Spark reads those they
        refuse."""
        from streamer.runtime.arrow.arrow_input import decode_units

        piece = epoch.slices.get(self.node_id)
        units = self.plan.units(piece) if piece is not None else []
        if not units or epoch.decision.small or self._local(units):
            return super().run(epoch, upstream)  # (Spark's small-epoch or local path)
        assert piece is not None
        target = self.target.prepare(epoch)
        results = epoch.guard(f"reading source {self.node_id!r}", partial(
            decode_units, self.source.ctx.spark, self.plan, units, target))
        done = [r for r in results if "path" in r]
        refused = [r for r in results if "refused" in r]
        took = self.target.took(epoch, done)
        prefiltered: dict[str, tuple[int, int]] = {}
        for result in done:
            for op_id, (n_in, n_out) in result["filters"].items():
                had = prefiltered.get(op_id, (0, 0))
                prefiltered[op_id] = (had[0] + n_in, had[1] + n_out)
        got: dict[str, Any] = {"n": sum(r["rows_in"] for r in done)}
        for i, split in enumerate(piece.end):  # the newest event time per split
            got[f"ts{i}"] = max((r["max_ts"] for r in done if r["split"] == str(split)
                                 and r["max_ts"] is not None), default=None)
        seen: Seen = LocalSeen(got)
        scanned = StageOutput(frames={self.node_id: None})
        if refused:
            scanned = self.scan(epoch, self.plan.rest(piece, [r["unit"] for r in refused]))
            seen = SummedSeen([seen, scanned.records_in[self.node_id]])
        return replace(
            scanned, records_in={self.node_id: seen}, prestaged=took.prestaged,
            arrow_written=took.arrow_written, sink_refused=took.sink_refused,
            prefiltered=prefiltered, arrow_decoded={self.node_id: len(done)},
            arrow_refused={_named(r["unit"]): r["refused"] for r in refused})

    def _local(self, units: list[Any]) -> bool:
        """Whether a Kafka slice is small enough for the driver to read (`runtime.plan.local`)."""
        if self.plan.kind != "kafka":
            return False
        total = sum(end - start for _, _, start, end in units)
        return total <= self.source.ctx.local_rows


class ArrowTarget(ABC):
    """Where an `ArrowDecodeSource`'s tasks write, and what the epoch learns of it."""

    @abstractmethod
    def prepare(self, epoch: EpochInput) -> Any:
        """The epoch's target of `arrow_input.decode_units` (a directory or a `TaskTarget`)."""

    @abstractmethod
    def took(self, epoch: EpochInput, done: list[dict[str, Any]]) -> StageOutput:
        """What the tasks that did not refuse their unit wrote, for the stage they wrote it
        for (`StageOutput.prestaged`, or `arrow_written` and `sink_refused`)."""


class ToKeyedStage(ArrowTarget):
    """The input files of keyed stage `keyed_id` (read with whatever Spark stages)."""

    def __init__(self, keyed_id: str, root: str) -> None:
        self.keyed_id = keyed_id
        #: Where the keyed stage's staged epochs go (`StagedRun.root`).
        self.root = root

    def prepare(self, epoch: EpochInput) -> Any:
        """The epoch's directory beside Spark's staged input."""
        return f"{self.root}/epoch-{epoch.epoch}-arrow"

    def took(self, epoch: EpochInput, done: list[dict[str, Any]]) -> StageOutput:
        """The files go to the keyed stage."""
        return StageOutput(prestaged={self.keyed_id: tuple(r["path"] for r in done)})


class ToSink(ArrowTarget):
    """The staging files of a sink that takes task-written files (`Sink.task_target`)."""

    def __init__(self, sink_id: str, sink: Any, schema: Any) -> None:
        self.sink_id = sink_id
        self.sink = sink
        #: The rows' Spark schema (the sink's input).
        self.schema = schema

    def prepare(self, epoch: EpochInput) -> Any:
        """The sink's epoch staging, emptied."""
        target = epoch.guard(f"writing sink {self.sink_id!r}", partial(
            self.sink.task_target, epoch.epoch, self.schema))
        assert target is not None  # (planned only where the sink takes task files)
        return target

    def took(self, epoch: EpochInput, done: list[dict[str, Any]]) -> StageOutput:
        """The rows written, for the sink stage; tasks whose rows the encoder left to
        Spark's writer, for the metrics."""
        failpoints.reached("arrow-written", epoch.epoch)
        return StageOutput(
            arrow_written={self.sink_id: sum(int(r["rows_out"]) for r in done)},
            sink_refused={f"{self.sink_id} task {_named(r['unit'])}": r["sink_refused"]
                          for r in done if r.get("sink_refused")})


def _named(unit: Any) -> str:
    """A file's name, or a Kafka range as `topic:partition[start, end)`."""
    if isinstance(unit, str):
        return unit
    topic, partition, start, end = unit
    return f"{topic}:{partition}[{start}, {end})"


class SummedSeen:
    """Several reads' observations as one (`get`): counts added, newest event times kept."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts

    @property
    def get(self) -> dict[str, Any]:
        """Each key: the sum of the counts (`n`, `n_<kind>`, a filter's), the greatest
        `ts<i>` (None when none has one)."""
        out: dict[str, Any] = {}
        for part in self.parts:
            for key, value in part.get.items():
                if key in ("n", "filtered", "in", "out") or key.startswith("n_"):
                    out[key] = int(out.get(key) or 0) + int(value or 0)
                elif value is not None:
                    out[key] = value if out.get(key) is None else max(out[key], value)
                else:
                    out.setdefault(key, None)
        return out


class DirectSeen:
    """What an `Observation` of a source scan gives (`n`, `ts0`), for a slice its keyed
    stage read itself: every subtask reads all of the slice, so any one's metadata has it."""

    def __init__(self, metas: Any, side: int | None = None) -> None:
        self.metas = metas
        #: A join reading both its sources: which side's source this is.
        self.side = side

    @property
    def get(self) -> dict[str, Any]:
        """`n` and `ts0`, from the first subtask that reported them."""
        for meta in self.metas:
            if "records_in" in meta:
                found = meta if self.side is None else meta["sides"][self.side]
                return {"n": found["records_in"], "ts0": found["max_ts"]}
        return {}


def local_stats(records: DataFrame, read: SourceRead, splits: list[str],
                event_time: bool) -> LocalSeen | None:
    """What the source's observation would see (`n`, `ts<i>`) of a slice read as a local
    relation, computed on the driver without a Spark job; None when Spark cannot evaluate
    the event time that way."""
    if not event_time and read.local_rows is not None:
        return LocalSeen({"n": read.local_rows})
    split = read.split_column
    table = local_table(records.selectExpr(
        f"{split} AS split" if split else "'' AS split",
        f"unix_millis({EVENT_TIME}) AS ms" if event_time else "CAST(NULL AS BIGINT) AS ms"))
    if table is None:
        return None
    newest: dict[str, int] = {}
    for name, ms in zip(table.column("split").to_pylist(), table.column("ms").to_pylist(),
                        strict=True):
        if ms is not None and (name not in newest or ms > newest[name]):
            newest[name] = ms
    got: dict[str, Any] = {"n": table.num_rows}
    for i, name in enumerate(splits):
        got[f"ts{i}"] = newest.get(str(name)) if split else max(newest.values(), default=None)
    return LocalSeen(got)
