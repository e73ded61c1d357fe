"""Keyed windows: streamer's keyed stage versus Spark Structured Streaming on the same files.

    .venv/bin/python -m bench.keyed_windows [--rows 5000000] [--files 10] [--files-per-epoch 2]
        [--keys 10000] [--repeat 1] [--million-keys 1000000] [--profile]

Input: `--rows` events (user string with `--keys` distinct values, amount double, ts
timestamp) over one hour of event time, mostly ordered with up to 3 s of jitter, written once
as `--files` parquet files to a temporary directory. Query: per user, 1-minute tumbling
event-time windows, count and sum(amount), watermark 5 s, bounded, `local[2]`.

- streamer: a files source (parquet, `max_files_per_epoch`), key_by [user], tumbling 1m
  window, parallelism 2, with the rocksdb and the memory backend; also session windows (gap 30s).
  The tumbling runs read the files in the keyed subtasks (operators/direct.py); the "Spark
  reads" runs turn that off (`STREAMER_DIRECT_READ=0`): Spark scans, pre-aggregates and
  shuffles, as for any source. Session windows always take the Spark path. The keyed tasks
  write the parquet sink's files themselves (connectors/files_sink.TaskFile); "Spark writes"
  turns that off (`STREAMER_TASK_SINK=0`): the output goes through the JVM to Spark's writer.
- Spark Structured Streaming: `readStream.parquet` with `maxFilesPerTrigger` equal to
  streamer's files per epoch, `withWatermark`, `groupBy(window(ts, '1 minute'), user)`, append
  mode, parquet sink, `trigger(availableNow=True)`; the HDFS-backed (default) and the RocksDB
  state store providers, shuffle partitions 2 and 4, a fresh checkpoint per run. The best of the
  four is the baseline (target: streamer rocksdb >= 2x its throughput). A bounded AvailableNow
  run never emits the windows its final watermark (max event time - 5 s) has not passed;
  streamer's bounded run ends with the watermark at +inf and emits them all. The output counts
  are checked against a batch query over the same files, and the windows both emitted are
  compared value by value.
- Memory per million keys: a rolling count over `--million-keys` distinct keys (2 rows each,
  2 epochs) with each backend; the state directories are copied after every task, then sized.

Throughput is input rows / wall time of the whole run (start to end of the query or job).
`--profile` adds three streamer rocksdb runs with the keyed stage's `run_task` wrapped as the
driver ships it to the Python workers: one recording each task's wall time and input wait (per
epoch: keyed task versus the rest of the epoch), one with the keyed task stubbed out (the Spark
side of an epoch alone), and one under cProfile (the driver, and every keyed task, summed by
phase). Prints tables; not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

BASE_MS = 1767225600000  # 2026-01-01T00:00:00Z
SPAN_MS = 3_600_000  # one hour of event time
JITTER_MS = 3_000  # below the 5 s watermark: no record is late
SCHEMA_DDL = "user string, amount double, ts timestamp"
ROCKSDB_PROVIDERS = (
    "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "org.apache.spark.sql.execution.streaming.state.rocksdb.RocksDBStateStoreProvider",
)
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
SESSION_SHUFFLE_PARTITIONS = "2"


# --------------------------------------------------------------------------------- data
def write_events(target: Path, rows: int, files: int, keys: int, *, seed: int = 7,
                 key_prefix: str = "u", spread: bool = False) -> None:
    """`rows` events as `files` parquet files, in event-time order across files.

    Users are random among `keys` (or, with `spread`, row i has key i mod keys, so every key
    appears); ts runs over one hour with up to JITTER_MS of backwards jitter.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    target.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, rows, files + 1).astype(np.int64)
    width = len(str(keys - 1))
    for i in range(files):
        idx = np.arange(bounds[i], bounds[i + 1], dtype=np.int64)
        ids = idx % keys if spread else rng.integers(0, keys, idx.size)
        users = np.char.add(key_prefix, np.char.zfill(ids.astype(str), width))
        jitter = rng.integers(0, JITTER_MS, idx.size)
        ts_ms = BASE_MS + idx * SPAN_MS // rows - jitter
        table = pa.table({
            "user": pa.array(users.tolist(), pa.string()),
            "amount": pa.array(rng.integers(0, 100_000, idx.size) / 100.0, pa.float64()),
            "ts": pa.array(ts_ms * 1000, pa.timestamp("us", tz="UTC")),
        })
        pq.write_table(table, target / f"events-{i:04d}.parquet")


