"""What can run with `job.execution.mode: continuous` today (issue 36), checked without Spark.

The continuous mode runs one barrier stage of long-running subtasks (docs/architecture.md,
"Continuous execution"): source subtasks that read files or Kafka partitions with Arrow and
run the fused stateless chain (`runtime.arrow.arrow_input`), keyed subtasks that run a rolling
aggregate or a tumbling or sliding window of the aggregates the direct read combines
(`operators.direct.DIRECT_AGGREGATES`), and a files sink (and the source's `on_error`
sink: the source subtasks stage its dead letters). `continuous_refusal(spec)` returns
the first node outside that shape, with its location, so that `streamer validate` (with or
without Spark) and the planner refuse the pipeline with one line rather than at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamer.pipeline.exceptions import Location, PipelineError, Problem
from streamer.pipeline.job_spec import ExecutionSpec
from streamer.pipeline.source_spec import SourceSpec
from streamer.pipeline.spec import OperatorSpec, PipelineSpec, SinkSpec
from streamer.pipeline.yaml_loader import Path

#: What the continuous mode runs today, for messages.
SUPPORTED = ("the continuous mode runs one files or kafka source, filters and derived "
             "columns, at most one rolling aggregate or tumbling/sliding window, and one files or "
             "kafka sink")
#: The aggregate functions its keyed subtasks combine per key and window, as
#: `operators.direct.DIRECT_AGGREGATES` (a copy: pipeline/ may not import operators/; a test
#: holds the two equal).
AGGREGATES = ("count", "sum", "min", "max", "avg")
#: The files formats the source subtasks decode with Arrow (`runtime.arrow.arrow_input`).
SOURCE_FORMATS = ("jsonl", "csv", "parquet")
#: The files formats of the sink its keyed subtasks write.
SINK_FORMATS = ("jsonl", "parquet")
#: The stateless operators the source subtasks run as one fused Arrow chain.
STATELESS = ("filter", "select", "with_columns")

_KEYED_NAMES = {"join": "join", "top_n": "top-N", "over": "OVER window", "dedupe": "dedupe",
                "process": "process function: user Python"}
_WINDOW_NAMES = {"session": "session window", "count": "count window",
                 "until": "window until a close time"}


@dataclass(frozen=True)
class Refusal:
    """Why a pipeline cannot run continuously: the node (`what`: "operator 'x' (session
    window)") and where it is in the file."""

    what: str
    location: Location

    def problem(self, settings: ExecutionSpec) -> Problem:
        """The validation problem, its fix worded for where the mode was chosen."""
        variable = settings.set_by("mode")
        fix = (f"unset {variable} or set it to epochs" if variable
               else "remove job.execution.mode or use mode: epochs")
        return Problem(self.location, f"{self.what} cannot run with job.execution.mode: "
                       f"continuous yet; {SUPPORTED}; fix: {fix}")


def continuous_refusal(spec: PipelineSpec) -> Refusal | None:
    """The first node of `spec` the continuous mode cannot run (operators in file order,
    then sources, then sinks), or None when the whole pipeline fits (module docstring)."""
    def refuse(node: SourceSpec | SinkSpec, what: str) -> Refusal:
        return Refusal(what, spec.where(node.path))

    keyed = [op for op in spec.operators if op.stateful]
    for op in spec.operators:
        found = _operator_refusal(spec, op, keyed)
        if found is not None:
            return Refusal(f"operator {op.id!r} ({found[0]})", spec.where(found[1]))
    if len(spec.sources) > 1:
        return refuse(spec.sources[1], f"source {spec.sources[1].id!r} (a second source)")
    source = spec.sources[0]
    why = _source_refusal(spec, keyed)
    if why is not None:
        return refuse(source, f"source {source.id!r} ({why})")
    sinks = [s for s in spec.sinks if s.id != source.on_error]
    if len(sinks) != 1:  # (validation asks for at least one)
        return refuse(sinks[1], f"sink {sinks[1].id!r} (a second sink)")
    for sink in spec.sinks:
        why = _sink_refusal(sink.type, sink.option("format"), sink.option("path"),
                            sink.inputs, keyed if sink.id != source.on_error else [])
        if why is not None:
            return refuse(sink, f"sink {sink.id!r} ({why})")
    return None


