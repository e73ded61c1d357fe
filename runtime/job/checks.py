"""Spark-backed checks used by the CLI: expression analysis for `validate`, and one shared
session for `test`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamer.pipeline.spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamer.runtime.plan.physical import PhysicalPlan


def shared_session(spec: PipelineSpec | None = None) -> SparkSession:
    """A local session without the UI for checks and tests (the pipeline's spark: block
    applies).
    """
    from streamer.runtime.cluster.spark import create_session

    return create_session("streamer-check", None, dict(spec.spark) if spec else {}, ui=False)


def analysis_session(spec: PipelineSpec) -> SparkSession:
    """A session that only analyzes (`streamer validate`; it runs no job of the pipeline,
    at most a schema inference): one core, one shuffle partition, no UI, no Hive catalog,
    and a driver JVM that starts fast (`ANALYSIS_JAVA_OPTIONS`). The pipeline's spark:
    block applies over these; the JVM flags are added to its driver options. Start it once
    per invocation: every file's analysis reuses it."""
    from streamer.runtime.cluster.spark import (
        ANALYSIS_CONF,
        ANALYSIS_JAVA_OPTIONS,
        DEFAULT_CONF,
        create_session,
    )

    conf = {**ANALYSIS_CONF, **spec.spark}
    key = "spark.driver.extraJavaOptions"
    conf[key] = f"{conf.get(key) or DEFAULT_CONF[key]} {ANALYSIS_JAVA_OPTIONS}"
    return create_session("streamer-check", conf.pop("spark.master", "local[1]"), conf,
                          ui=False)


def analyze_spec(spec: PipelineSpec, spark: SparkSession | None = None) -> None:
    """Check every expression of `spec` against its input schema; raise `PipelineError`."""
    from streamer.connectors.base import ConnectorContext
    from streamer.connectors.registry import make_source
    from streamer.runtime.analyze import analyze

    session = spark or shared_session(spec)
    ctx = ConnectorContext(spark=session, job_name=spec.name)
    analyze(spec, session, {s.id: make_source(s, ctx) for s in spec.sources})


def physical_plan(spec: PipelineSpec, spark: SparkSession | None = None) -> PhysicalPlan:
    """The physical plan `streamer run` would compile for `spec` in local mode: sources
    and sinks are built (not opened) and every expression analyzed; nothing is written. In
    the continuous mode, a plan the gang cannot run (`runtime.job.gang.gang_plan`) is the
    `ConfigError` the run would stop with."""
    from streamer.runtime.job.coordinator import JobRunner, RunOptions
    from streamer.runtime.job.gang import gang_plan, refused

    session = spark or shared_session(spec)  # (with checkpoints, as `streamer run`: a
    # sink's exactly-once mode decides how it is written)
    runner = JobRunner(spec, RunOptions(ui=False, checkpoints=True), spark=session)
    plan = runner.build()
    gang = gang_plan(runner.job, session) if plan.settings.mode == "continuous" else None
    if isinstance(gang, str):
        raise refused(spec.file, gang)
    shown = plan.gang
    if gang is not None and shown is not None and gang.sources != shown.groups[0].subtasks:
        plan.gang = shown.with_source_subtasks(gang.sources, (
            "as many as the keyed subtasks, but no more than the topic's partitions (a "
            "subtask without partitions would hold the watermark back); each reads its share "
            "of the partitions with one consumer, runs the event time and the filters and "
            "derived columns on Arrow and sends every keyed subtask its rows over Arrow "
            "Flight"))
    return plan


def check_user_code(spec: PipelineSpec) -> None:
    """Import every process function the pipeline names (no Spark): a missing module or
    class, or a class that is not a process function, is a `PipelineError` at its line."""
    import os

    from streamer.operators.process import ProcessFunctionError, load_function_class
    from streamer.pipeline.exceptions import PipelineError, Problem

    base = os.path.dirname(os.path.abspath(spec.file))
    problems = []
    for op in spec.operators:
        if op.process is None:
            continue
        try:
            load_function_class(op.process, base, op.id)
        except ProcessFunctionError as exc:
            problems.append(Problem(spec.where((*op.path, "process")), str(exc)))
    if problems:
        raise PipelineError(problems)