# ----------------------------------------------------------------------------- streamer
def pipeline_yaml(name: str, data: Path, out: Path, backend: str, state_dir: Path,
                  per_epoch: int, window: str | None, aggregate: dict[str, str]) -> str:
    """A files -> keyed -> files pipeline; `window` None gives a rolling aggregate without
    event time."""
    event_time = ("\n    event_time: ts\n    watermark: {max_out_of_orderness: 5s}"
                  if window else "")
    window_line = f"\n    window: {window}" if window else ""
    aggs = "\n".join(f"      {k}: {v}" for k, v in aggregate.items())
    return f"""
name: {name}
job:
  parallelism: 2
  state: {{backend: {backend}, local_dir: "{state_dir}"}}
sources:
  - id: events
    type: files
    path: "{data}"
    format: parquet
    schema: {{user: string, amount: double, ts: timestamp}}
    max_files_per_epoch: {per_epoch}{event_time}
operators:
  - id: agg
    input: events
    key_by: [user]{window_line}
    aggregate:
{aggs}
sinks:
  - id: out
    type: files
    input: agg
    path: "{out}"
    format: parquet
"""


TUMBLING = "{tumbling: 1m}"
SESSION = "{session: {gap: 30s}}"
COUNT_SUM = {"n": "count()", "total": "sum(amount)"}


@dataclass
class Run:
    """One timed run of one configuration."""

    name: str
    seconds: float
    batches: str
    rows_out: int
    result: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def wrapped_run_task(*, profile_dir: Path | None = None, copy_dir: Path | None = None,
                     timing_dir: Path | None = None, stub: bool = False) -> Iterator[None]:
    """Replace the keyed stage's `run_task` (as the driver ships it to the Python workers)
    with a wrapper that profiles each task (`profile_dir`), records its wall time and its
    wait for input (`timing_dir`), copies the subtask's state directory after it
    (`copy_dir`), or with `stub` only drains the input and emits nothing (what an epoch costs
    without the keyed work). The wrapper is a closure, so cloudpickle ships it by value; it
    calls the real `streamer.operators.keyed.run_task`, which the workers import.
    """
    import streamer.runtime.plan.keyed_plan as driver_side
    from streamer.operators.keyed import run_task as original

    prof_dir = None if profile_dir is None else str(profile_dir)
    state_copies = None if copy_dir is None else str(copy_dir)
    timings = None if timing_dir is None else str(timing_dir)

    def run_task(cfg: Any, batches: Any, subtask: int) -> Any:
        import cProfile as profiler
        import json as json_
        import os as os_
        import shutil as shutil_
        import time as time_

        from streamer.state.base import SubtaskLocation

        waited = [0.0]

        def input_batches(batches: Any) -> Any:
            # A named generator, so cProfile shows the wait for the JVM's Arrow batches.
            it = iter(batches)
            while True:
                t = time_.perf_counter()
                batch = next(it, None)
                waited[0] += time_.perf_counter() - t
                if batch is None:
                    return
                yield batch

        name = f"e{cfg.epoch:05d}-s{subtask}"
        if stub:
            import pyarrow as pa

            for _ in input_batches(batches):
                pass
            meta = {"subtask": subtask, "out": 0, "next_event": None, "next_processing": None}
            yield pa.RecordBatch.from_pylist([{"__kind": "meta", "__meta": json_.dumps(meta)}],
                                             schema=cfg.out_schema)
            return
        prof = profiler.Profile() if prof_dir else None
        started = time_.perf_counter()
        if prof is not None:
            prof.enable()
        try:
            out = list(original(cfg, input_batches(batches), subtask))
        finally:
            if prof is not None:
                prof.disable()
                prof.dump_stats(os_.path.join(prof_dir, f"{name}.prof"))
        if timings:
            with open(os_.path.join(timings, f"{name}.json"), "w") as f:
                json_.dump({"epoch": cfg.epoch, "subtask": subtask, "wait": waited[0],
                            "seconds": time_.perf_counter() - started}, f)
        if state_copies:
            src = SubtaskLocation(cfg.state_root, cfg.job, cfg.uid, subtask).path
            dst = SubtaskLocation(os_.path.join(state_copies, f"e{cfg.epoch:05d}"), cfg.job,
                                  cfg.uid, subtask).path
            shutil_.copytree(src, dst, dirs_exist_ok=True,
                             ignore=shutil_.ignore_patterns("LOCK"))
        yield from out

    saved = driver_side.run_task
    driver_side.run_task = run_task
    try:
        yield
    finally:
        driver_side.run_task = saved


