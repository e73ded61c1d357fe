"""The execution mode of a run and, in the continuous mode, the gang it runs as (issue 36):
what `streamer plan --physical` shows before the stages (docs/architecture.md, "Continuous
execution").

`job.execution.mode` (or $STREAMER_EXECUTION_MODE) chooses it. The epoch mode runs the
stages of `runtime.plan.physical`; the continuous mode runs one Spark barrier stage whose tasks are
every source subtask and every keyed subtask at once (`runtime.continuous.source_subtask`,
`operators.continuous`), which `pipeline.continuous_support` has checked it can run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from streamer.pipeline.continuous_support import check_mode
from streamer.pipeline.job_spec import ExecutionSpec
from streamer.pipeline.spec import PipelineSpec

if TYPE_CHECKING:
    from streamer.runtime.plan.keyed_plan import KeyedStage


@dataclass(frozen=True)
class ModeChoice:
    """The mode a run uses and why: "default", "job.execution.mode in FILE:LINE:COL" or the
    environment variable that set it."""

    mode: str
    why: str

    def describe(self) -> dict[str, str]:
        """As `--format json` shows it."""
        return {"value": self.mode, "from": self.why}

    def line(self) -> str:
        """As the tree shows it: `mode: epochs (default)`."""
        return f"mode: {self.mode} ({self.why})"


@dataclass(frozen=True)
class GangTasks:
    """One group of the gang's tasks: a source's or a keyed operator's subtasks."""

    role: str  # "source" | "keyed"
    node_id: str
    subtasks: int
    reason: str

    def describe(self) -> dict[str, Any]:
        """As `--format json` shows it."""
        return {"role": self.role, "node": self.node_id, "subtasks": self.subtasks,
                "reason": self.reason}


@dataclass(frozen=True)
class GangShape:
    """The continuous mode's one Spark barrier stage: its source and keyed subtasks (one task
    each, all scheduled at once) and the sink its keyed subtasks write."""

    groups: tuple[GangTasks, ...]
    sink: str
    #: The source's `on_error` sink, which its subtasks write (None: no `on_error`).
    dead_letters: str | None = None

    @property
    def tasks(self) -> int:
        """The barrier stage's task count."""
        return sum(group.subtasks for group in self.groups)

    def describe(self) -> dict[str, Any]:
        """As `--format json` shows it."""
        found = {"stage": f"one Spark barrier stage of {self.tasks} tasks",
                 "tasks": self.tasks,
                 "subtasks": [group.describe() for group in self.groups], "sink": self.sink}
        if self.dead_letters is not None:
            found["dead_letters"] = self.dead_letters
        return found

    def with_source_subtasks(self, n: int, reason: str) -> GangShape:
        """The gang with `n` source subtasks, for `reason` (the run's own count: a Kafka
        source's is known once its partitions are listed)."""
        return replace(self, groups=tuple(
            replace(g, subtasks=n, reason=reason) if g.role == "source" else g
            for g in self.groups))

    def render(self) -> list[str]:
        """As the tree shows it."""
        lines = [f"gang: one Spark barrier stage of {self.tasks} tasks (Spark schedules them "
                 "all at once; one failed task fails them all)"]
        for group in self.groups:
            lines.append(f"    - {group.role} {group.node_id!r}: {group.subtasks} "
                         f"subtask{'s' if group.subtasks != 1 else ''}: {group.reason}")
        lines.append(f"    - sink: {self.sink}")
        if self.dead_letters is not None:
            lines.append(f"    - dead letters: {self.dead_letters}")
        return lines


def choose_mode(spec: PipelineSpec, settings: ExecutionSpec) -> ModeChoice:
    """The run's mode and why; raises `PipelineError` when it is the continuous mode and
    the pipeline has a node it cannot run (`pipeline.continuous_support`)."""
    check_mode(spec, settings)
    origin = settings.sources["mode"]
    if origin == "environment":
        why = settings.VARIABLES["mode"]
    elif origin == "file":
        why = f"job.execution.mode in {spec.where(('job', 'execution', 'mode'), key=True)}"
    else:
        why = "default"
    return ModeChoice(settings.mode, why)


def plan_gang(spec: PipelineSpec, keyed: Mapping[str, KeyedStage],
              default_parallelism: int) -> GangShape:
    """The gang of a pipeline that `check_mode` accepted: one source, at most one keyed
    operator (its stage's parallelism: job.parallelism, else Spark's default) and one sink."""
    (source,) = spec.sources
    sink = next(s for s in spec.sinks if s.id != source.on_error)
    n = next(iter(keyed.values())).parallelism if keyed else (
        spec.job.parallelism or default_parallelism)
    set_by = ("job.parallelism" if spec.job.parallelism is not None
              else "Spark's default parallelism (job.parallelism is not set)")
    split = ("file i is read by subtask i mod n, in name order" if source.type == "files"
             else "each subtask reads its share of the topic's partitions with one consumer")
    written = (f"{sink.option('format')} files" if sink.type == "files" else sink.type)
    commit = ("what they wrote before checkpoint n is committed after n's _metadata (an "
              "at_least_once Kafka sink's is flushed at n)")
    dead = None
    if source.on_error is not None:
        dead = (f"{source.on_error!r}, written by the source subtasks (the records they cannot "
                "decode or that have no event time); committed with each checkpoint as the sink")
    if not keyed:
        return GangShape((GangTasks(
            "source", source.id, n, f"{set_by}; {split}; each runs the event time and the "
            "filters and derived columns on Arrow and writes the sink itself (no keyed "
            "operator)"),), f"{sink.id!r} ({written}), written by the source subtasks; {commit}",
            dead)
    ((node_id, _stage),) = keyed.items()
    return GangShape((
        GangTasks("source", source.id, n, f"one per split group, as many as the keyed "
                  f"subtasks ({set_by}); {split}; each runs the event time and the "
                  "filters and derived columns on Arrow and sends every keyed subtask its "
                  "rows over Arrow Flight"),
        GangTasks("keyed", node_id, n, f"{set_by}; each aligns the checkpoint barriers of "
                  "its input channels and snapshots its state at each one"),
    ), f"{sink.id!r} ({written}), written by the keyed subtasks; {commit}", dead)