def _remote(path: object) -> bool:
    """Whether a path is a URL of a remote file system (only local files are read so far)."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def _source_refusal(spec: PipelineSpec, keyed: list[OperatorSpec]) -> str | None:
    source = spec.sources[0]
    if source.type == "files":
        fmt = source.option("format")
        if fmt not in SOURCE_FORMATS:
            return f"files of format {fmt}, which the source subtasks do not decode"
        if _remote(source.option("path")):
            return "files on a remote file system"
        for key in ("reload", "watch"):
            if source.option(key):
                return f"files with {key}: true"
    elif source.type == "kafka":
        if source.option("format") != "json" or \
                source.option("client") != "confluent":
            return "kafka other than JSON values read with client: confluent"
        for key in ("key", "record_timestamp"):
            if source.option(key):
                return f"kafka with {key}:"
    else:
        return f"type {source.type}"
    if source.on_error and source.type == "files" and source.option("format") != "jsonl":
        return (f"on_error with files of format {source.option('format')} (its source "
                "subtasks find bad records in JSON lines and Kafka values)")
    if keyed and keyed[0].window is not None and not source.event_time:
        return f"no event_time, which window {keyed[0].id!r} needs"
    return None


def _operator_refusal(spec: PipelineSpec, op: OperatorSpec, keyed: list[OperatorSpec]
                      ) -> tuple[str, Path] | None:
    """Why `op` rules the mode out, and the path of what to point at (a process function's
    broadcast input is refused with it)."""
    name = _KEYED_NAMES.get(op.keyed_kind or "")
    if name is not None:
        return name, op.path
    if len(op.inputs) != 1:
        return f"a union of {', '.join(map(repr, op.inputs))}", op.path
    after = spec.keyed_behind(op.inputs[0])[0]
    if after:
        return f"after keyed operator {sorted(after)[0]!r}", op.path
    if not op.stateful:
        return None
    if op is not keyed[0]:
        return f"a second keyed operator, beside {keyed[0].id!r}", op.path
    window = op.window
    if window is not None:
        if window.kind in _WINDOW_NAMES:
            return _WINDOW_NAMES[window.kind], (*op.path, "window")
        if window.time == "processing":
            return "a processing-time window", (*op.path, "window", "time")
        if window.late:
            return f"a window with late: {window.late}", (*op.path, "window", "late")
    for agg in op.aggregates:
        at = (*op.path, "aggregate", agg.name)
        if agg.function not in AGGREGATES:
            return (f"aggregate {agg.name!r} is {agg.function}, not one of "
                    f"{', '.join(AGGREGATES)}"), at
        if agg.filter is not None:
            return f"aggregate {agg.name!r} has a filter", at
    return None


def _sink_refusal(kind: str, fmt: object, path: object, inputs: tuple[str, ...],
                  keyed: list[OperatorSpec]) -> str | None:
    if kind not in ("files", "kafka"):
        return f"type {kind}"
    if kind == "files" and fmt not in SINK_FORMATS:
        return f"files of format {fmt}"
    if _remote(path):
        return "files on a remote file system"
    if keyed and inputs != (keyed[0].id,):
        return f"it does not read keyed operator {keyed[0].id!r} alone"
    return None


def check_mode(spec: PipelineSpec, settings: ExecutionSpec) -> None:
    """Raise `PipelineError` when `settings` (the file's, with the environment's overrides
    applied) choose the continuous mode for a pipeline it cannot run."""
    refusal = continuous_refusal(spec) if settings.mode == "continuous" else None
    if refusal is not None:
        raise PipelineError([refusal.problem(settings)])