def run_streamer(spark: Any, name: str, yaml_text: str, out: Path,
                 driver_profile: cProfile.Profile | None = None) -> Run:
    from streamer.pipeline.validate import load_pipeline_text
    from streamer.runtime.job.coordinator import JobRunner, RunOptions

    spec = load_pipeline_text(yaml_text)
    started = time.perf_counter()
    if driver_profile is not None:
        driver_profile.enable()
    try:
        result = JobRunner(spec, RunOptions(ui=False), spark=spark).run()
    finally:
        if driver_profile is not None:
            driver_profile.disable()
    seconds = time.perf_counter() - started
    rows_out = spark.read.parquet(str(out)).count() if any(out.glob("part-*")) else 0
    reading = sum(1 for m in result.metrics if m.records_in)  # the rest: end-of-input flush
    return Run(name, seconds, f"{reading}+{result.epochs - reading}", rows_out, result,
               {"out": out})


# ------------------------------------------------------------ Spark Structured Streaming
def rocksdb_provider(spark: Any) -> str:
    """The first RocksDB state store provider class this Spark has."""
    jvm = spark.sparkContext._jvm
    for name in ROCKSDB_PROVIDERS:
        try:
            jvm.java.lang.Class.forName(name)
        except Exception:  # not there: try the other known package path
            continue
        return name
    msg = f"none of {ROCKSDB_PROVIDERS} is on Spark's class path"
    raise RuntimeError(msg)


