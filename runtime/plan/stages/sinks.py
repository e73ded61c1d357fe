"""Sink stages: how an epoch's rows reach a sink's pre-commit (phase one of two-phase
commit; the coordinator commits after the checkpoint that covers the epoch).

- `SparkWriterSink`: the union of the sink's inputs (and the dead letters, late records or
  side outputs routed to it) goes to the sink's Spark writer. In a local epoch, a sink that
  takes Arrow tables gets the rows collected on the driver instead, without a job.
- `SubtaskWrittenSink`: the keyed stage feeding it writes the sink's staging files from its
  subtasks (`FilesSink.task_target`); the sink stages what they wrote. A jsonl subtask whose
  rows the JSON encoder refused is named in the epoch's `sink_refused` metrics.
- `ArrowWrittenSink`: the Arrow tasks of its source (`runtime.arrow.arrow_input`, through a
  stateless chain or none) write its staging files; Spark's writer adds the rows of the
  files or ranges they refused, and writes whole epochs the tasks do not run (small ones).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from streamer.columns import COUNT_AS
from streamer.connectors.base import WritesTaskFiles
from streamer.operators.stateless import union
from streamer.runtime.plan.keyed_plan import visible
from streamer.runtime.plan.local import LocalSeen, local_table
from streamer.runtime.plan.stages.base import OUT, EpochInput, Seen, Stage, StageOutput, Upstream
from streamer.runtime.plan.stages.sources import SummedSeen

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from streamer.connectors.base import Sink


class SparkWriterSink(Stage):
    """The sink's Spark writer (or, in a local epoch, its Arrow-table writer)."""

    kind = "sink"
    strategy = "spark-writer"

    def __init__(self, node_id: str, reason: str, sink: Sink, inputs: tuple[str, ...]) -> None:
        super().__init__(node_id, reason)
        self.sink = sink
        self.inputs = inputs

    @property
    def reads(self) -> tuple[str, ...]:
        """The sink's inputs."""
        return self.inputs

    def run(self, epoch: EpochInput, upstream: Upstream) -> StageOutput:
        """Pre-commit the epoch's rows, if any, and observe how many there were of each
        kind (`OUT`, `DEAD`, `LATE`: a column tags each input's rows when they are mixed)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        sink_id, sink = self.node_id, self.sink
        present = [*((f, OUT) for f in upstream.inputs(self.inputs)),
                   *((r.rows, r.counts_as) for r in upstream.routed)]
        if not present:
            return StageOutput()
        kinds = sorted({kind for _, kind in present})
        frames = [visible(f) for f, _ in present]
        if len(kinds) > 1:
            frames = [f.withColumn(COUNT_AS, F.lit(kind))
                      for f, (_, kind) in zip(frames, present, strict=True)]
        rows = union(frames)
        what = f"writing sink {sink_id!r}"
        if upstream.ran_local and sink.takes_tables:
            table = epoch.guard(what, partial(local_table, sink.table_of(visible(rows))))
            if table is not None:  # the rows, collected on the driver without a job
                seen = LocalSeen(self._local_counts(rows, kinds, table.num_rows))
                handle = epoch.guard(what, partial(sink.write_table, epoch.epoch, table))
                return StageOutput(sink_rows={sink_id: seen}, ran_local=(sink_id,),
                                   handles={sink_id: handle})
        obs = Observation(f"out_{sink_id}_{epoch.epoch}")
        counts = ([F.count(F.lit(1)).alias(f"n_{kinds[0]}")] if len(kinds) == 1 else
                  [F.count_if(F.col(COUNT_AS) == F.lit(k)).alias(f"n_{k}") for k in kinds])
        df = visible(rows.observe(obs, F.count(F.lit(1)).alias("n"), *counts))
        handle = epoch.guard(what, partial(sink.write, epoch.epoch, df))
        return StageOutput(sink_rows={sink_id: obs}, handles={sink_id: handle})

    @staticmethod
    def _local_counts(rows: DataFrame, kinds: list[str], n: int) -> dict[str, int]:
        """`n` and the rows of each kind of a local epoch's rows, counted on the driver."""
        if len(kinds) == 1:
            return {"n": n, f"n_{kinds[0]}": n}
        tags = local_table(rows.select(COUNT_AS))
        values = tags.column(0).to_pylist() if tags is not None else []
        return {"n": n, **{f"n_{k}": values.count(k) for k in kinds}}


class SubtaskWrittenSink(SparkWriterSink):
    """A local parquet or jsonl files sink whose staging files the keyed subtasks write."""

    strategy = "written-by-subtasks"

    def run(self, epoch: EpochInput, upstream: Upstream) -> StageOutput:
        """Run the keyed stage's job (its tasks write the files), then stage them."""
        job = upstream.sink_job
        if job is None:
            return super().run(epoch, upstream)
        sink = self.sink
        assert isinstance(sink, WritesTaskFiles)  # (the planner chose it for that)
        handle = epoch.guard(f"writing sink {self.node_id!r}", partial(
            sink.tasks_wrote, epoch.epoch, job.run))
        return StageOutput(
            handles={self.node_id: handle}, sink_rows={self.node_id: TaskRows(job.metas)},
            # (a jsonl sink's rows the encoder left to Spark's writer)
            sink_refused={f"{self.node_id} subtask {meta['subtask']}": meta["sink_refused"]
                          for meta in job.metas if meta.get("sink_refused")})


class ArrowWrittenSink(SparkWriterSink):
    """A sink whose staging files its source's Arrow tasks wrote (`Upstream.arrow_written`)."""

    strategy = "written-by-arrow-tasks"

    def run(self, epoch: EpochInput, upstream: Upstream) -> StageOutput:
        """Stage the tasks' files, and Spark's rows of what they refused beside them."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        written = upstream.arrow_written
        if written is None:  # (the tasks did not run this epoch)
            return super().run(epoch, upstream)
        seen: Seen = LocalSeen({"n": written, f"n_{OUT}": written})
        present = upstream.inputs(self.inputs)
        beside = None
        if present:
            obs = Observation(f"out_{self.node_id}_{epoch.epoch}")
            beside = visible(union(present).observe(
                obs, F.count(F.lit(1)).alias("n"), F.count(F.lit(1)).alias(f"n_{OUT}")))
            seen = SummedSeen([seen, obs])
        sink = self.sink
        assert isinstance(sink, WritesTaskFiles)  # (the planner chose it for that)
        handle = epoch.guard(f"writing sink {self.node_id!r}", partial(
            sink.tasks_wrote, epoch.epoch, _nothing, beside))
        return StageOutput(sink_rows={self.node_id: seen}, handles={self.node_id: handle})


def _nothing() -> None:
    """No job to run: the Arrow tasks already wrote the files."""


class TaskRows:
    """What an `Observation` of a sink's input gives (`n`), for a sink whose files the
    keyed tasks wrote themselves: the sum of their `sink_rows`."""

    def __init__(self, metas: Any) -> None:
        self.metas = metas

    @property
    def get(self) -> dict[str, Any]:
        """`n`: the rows the subtasks wrote."""
        n = sum(int(m.get("sink_rows", 0)) for m in self.metas)
        return {"n": n, f"n_{OUT}": n}