def run_sss(spark: Any, name: str, data: Path, out: Path, checkpoint: Path, per_trigger: int,
            provider: str, partitions: int) -> Run:
    from pyspark.sql import functions as F

    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    spark.conf.set(PROVIDER_CONF, provider)
    try:
        started = time.perf_counter()
        events = (spark.readStream.schema(SCHEMA_DDL)
                  .option("maxFilesPerTrigger", per_trigger).parquet(str(data)))
        windows = (events.withWatermark("ts", "5 seconds")
                   .groupBy(F.window("ts", "1 minute"), "user")
                   .agg(F.count(F.lit(1)).alias("n"), F.sum("amount").alias("total"))
                   .select("user", F.col("window.start").alias("window_start"),
                           F.col("window.end").alias("window_end"), "n", "total"))
        query = (windows.writeStream.format("parquet").outputMode("append")
                 .option("path", str(out)).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        seconds = time.perf_counter() - started
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", SESSION_SHUFFLE_PARTITIONS)
        spark.conf.unset(PROVIDER_CONF)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    progress = query.recentProgress
    with_data = sum(1 for p in progress if p["numInputRows"] > 0)
    watermark = progress[-1]["eventTime"].get("watermark") if progress else None
    rows_out = spark.read.parquet(str(out)).count()
    return Run(name, seconds, f"{with_data}+{len(progress) - with_data}", rows_out,
               extra={"out": out, "watermark": watermark,
                      "rows_in": sum(p["numInputRows"] for p in progress)})


# --------------------------------------------------------------------------- checks
def expected_windows(spark: Any, data: Path, watermark: str | None = None) -> int:
    """Distinct (user, 1-minute window) in the input; with `watermark`, only the windows
    that end at or before it (what an append-mode streaming query has emitted)."""
    from pyspark.sql import functions as F

    df = spark.read.schema(SCHEMA_DDL).parquet(str(data))
    windows = df.select("user", F.window("ts", "1 minute").alias("w")).distinct()
    if watermark is not None:
        windows = windows.filter(F.col("w.end") <= F.lit(watermark).cast("timestamp"))
    return int(windows.count())


def expected_sessions(spark: Any, data: Path) -> int:
    from pyspark.sql import functions as F

    df = spark.read.schema(SCHEMA_DDL).parquet(str(data))
    return int(df.groupBy("user", F.session_window("ts", "30 seconds")).count().count())


def compare_outputs(spark: Any, streamer_out: Path, sss_out: Path) -> dict[str, Any]:
    """Join the two outputs on (user, window_start): matched, missing, value mismatches, and
    a few rows side by side."""
    from pyspark.sql import functions as F

    a = spark.read.parquet(str(streamer_out)).select(
        "user", "window_start", F.col("n").alias("n_streamer"),
        F.col("total").alias("total_streamer"))
    b = spark.read.parquet(str(sss_out)).select(
        "user", "window_start", F.col("n").alias("n_sss"), F.col("total").alias("total_sss"))
    joined = b.join(a, ["user", "window_start"], "left")
    differ = (F.col("n_streamer").isNull() | (F.col("n_streamer") != F.col("n_sss"))
              | (F.abs(F.col("total_streamer") - F.col("total_sss"))
                 > F.lit(1e-6) * F.greatest(F.lit(1.0), F.abs(F.col("total_sss")))))
    stats = joined.agg(F.count(F.lit(1)).alias("sss_rows"),
                       F.sum(F.col("n_streamer").isNull().cast("int")).alias("missing"),
                       F.sum(differ.cast("int")).alias("mismatched")).first()
    sample = joined.orderBy(F.xxhash64("user", "window_start")).limit(3).collect()
    shown = [f"{r['user']}@{r['window_start']:%H:%M} n {r['n_streamer']}/{r['n_sss']} "
             f"total {r['total_streamer']:.2f}/{r['total_sss']:.2f}" for r in sample]
    return {"sss_rows": stats["sss_rows"], "missing": stats["missing"] or 0,
            "mismatched": stats["mismatched"] or 0, "sample": "; ".join(shown)}


# ------------------------------------------------------------------- memory per key
def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure_state(kind: str, copies: Path, job: str, uid: str, keys: int) -> dict[str, int]:
    """Size the last copied state of both subtasks: the directory on disk; the state alone
    (rocksdb: SST bytes of the state and timer column families, flushed;
    memory: a full snapshot written now, minus the kept outputs in it); and for memory the
    Python heap the loaded state takes (tracemalloc around open, kept outputs excluded)."""
    import gc
    import tracemalloc

    from rocksdict import Options, Rdict

    from streamer.state import key_group_range, open_backend
    from streamer.state.base import SubtaskLocation
    from streamer.state.memory_files import drop_process_cache

    last = sorted(copies.iterdir())[-1]
    sizes = {"keys": keys, "disk": dir_bytes(last), "state": 0, "heap": 0}
    for subtask in (0, 1):
        path = SubtaskLocation(str(last), job, uid, subtask).path
        if kind == "rocksdb":
            names = Rdict.list_cf(str(path), Options(raw_mode=True))
            db = Rdict(str(path), options=Options(raw_mode=True),
                       column_families={n: Options(raw_mode=True) for n in names})
            for name in names:
                if name.startswith("state:") or name == "_timers":
                    family = db.get_column_family(name)
                    # A subtask parked open (direct reads) was never flushed: the copy's
                    # WAL holds its last writes, so flush them into SSTs before sizing.
                    family.flush()
                    sizes["state"] += family.property_int_value(
                        "rocksdb.total-sst-files-size") or 0
                    del family
            db.close()
            continue
        drop_process_cache()
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        backend = open_backend(kind, str(last), job, uid, subtask,
                               key_group_range(subtask, 2, 128))
        loaded = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        version = backend.version() or 0
        kept = sum(len(backend.outputs(v) or b"") for v in range(max(1, version - 3),
                                                                  version + 1))
        sizes["heap"] += loaded - kept
        backend._materialize()  # type: ignore[attr-defined]  # internal step: a full snapshot
        sizes["state"] += sum(f.stat().st_size for f in path.glob("snapshot-*.pkl")) - kept
        backend.close()
        drop_process_cache()
    return sizes


# ------------------------------------------------------------------------ profiling
#: (label, function, caller or None): cumulative time of `function` (as called by `caller`).
WORKER_PHASES: list[tuple[str, str, str | None]] = [
    ("wait for input batches (JVM -> Arrow)", "input_batches", None),
    ("read input (Arrow table, dummy rows out)", "_read_input", "run_task"),
    ("open backend", "open_backend", "run_task"),
    ("fire due windows", "_fire_time_windows", None),
    ("  due_timers", "due_timers", "_fire_time_windows"),
    ("  get_many (window key lists, accumulators)", "get_many", "_fire_time_windows"),
    ("  final values (final_columns)", "final_columns", "_fire_time_windows"),
    ("  emit (Emitter.columns)", "columns", "_fire_time_windows"),
    ("  delete_many", "delete_many", "_fire_time_windows"),
    ("merge the epoch's partials (_time_windows minus firing)", "_time_windows", "-fire"),
    ("  input columns to Python lists (Input.column)", "column", None),
    ("  key bytes (encode_keys)", "encode_keys", "_time_windows"),
    ("  get_many", "get_many", "_time_windows"),
    ("  lift (lift_columns)", "lift_columns", "_time_windows"),
    ("  put_many (accumulators, window key lists)", "put_many", "_time_windows"),
    ("  add_timers", "add_timers", "_time_windows"),
    ("build output batch (Arrow arrays)", "batch", "run_task"),
    ("pickle output batch for replay", "dumps", "run_task"),
    ("backend.commit", "commit", "run_task"),
    ("backend.close", "close", "run_task"),
]


def _named(func: str, name: str) -> bool:
    """Whether a pstats function label is `name` (Python functions, C methods, builtins)."""
    return func == name or f"'{name}'" in func or func.endswith(f".{name}>")


def phase_seconds(stats: pstats.Stats, name: str, caller: str | None) -> float | None:
    """Cumulative seconds spent in `name`, only through calls from `caller` if given; None
    when no such call was recorded (the code under test no longer makes it)."""
    if caller == "-fire":  # _time_windows calls _fire_time_windows first: leave it out
        whole = phase_seconds(stats, name, None)
        return None if whole is None else whole - (
            phase_seconds(stats, "_fire_time_windows", name) or 0.0)
    total, found = 0.0, False
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (_, _, func), (_, _, _, cumtime, callers) in raw.items():
        if not _named(func, name):
            continue
        if caller is None:
            total, found = total + cumtime, True
        else:
            calls = [v[3] for (_, _, c), v in callers.items() if _named(c, caller)]
            total, found = total + sum(calls), found or bool(calls)
    return total if found else None


@dataclass
class Profiles:
    """What a profiled run left: worker stats (all tasks), the driver's, the run."""

    workers: pstats.Stats | None
    tasks: int
    epochs: int
    driver: pstats.Stats
    run: Run
    #: An unprofiled run whose tasks recorded their wall time and input wait, and a run
    #: whose keyed tasks only drained their input (the Spark side of an epoch).
    timed: Run
    task_times: list[dict[str, Any]]
    stubbed: Run


def load_profiles(worker_dir: Path, driver: cProfile.Profile, run: Run, timing_dir: Path,
                  timed: Run, stubbed: Run) -> Profiles:
    import json

    files = sorted(str(p) for p in worker_dir.glob("*.prof"))
    epochs = len({Path(f).name.split("-")[0] for f in files})
    times = [json.loads(f.read_text()) for f in sorted(timing_dir.glob("*.json"))]
    return Profiles(pstats.Stats(*files) if files else None, len(files), epochs,
                    pstats.Stats(driver), run, timed, times, stubbed)


def print_epoch_split(console: Console, prof: Profiles, rows: int) -> None:
    """Per epoch of the timed run: the keyed tasks' wall time against the epoch's."""
    table = Table(title=f"where an epoch goes: streamer rocksdb, unprofiled, keyed tasks timed "
                        f"({prof.timed.seconds:.1f} s in all)")
    for col in ("epoch", "in", "epoch run ms", "task ms subtask 0 / 1",
                "of which waiting for input", "epoch - slowest task ms"):
        table.add_column(col, justify="right")
    by_epoch: dict[int, dict[int, dict[str, Any]]] = {}
    for t in prof.task_times:
        by_epoch.setdefault(t["epoch"], {})[t["subtask"]] = t
    for m in prof.timed.result.metrics:
        tasks = by_epoch.get(m.epoch, {})
        ms = [tasks[s]["seconds"] * 1000 if s in tasks else 0.0 for s in (0, 1)]
        waits = [tasks[s]["wait"] * 1000 if s in tasks else 0.0 for s in (0, 1)]
        table.add_row(str(m.epoch), f"{m.total_in:,}", f"{m.run_ms:,.0f}",
                      f"{ms[0]:,.0f} / {ms[1]:,.0f}", f"{waits[0]:,.0f} / {waits[1]:,.0f}",
                      f"{m.run_ms - max(ms):,.0f}")
    console.print(table)
    stub = prof.stubbed
    console.print(f"keyed task stubbed (drains its input, emits nothing; Spark read, "
                  f"pre-aggregation, shuffle, mapInArrow, checkpoint, sink only): "
                  f"{stub.seconds:.2f} s = {rows / stub.seconds:,.0f} rows/s, "
                  f"{stub.batches} epochs", markup=False, highlight=False)


def print_profiles(console: Console, prof: Profiles) -> None:
    per = max(prof.epochs, 1)
    table = Table(title=f"streamer rocksdb under cProfile: keyed tasks in the Python workers, "
                        f"{prof.tasks} tasks over {prof.epochs} epochs, seconds summed over "
                        f"tasks (2 subtasks run in parallel)")
    for col in ("phase", "total s", "per epoch s"):
        table.add_column(col, justify="right" if col != "phase" else "left")
    if prof.workers is not None:
        total = phase_seconds(prof.workers, "run_task", None) or 0.0
        table.add_row("run_task (all)", f"{total:.2f}", f"{total / per:.3f}")
        own = sum(v[2] for (_, _, f), v in prof.workers.stats.items()  # type: ignore
                  if f == "run_task")
        table.add_row("run_task own time", f"{own:.2f}", f"{own / per:.3f}")
        for label, name, caller in WORKER_PHASES:
            seconds = phase_seconds(prof.workers, name, caller)
            if seconds is not None:
                table.add_row(label, f"{seconds:.2f}", f"{seconds / per:.3f}")
    console.print(table)
    if prof.workers is not None:
        text = io.StringIO()
        prof.workers.stream = text  # type: ignore[attr-defined]
        prof.workers.sort_stats("tottime").print_stats(20)
        console.print("keyed tasks (Python workers), top functions by own time:")
        console.print(_trim_stats(text.getvalue()), markup=False, highlight=False)
    text = io.StringIO()
    prof.driver.stream = text  # type: ignore[attr-defined]
    prof.driver.sort_stats("cumulative").print_stats(25)
    console.print("driver (JobRunner.run), top functions by cumulative time:")
    console.print(_trim_stats(text.getvalue()), markup=False, highlight=False)
    print_epochs(console, f"profiled run ({prof.run.seconds:.1f} s), per epoch (ms)",
                 prof.run.result)


def _trim_stats(text: str) -> str:
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if "ncalls" in ln), 0)
    root = str(Path(__file__).resolve().parents[1])
    return "\n".join(ln.replace(root + "/", "").replace(
        str(Path(os.__file__).parent) + "/", "") for ln in lines[start:] if ln.strip())


def print_epochs(console: Console, title: str, result: Any) -> None:
    table = Table(title=title)
    for col in ("epoch", "in", "out", "plan ms", "run ms", "commit ms", "duration ms"):
        table.add_column(col, justify="right")
    for m in result.metrics:
        table.add_row(str(m.epoch), f"{m.total_in:,}", f"{m.total_out:,}", f"{m.plan_ms:.0f}",
                      f"{m.run_ms:.0f}", f"{m.commit_ms:.0f}", f"{m.duration_ms:.0f}")
    console.print(table)


# ----------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--files-per-epoch", type=int, default=2)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--million-keys", type=int, default=1_000_000,
                        help="distinct keys of the memory-per-key runs (0: skip them)")
    parser.add_argument("--profile", action="store_true",
                        help="one more streamer rocksdb run under cProfile (driver + tasks)")
    args = parser.parse_args()
    console = Console(width=None if sys.stdout.isatty() else 130)

    tmp = Path(tempfile.mkdtemp(prefix="bench-keyed-windows-"))
    os.environ.setdefault("STREAMER_LOG_DIR", str(tmp / "logs"))
    from streamer.runtime.cluster.spark import create_session

    spark = create_session("bench-keyed-windows", "local[2]",
                           {"spark.sql.shuffle.partitions": SESSION_SHUFFLE_PARTITIONS},
                           ui=False)
    counter = iter(range(1_000_000))

    def fresh(label: str) -> Path:
        return tmp / f"{label}-{next(counter)}"

    runs: dict[str, list[Run]] = {}
    notes: list[str] = []
    try:
        data, warm = tmp / "events", tmp / "warm"
        started = time.perf_counter()
        write_events(data, args.rows, args.files, args.keys)
        write_events(warm, 100_000, 2, args.keys, seed=3)
        console.print(f"wrote {args.rows:,} events, {args.keys:,} keys, {args.files} parquet "
                      f"files in {time.perf_counter() - started:.1f} s")
        rocksdb = rocksdb_provider(spark)
        per = args.files_per_epoch

        def streamer(name: str, backend: str, window: str, source: Path = data,
                     driver_profile: cProfile.Profile | None = None) -> Run:
            out = fresh("out")
            job = re.sub(r"[^a-z0-9]+", "-", name.lower())
            yaml_text = pipeline_yaml(job, source, out, backend, fresh("state"), per, window,
                                      COUNT_SUM)
            return run_streamer(spark, name, yaml_text, out, driver_profile)

        def sss(name: str, provider: str, partitions: int, source: Path = data) -> Run:
            return run_sss(spark, name, source, fresh("out"), fresh("checkpoint"), per,
                           provider, partitions)

        def env_off(variable: str, fn: Callable[[], Run]) -> Run:
            """`fn` with `variable` set to 0: `STREAMER_DIRECT_READ` (Spark scans,
            pre-aggregates and shuffles the files, the path every other source takes) or
            `STREAMER_TASK_SINK` (Spark writes the sink's files from the keyed output)."""
            saved = os.environ.get(variable)
            os.environ[variable] = "0"
            try:
                return fn()
            finally:
                if saved is None:
                    os.environ.pop(variable, None)
                else:
                    os.environ[variable] = saved

        configs: dict[str, Callable[[], Run]] = {
            "SSS hdfs, 2 partitions": lambda: sss("SSS hdfs, 2 partitions", HDFS_PROVIDER, 2),
            "SSS hdfs, 4 partitions": lambda: sss("SSS hdfs, 4 partitions", HDFS_PROVIDER, 4),
            "SSS rocksdb, 2 partitions": lambda: sss("SSS rocksdb, 2 partitions", rocksdb, 2),
            "SSS rocksdb, 4 partitions": lambda: sss("SSS rocksdb, 4 partitions", rocksdb, 4),
            "streamer rocksdb": lambda: streamer("streamer rocksdb", "rocksdb", TUMBLING),
            "streamer memory": lambda: streamer("streamer memory", "memory", TUMBLING),
            "streamer rocksdb, Spark writes": lambda: env_off("STREAMER_TASK_SINK", lambda: (
                streamer("streamer rocksdb, Spark writes", "rocksdb", TUMBLING))),
            "streamer rocksdb, Spark reads": lambda: env_off("STREAMER_DIRECT_READ", lambda: (
                streamer("streamer rocksdb, Spark reads", "rocksdb", TUMBLING))),
            "streamer memory, Spark reads": lambda: env_off("STREAMER_DIRECT_READ", lambda: (
                streamer("streamer memory, Spark reads", "memory", TUMBLING))),
            "streamer rocksdb, sessions 30s": lambda: streamer(
                "streamer rocksdb, sessions 30s", "rocksdb", SESSION),
            "streamer memory, sessions 30s": lambda: streamer(
                "streamer memory, sessions 30s", "memory", SESSION),
        }
        # Warm-up: JIT, Python workers, native libraries, file system caches.
        streamer("warm-up", "rocksdb", TUMBLING, warm)
        streamer("warm-up", "memory", SESSION, warm)
        sss("warm-up", rocksdb, 2, warm)
        sss("warm-up", HDFS_PROVIDER, 2, warm)

        for i in range(args.repeat):
            order = list(configs)
            if i % 2:
                order.reverse()
            for name in order:
                run = configs[name]()
                runs.setdefault(name, []).append(run)
                console.print(f"  {name}: {run.seconds:.1f} s, {run.rows_out:,} rows out")

        # Honesty checks: output counts against a batch query, values against each other.
        total_windows = expected_windows(spark, data)
        total_sessions = expected_sessions(spark, data)
        for name, rs in runs.items():
            run = rs[-1]
            if name.startswith("SSS"):
                run.extra["expected"] = expected_windows(spark, data, run.extra["watermark"])
            elif "sessions" in name:
                run.extra["expected"] = total_sessions
            else:
                run.extra["expected"] = total_windows
        best_sss = max((n for n in runs if n.startswith("SSS")),
                       key=lambda n: args.rows / statistics.median(r.seconds for r in runs[n]))
        checks = {}
        for name in ("streamer rocksdb", "streamer memory", "streamer rocksdb, Spark writes",
                     "streamer rocksdb, Spark reads", "streamer memory, Spark reads"):
            checks[name] = compare_outputs(spark, runs[name][-1].extra["out"],
                                           runs[best_sss][-1].extra["out"])

        profiles = None
        if args.profile:
            timing = fresh("timings")
            timing.mkdir()
            with wrapped_run_task(timing_dir=timing):
                timed = streamer("streamer rocksdb (tasks timed)", "rocksdb", TUMBLING)
            with wrapped_run_task(stub=True):
                stubbed = streamer("keyed task stubbed", "rocksdb", TUMBLING)
            driver = cProfile.Profile()
            workers = fresh("profiles")
            workers.mkdir()
            with wrapped_run_task(profile_dir=workers):
                profiled = streamer("streamer rocksdb (profiled)", "rocksdb", TUMBLING,
                                    driver_profile=driver)
            profiles = load_profiles(workers, driver, profiled, timing, timed, stubbed)

        memory_rows = []
        if args.million_keys:
            mdata = tmp / "million"
            write_events(mdata, 2 * args.million_keys, 2, args.million_keys, seed=11,
                         key_prefix="k", spread=True)
            for kind in ("rocksdb", "memory"):
                copies = fresh("copies")
                out = fresh("out")
                name = f"rolling-count-{kind}"
                yaml_text = pipeline_yaml(name, mdata, out, kind, fresh("state"), 1, None,
                                          {"n": "count()"})
                with wrapped_run_task(copy_dir=copies):
                    run = run_streamer(spark, name, yaml_text, out)
                sizes = measure_state(kind, copies, name, "agg", args.million_keys)
                memory_rows.append((kind, run, sizes))
                shutil.rmtree(copies, ignore_errors=True)
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    # ------------------------------------------------------------------------ report
    def median_s(name: str) -> float:
        return statistics.median(r.seconds for r in runs[name])

    base = args.rows / median_s(best_sss)
    title = (f"keyed windows: {args.rows:,} events, {args.keys:,} keys, 1-minute tumbling "
             f"count+sum, {args.files} files, {per} per epoch/trigger, local[2]"
             + (f", median of {args.repeat}" if args.repeat > 1 else ""))
    table = Table(title=title)
    for col in ("config", "epochs/triggers", "windows out (expected)", "seconds", "rows/s",
                "vs best SSS"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for name, rs in runs.items():
        seconds = median_s(name)
        run = rs[-1]
        expected = run.extra.get("expected")
        out_cell = f"{run.rows_out:,}" + (f" ({expected:,})" if expected is not None else "")
        table.add_row(name + (" *" if name == best_sss else ""), run.batches, out_cell,
                      f"{seconds:.2f}", f"{args.rows / seconds:,.0f}",
                      f"{args.rows / seconds / base:.2f}x")
    console.print(table)
    sss_wm = runs[best_sss][-1].extra["watermark"]
    notes.append("* best SSS configuration (the baseline). epochs/triggers: streamer = epochs "
                 "that read data + the end-of-input epoch that fires the remaining timers "
                 "(watermark +inf); SSS = micro-batches with data + without (AvailableNow).")
    notes.append(f"SSS stops at watermark {sss_wm} (max event time - 5 s): windows ending after "
                 "it are never emitted by a bounded AvailableNow run; its expected count is "
                 "the batch count of windows ending at or before it. streamer's expected "
                 "counts are all windows (tumbling) / all sessions (batch session_window).")
    for name, rs in runs.items():
        expected = rs[-1].extra.get("expected")
        if expected is not None and expected != rs[-1].rows_out:
            notes.append(f"MISMATCH: {name} wrote {rs[-1].rows_out:,} windows, the batch "
                         f"query over the same files gives {expected:,}.")
    for name, check in checks.items():
        notes.append(f"{name} vs {best_sss}: {check['sss_rows']:,} SSS windows, "
                     f"{check['missing']:,} missing from streamer, {check['mismatched']:,} "
                     f"with a different n or total; sample (streamer/SSS): {check['sample']}")
    for note in notes:
        console.print(note, markup=False, highlight=False)
    print_epochs(console, "streamer rocksdb, per epoch (ms)", runs["streamer rocksdb"][-1].result)

    if memory_rows:
        mem = Table(title=f"state per key: rolling count over {args.million_keys:,} keys "
                          f"({2 * args.million_keys:,} rows, 2 epochs), after the last epoch")
        for col in ("backend", "seconds", "state dir on disk", "bytes/key on disk",
                    "state only", "state bytes/key", "Python heap bytes/key"):
            mem.add_column(col, justify="left" if col == "backend" else "right")
        for kind, run, s in memory_rows:
            keys = s["keys"]
            heap = f"{s['heap'] / keys:,.0f}" if kind == "memory" else "-"
            mem.add_row(kind, f"{run.seconds:.1f}", f"{s['disk'] / 1e6:,.1f} MB",
                        f"{s['disk'] / keys:,.0f}", f"{s['state'] / 1e6:,.1f} MB",
                        f"{s['state'] / keys:,.0f}", heap)
        console.print(mem)
        console.print("bytes/key = MB per million keys. The state directory also holds the "
                      "pickled output batches of the last 4 epochs (kept for replay) and, for "
                      "memory, the deltas since the last snapshot. State only: rocksdb = SST "
                      "bytes of the state and timer column families; memory = a full snapshot "
                      "minus the kept outputs. Python heap: tracemalloc around opening the "
                      "memory backend, kept outputs excluded.", markup=False, highlight=False)
    if profiles is not None:
        print_epoch_split(console, profiles, args.rows)
        print_profiles(console, profiles)


if __name__ == "__main__":
    main()
