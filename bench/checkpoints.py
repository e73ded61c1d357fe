"""Checkpoints: their cost on the keyed-window job, their size and duration against state size,
recovery time, and how epochs between checkpoints are made recoverable.

    .venv/bin/python -m bench.checkpoints [--rows 5000000] [--files 10] [--files-per-epoch 2]
        [--keys 10000] [--repeat 3] [--state-keys 10000,1000000,10000000] [--touch 1000]
        [--state-epoch-rows 1000000] [--backends rocksdb,memory] [--parts throughput,state]
        [--profile] [--quick]

1. Throughput. bench/keyed_windows.py's data and streamer pipeline (1-minute tumbling count and
   sum per user, rocksdb, parallelism 2, `local[2]`) in four configurations, interleaved and
   repeated (`--repeat`, median): checkpoints off (`RunOptions(checkpoints=False)`), every epoch
   (`checkpoint: {interval: 1ms}`), every 10 s, and every 10 s plus a simulated per-epoch
   changelog (each keyed subtask pickles the epoch's RocksDB write buffer at commit and uploads
   it to `file://` storage, fsynced, before the commit). Target: 10 s >= 0.95 of off.
2. Changelog versus rewind. Between checkpoints the runtime recovers by rewinding the sources
   to the last checkpoint and replaying. Measured: (a) what a changelog adds per epoch (bytes,
   serialize + upload ms, throughput of configuration 4) and what recovering from it costs
   (download + apply the deltas of one interval into a scratch RocksDB); (b) the replay: a run
   resumed from a 10 s checkpoint of the last 10 s run (`from_checkpoint`, `max_epochs`) that
   processes again the epochs up to the next checkpoint.
3. State size. A rolling count (no window) over N distinct keys (datagen, `--state-keys`;
   `--quick` drops N > 1 M) with each backend: run A reads N rows (`--state-epoch-rows` per
   epoch) and ends with checkpoint 1 (full); run B resumes from it with the local recovery
   copies present, reads `--touch` rows that update existing keys and ends with checkpoint 2
   (incremental); then `<local_dir>/.local-recovery` is deleted and run C does the same from
   checkpoint storage (`file://` in a temporary directory) and ends with checkpoint 3. Reported:
   checkpoint duration, state and uploaded bytes; restore time (the runner's `restore_report`:
   slowest subtask) and the wall time from `run()` to the first epoch, local versus remote.
4. `--profile`: one more run checkpoints off and one every epoch, with each subtask snapshot
   under cProfile and `RocksDBBackend.close` timed per task: where a checkpoint's time goes.

One SparkSession for everything; temporary directories are removed at the end. Prints tables;
not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from bench.keyed_windows import (
    COUNT_SUM,
    SESSION_SHUFFLE_PARTITIONS,
    TUMBLING,
    pipeline_yaml,
    write_events,
)

OFF, EVERY_EPOCH, TEN_S, CHANGELOG = ("off", "every epoch", "10 s", "10 s + changelog")
INTERVALS = {OFF: None, EVERY_EPOCH: "1ms", TEN_S: "10s", CHANGELOG: "10s"}
MB = 1e6


# ----------------------------------------------------------------------------- running jobs
class Recorder:
    """A Reporter that keeps what the coordinator reports, with perf_counter times."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.epochs: list[tuple[float, Any]] = []
        self.checkpoints: list[dict[str, Any]] = []
        self.messages: list[str] = []

    def starting(self, info: dict[str, Any]) -> None:
        pass

    def started(self, info: dict[str, Any]) -> None:
        pass

    def epoch_started(self, epoch: int) -> None:
        pass

    def epoch(self, m: Any) -> None:
        self.epochs.append((time.perf_counter(), m))

    def message(self, text: str) -> None:
        self.messages.append(text)

    def checkpoint(self, info: dict[str, Any]) -> None:
        self.checkpoints.append(info)

    def finished(self, summary: dict[str, Any]) -> None:
        pass


def tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process and every descendant (the Spark JVM, its
    Python daemon and workers), each with what it reaped from its dead children; from /proc
    (Linux; nan elsewhere). On a shared, loaded machine this moves much less than wall time.
    """
    try:
        tick = os.sysconf("SC_CLK_TCK")
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except (OSError, ValueError):
        return float("nan")
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as fh:
                text = fh.read()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()  # after "pid (comm) "
        parents[int(entry)] = int(fields[1])
        ticks[int(entry)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    me = os.getpid()
    total = 0
    for pid, used in ticks.items():
        ancestor = pid
        while ancestor not in (0, me):
            ancestor = parents.get(ancestor, 0)
        if ancestor == me:
            total += used
    return total / tick


@dataclass
class Outcome:
    """One run: wall seconds, the JobResult, what was reported, the restores, and the CPU
    seconds of the whole process tree during the run."""

    seconds: float
    result: Any
    rec: Recorder
    restores: list[dict[str, Any]]
    cpu_s: float = float("nan")
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def completed(self) -> list[dict[str, Any]]:
        return [c for c in self.rec.checkpoints if c["status"] == "completed"]

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [c for c in self.rec.checkpoints if c["status"] != "completed"]

    @property
    def first_epoch_s(self) -> float:
        return self.rec.epochs[0][0] - self.rec.t0 if self.rec.epochs else float("nan")


def run_job(spark: Any, text: str, *, checkpoints: bool, storage: str | None = None,
            from_checkpoint: str | None = None, max_epochs: int | None = None) -> Outcome:
    from streamer.pipeline.validate import load_pipeline_text
    from streamer.runtime.job.coordinator import JobRunner, RunOptions

    spec = load_pipeline_text(text)
    rec = Recorder()
    runner = JobRunner(spec, RunOptions(ui=False, checkpoints=checkpoints, storage=storage,
                                        from_checkpoint=from_checkpoint, max_epochs=max_epochs),
                       reporter=rec, spark=spark)
    cpu = tree_cpu_seconds()
    rec.t0 = time.perf_counter()
    result = runner.run()
    seconds = time.perf_counter() - rec.t0
    return Outcome(seconds, result, rec, list(runner.restore_report),
                   tree_cpu_seconds() - cpu)


def with_checkpoints(text: str, interval: str | None) -> str:
    """The pipeline text with `job.checkpoint.interval` set (None: unchanged)."""
    if interval is None:
        return text
    doc = yaml.safe_load(text)
    doc["job"]["checkpoint"] = {"interval": interval}
    return yaml.safe_dump(doc, sort_keys=False)


def url_of(path: Path) -> str:
    return "file://" + str(path)


def parquet_rows(spark: Any, out: Path) -> int:
    return int(spark.read.parquet(str(out)).count()) if any(out.glob("part-*")) else 0


@contextlib.contextmanager
def changelog_tasks(url: str, timing_dir: Path) -> Iterator[None]:
    """Wrap the keyed stage's `run_task` (as the driver ships it to the Python workers) so
    that each RocksDB commit first writes the epoch's change set, i.e. its write buffer
    (`_pending`: column family -> key -> value or None for a delete; not the kept outputs),
    pickled, to a local file and uploads it to `url` (`Storage.put_file`: sha256 + fsync):
    what a per-epoch changelog would add. Sizes and times go to `timing_dir` as JSON.
    The wrapper is a closure, so cloudpickle ships it by value; the patch of
    `RocksDBBackend.commit` is undone when the task ends (workers are reused).
    """
    import streamer.runtime.plan.keyed_plan as driver_side
    from streamer.operators.keyed import run_task as original

    timings = str(timing_dir)

    def run_task(cfg: Any, batches: Any, subtask: int) -> Any:
        import json as json_
        import os as os_
        import pickle as pickle_
        import time as time_

        from streamer.state.rocksdb import RocksDBBackend
        from streamer.storage import Storage

        commit = RocksDBBackend.commit
        record: dict[str, Any] = {}

        def logged_commit(self: Any, version: int, outputs: bytes | None = None) -> None:
            started = time_.perf_counter()
            payload = pickle_.dumps(self._pending, protocol=5)
            local = os_.path.join(cfg.state_root, ".changelog",
                                  f"{cfg.uid}-{subtask}-{version:08d}.log")
            os_.makedirs(os_.path.dirname(local), exist_ok=True)
            with open(local, "wb") as fh:
                fh.write(payload)
            written = time_.perf_counter()
            Storage(url).put_file(local, f"{cfg.uid}/subtask-{subtask}/{version:08d}.log")
            os_.unlink(local)
            record.update(epoch=version, subtask=subtask, bytes=len(payload),
                          entries=sum(len(b) for b in self._pending.values()),
                          serialize_ms=(written - started) * 1000,
                          upload_ms=(time_.perf_counter() - written) * 1000)
            commit(self, version, outputs)

        RocksDBBackend.commit = logged_commit  # type: ignore[method-assign]
        try:
            out = list(original(cfg, batches, subtask))
        finally:
            RocksDBBackend.commit = commit  # type: ignore[method-assign]
        if record:
            name = f"e{record['epoch']:05d}-s{subtask}.json"
            with open(os_.path.join(timings, name), "w") as fh:
                json_.dump(record, fh)
        yield from out

    saved = driver_side.run_task
    driver_side.run_task = run_task
    try:
        yield
    finally:
        driver_side.run_task = saved


@contextlib.contextmanager
def profiled_snapshots(profile_dir: Path) -> Iterator[None]:
    """Wrap the keyed stage's `run_task` so that, in the worker, each checkpoint's
    `checkpoint.task.snapshot_batch` (take_snapshot, the handle file, pruning local copies)
    runs under cProfile, one .prof file per subtask snapshot in `profile_dir`, and the wall
    time of every task's `RocksDBBackend.close` (which flushes the memtables, unless a
    snapshot's RocksDB checkpoint just did) goes to a .json file there."""
    import streamer.runtime.plan.keyed_plan as driver_side
    from streamer.operators.keyed import run_task as original

    prof_dir = str(profile_dir)

    def run_task(cfg: Any, batches: Any, subtask: int) -> Any:
        import cProfile as profiler
        import json as json_
        import os as os_
        import time as time_

        import streamer.checkpoint.task as task_module
        from streamer.state.rocksdb import RocksDBBackend

        snapshot = task_module.snapshot_batch
        close = RocksDBBackend.close
        closing = [0.0]

        def timed_close(self: Any) -> None:
            started = time_.perf_counter()
            try:
                close(self)
            finally:
                closing[0] += time_.perf_counter() - started

        def profiled(cfg_: Any, backend: Any, subtask_: int, info: Any) -> Any:
            chk = cfg_.checkpointing
            if chk is None or chk.snapshot_id is None:
                return snapshot(cfg_, backend, subtask_, info)
            prof = profiler.Profile()
            prof.enable()
            try:
                return snapshot(cfg_, backend, subtask_, info)
            finally:
                prof.disable()
                prof.dump_stats(os_.path.join(prof_dir, f"e{cfg_.epoch:05d}-s{subtask_}.prof"))

        task_module.snapshot_batch = profiled  # type: ignore[assignment]
        RocksDBBackend.close = timed_close  # type: ignore[method-assign]
        try:
            out = list(original(cfg, batches, subtask))
        finally:
            task_module.snapshot_batch = snapshot  # type: ignore[assignment]
            RocksDBBackend.close = close  # type: ignore[method-assign]
        with open(os_.path.join(prof_dir, f"e{cfg.epoch:05d}-s{subtask}.json"), "w") as fh:
            json_.dump({"close_ms": closing[0] * 1000}, fh)
        yield from out

    saved = driver_side.run_task
    driver_side.run_task = run_task
    try:
        yield
    finally:
        driver_side.run_task = saved


#: (label, function, caller or None) of the subtask side of a checkpoint.
SNAPSHOT_PHASES: list[tuple[str, str, str | None]] = [
    ("snapshot_batch (all)", "snapshot_batch", None),
    ("  take_snapshot", "take_snapshot", None),
    ("    local_checkpoint (RocksDB checkpoint: flush, hard links)", "local_checkpoint",
     "take_snapshot"),
    ("      RocksDB create_checkpoint", "create_checkpoint", "local_checkpoint"),
    ("      private copies of MANIFEST/CURRENT/OPTIONS (copyfile)", "copyfile",
     "local_checkpoint"),
    ("    key_counts", "key_counts", "take_snapshot"),
    ("    _same_content (is a base SST reusable)", "_same_content", "take_snapshot"),
    ("    put_file (upload new files)", "put_file", "take_snapshot"),
    ("      read + sha256 + write (_copy_hashing)", "_copy_hashing", None),
    ("      fsync of files", "fsync", "_put_local"),
    ("      fsync of directories (_fsync_dir)", "_fsync_dir", None),
    ("    remove the staging copy (_remove_tree)", "_remove_tree", "take_snapshot"),
    ("  prune_local_copies", "prune_local_copies", None),
]


def load_changelog(timing_dir: Path) -> list[dict[str, Any]]:
    import json

    return [json.loads(p.read_text()) for p in sorted(timing_dir.glob("*.json"))]


def apply_changelog(storage_url: str, uid: str, subtask: int, epochs: list[int],
                    scratch: Path) -> tuple[float, float, int]:
    """Recovering from a changelog: download the subtask's deltas of `epochs` (verified
    against nothing: the bytes as stored) and apply each as one WriteBatch to a scratch
    RocksDB with the same column families. Returns (download ms, apply ms, entries)."""
    import pickle

    from rocksdict import Options, Rdict, WriteBatch

    from streamer.storage import Storage

    storage = Storage(storage_url)
    started = time.perf_counter()
    payloads = [storage.read_bytes(f"{uid}/subtask-{subtask}/{e:08d}.log") for e in epochs]
    downloaded = time.perf_counter()
    db = Rdict(str(scratch), options=Options(raw_mode=True))
    handles: dict[str, Any] = {}
    entries = 0
    for payload in payloads:
        pending = pickle.loads(payload)
        batch = WriteBatch(raw_mode=True)
        for cf, buffer in pending.items():
            if cf not in handles:
                db.create_column_family(cf, Options(raw_mode=True))
                handles[cf] = db.get_column_family_handle(cf)
            for key, value in buffer.items():
                if value is None:
                    batch.delete(key, handles[cf])
                else:
                    batch.put(key, value, handles[cf])
                entries += 1
        db.write(batch)
    db.flush()
    applied = time.perf_counter()
    handles.clear()
    db.close()
    return (downloaded - started) * 1000, (applied - downloaded) * 1000, entries


# ----------------------------------------------------------------------- state-size runs
def rolling_yaml(name: str, keys: int, limit_per_split: int, epoch_rows: int, backend: str,
                 local_dir: Path, out: Path) -> str:
    """Datagen (2 splits) -> rolling count per key -> parquet. Row `offset` of split `s` has
    key `s * keys/2 + offset mod keys/2`: the first keys/2 rows of each split create every key,
    later rows update existing ones."""
    half = keys // 2
    return f"""
name: {name}
job:
  parallelism: 2
  checkpoint: {{interval: 1h}}
  state: {{backend: {backend}, local_dir: "{local_dir}"}}
sources:
  - id: gen
    type: datagen
    splits: 2
    limit: {limit_per_split}
    max_records_per_epoch: {epoch_rows}
    fields:
      key: "split * {half} + offset % {half}"
operators:
  - id: agg
    input: gen
    key_by: [key]
    aggregate:
      n: count()
sinks:
  - id: out
    type: files
    input: agg
    path: "{out}"
    format: parquet
"""


@dataclass
class StateCase:
    """One state size and backend: runs A (full checkpoint), B (local), C (remote)."""

    keys: int
    backend: str
    runs: dict[str, Outcome] = field(default_factory=dict)
    checkpoints: dict[str, Any] = field(default_factory=dict)  # run -> CheckpointMetadata
    error: str | None = None


def state_case(spark: Any, root: Path, keys: int, backend: str, touch: int,
               epoch_rows: int, console: Console, storage_url: str | None = None) -> StateCase:
    from streamer.checkpoint.checkpoint_metadata import CheckpointStore
    from streamer.storage import Storage

    case = StateCase(keys, backend)
    name = f"state-{keys}-{backend}"
    base = root / name
    storage, local_dir, out = base / "storage", base / "local", base / "out"
    remote = f"{storage_url.rstrip('/')}/{root.name}-{name}" if storage_url else None
    half = keys // 2
    try:
        for run, extra, wipe in (("A", 0, False), ("B", touch // 2, False),
                                 ("C", touch, True)):
            if wipe:
                shutil.rmtree(local_dir / ".local-recovery", ignore_errors=True)
            text = rolling_yaml(name, keys, half + extra, epoch_rows, backend, local_dir, out)
            outcome = run_job(spark, text, checkpoints=True, storage=remote or url_of(storage))
            case.runs[run] = outcome
            store = CheckpointStore(remote or url_of(storage), name)
            case.checkpoints[run] = store.read(outcome.result.checkpoints[-1])
            restored = outcome.restores[0] if outcome.restores else {}
            console.print(f"  {name} run {run}: {outcome.seconds:.1f} s, "
                          f"{outcome.result.records_in:,} rows, checkpoint "
                          f"{outcome.result.checkpoints}, restore {restored}",
                          markup=False, highlight=False)
    except Exception as exc:  # report what failed (e.g. out of memory at 10 M) and go on
        case.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        causes = [ln.strip() for ln in str(exc.__cause__ or "").splitlines()
                  if ln.startswith(("Caused by:", "org.apache", "java.", "py4j")) or "Error:"
                  in ln]
        if causes:  # the JVM's account (a Python worker that died, memory, a disk error)
            case.error += " | " + " | ".join(dict.fromkeys(c[:200] for c in causes[:6]))
        console.print(f"  {name}: FAILED {case.error}", markup=False, highlight=False)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if remote:
            with contextlib.suppress(Exception):
                Storage(remote).rm("", recursive=True)
    return case


# ----------------------------------------------------------------------------- main
def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--files-per-epoch", type=int, default=2)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each throughput configuration (interleaved)")
    parser.add_argument("--state-keys", default="10000,1000000,10000000",
                        help="comma-separated distinct-key counts of the state-size runs")
    parser.add_argument("--touch", type=int, default=1000,
                        help="keys the second and third state-size runs update")
    parser.add_argument("--state-epoch-rows", type=int, default=1_000_000,
                        help="rows per epoch of the state-size runs")
    parser.add_argument("--backends", default="rocksdb,memory")
    parser.add_argument("--parts", default="throughput,state",
                        help="which parts to run: throughput (with changelog vs rewind), state")
    parser.add_argument("--profile", action="store_true",
                        help="one more run off and every epoch, with the subtasks' snapshots "
                             "under cProfile; prints where checkpoint time goes")
    parser.add_argument("--storage-url", default=None,
                        help="state part: checkpoint storage under this fsspec URL instead of "
                        "file:// (e.g. s3://bucket/bench, reached through the AWS_* variables)")
    parser.add_argument("--quick", action="store_true",
                        help="skip state sizes above 1 M keys and run each configuration once")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    state_keys = [int(k) for k in args.state_keys.split(",") if k]
    if args.quick:
        state_keys = [k for k in state_keys if k <= 1_000_000]
        args.repeat = 1
    console = Console(width=None if sys.stdout.isatty() else 160)
    loads = {"start": load()}

    tmp = Path(tempfile.mkdtemp(prefix="bench-checkpoints-"))
    os.environ.setdefault("STREAMER_LOG_DIR", str(tmp / "logs"))
    from streamer.runtime.cluster.spark import create_session

    spark = create_session("bench-checkpoints", "local[2]",
                           {"spark.sql.shuffle.partitions": SESSION_SHUFFLE_PARTITIONS},
                           ui=False)
    counter = iter(range(1_000_000))

    def fresh(label: str) -> Path:
        return tmp / f"{label}-{next(counter)}"

    runs: dict[str, list[Outcome]] = {}
    cases: list[StateCase] = []
    changelog: list[dict[str, Any]] = []
    replay: dict[str, Any] = {}
    profile: dict[str, Any] | None = None
    try:
        if "throughput" in parts:
            data, warm = tmp / "events", tmp / "warm"
            started = time.perf_counter()
            write_events(data, args.rows, args.files, args.keys)
            write_events(warm, 100_000, 2, args.keys, seed=3)
            console.print(f"wrote {args.rows:,} events, {args.keys:,} keys, {args.files} "
                          f"parquet files in {time.perf_counter() - started:.1f} s")

            def keyed(config: str, source: Path = data) -> Outcome:
                out, storage = fresh("out"), fresh("storage")
                name = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"kw-{config}")
                text = with_checkpoints(
                    pipeline_yaml(name, source, out, "rocksdb", fresh("state"),
                                  args.files_per_epoch, TUMBLING, COUNT_SUM),
                    INTERVALS[config])
                timing = None
                with contextlib.ExitStack() as stack:
                    if config == CHANGELOG:
                        timing = fresh("changelog-timing")
                        timing.mkdir()
                        log_url = url_of(fresh("changelog"))
                        stack.enter_context(changelog_tasks(log_url, timing))
                    outcome = run_job(spark, text, checkpoints=INTERVALS[config] is not None,
                                      storage=url_of(storage))
                outcome.extra.update(text=text, storage=url_of(storage), out=out,
                                     rows_out=parquet_rows(spark, out))
                if timing is not None:
                    outcome.extra.update(changelog=load_changelog(timing), log_url=log_url)
                return outcome

            for config in INTERVALS:  # warm-up: JIT, Python workers, caches
                keyed(config, warm)
            for i in range(args.repeat):
                order = list(INTERVALS) if i % 2 == 0 else list(reversed(INTERVALS))
                for config in order:
                    outcome = keyed(config)
                    runs.setdefault(config, []).append(outcome)
                    console.print(f"  {config}: {outcome.seconds:.1f} s, "
                                  f"CPU {outcome.cpu_s:.1f} s, checkpoints at epochs "
                                  f"{[c['epoch'] for c in outcome.completed]}, "
                                  f"{len(outcome.failed)} failed, "
                                  f"{outcome.extra['rows_out']:,} windows out, load {load()}",
                                  markup=False, highlight=False)
            loads["after throughput"] = load()
            changelog = runs[CHANGELOG][-1].extra["changelog"]
            replay = measure_replay(spark, runs[TEN_S][-1], runs[CHANGELOG][-1],
                                    fresh("scratch"))
            loads["after replay"] = load()
            if args.profile:
                profiles = {}
                for config in (OFF, EVERY_EPOCH):
                    profile_dir = fresh("profiles")
                    profile_dir.mkdir()
                    with profiled_snapshots(profile_dir):
                        profiled = keyed(config)
                    profiles[config] = load_profile(profile_dir, profiled)
                profile = {"off": profiles[OFF], "on": profiles[EVERY_EPOCH]}

        if "state" in parts:
            for keys in state_keys:
                for backend in args.backends.split(","):
                    cases.append(state_case(spark, tmp, keys, backend, args.touch,
                                            args.state_epoch_rows, console, args.storage_url))
                    console.print(f"  load {load()}", markup=False, highlight=False)
            loads["after state"] = load()
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    summary: list[tuple[str, str, str]] = []
    if runs:
        print_throughput(console, runs, args, summary)
        print_changelog_vs_rewind(console, runs, changelog, replay, summary)
    if profile is not None:
        print_profile(console, profile)
    if cases:
        print_state(console, cases, args.touch, summary)
    print_summary(console, summary, loads)


# -------------------------------------------------------------------------- rewind + replay
def measure_replay(spark: Any, ten: Outcome, logged: Outcome, scratch: Path) -> dict[str, Any]:
    """Resume the 10 s run from its latest checkpoint that has a periodic successor (or from
    the start) and process the epochs up to that successor again; also recover the same
    epochs from the changelog run's deltas."""
    metrics = ten.result.metrics
    data_epochs = [m.epoch for m in metrics if m.total_in]
    last_data = max(data_epochs, default=0)
    periodic = [(m.checkpoint_id, m.epoch) for m in metrics
                if m.checkpoint_id is not None and m.epoch <= last_data]
    bounds: list[tuple[int | None, int]] = [(None, 0), *periodic]
    if len(bounds) >= 2:
        (start_id, start), (end_id, end) = bounds[-2], bounds[-1]
    else:
        (start_id, start), end_id, end = bounds[0], None, last_data
    epochs = [e for e in data_epochs if start < e <= end]
    by_epoch = {m.epoch: m for m in metrics}
    info: dict[str, Any] = {
        "from": start_id, "to": end_id, "epochs": epochs,
        "rows": sum(by_epoch[e].total_in for e in epochs),
        "original_ms": sum(by_epoch[e].duration_ms for e in epochs),
        "interval_s": (by_epoch[end].started_at - by_epoch[epochs[0]].started_at
                       + by_epoch[end].duration_ms / 1000) if epochs else float("nan"),
    }
    storage = ten.extra["storage"]
    if start_id is None:  # no periodic checkpoint: replay from the start on fresh storage
        storage = url_of(scratch / "storage")
    outcome = run_job(spark, ten.extra["text"], checkpoints=True, storage=storage,
                      from_checkpoint=None if start_id is None else str(start_id),
                      max_epochs=len(epochs))
    replayed = [(t, m) for t, m in outcome.rec.epochs if m.total_in]
    info.update(
        replay_s=(replayed[-1][0] - outcome.rec.t0) if replayed else float("nan"),
        replay_epochs_ms=sum(m.duration_ms for _, m in replayed),
        replay_rows=sum(m.total_in for _, m in replayed),
        restore=outcome.restores[0] if outcome.restores else None)
    # The changelog alternative over the same epochs of its own run (same data, same epochs).
    log_url = logged.extra["log_url"]
    per_subtask = []
    for subtask in (0, 1):
        per_subtask.append(apply_changelog(log_url, "agg", subtask, epochs,
                                           scratch / f"apply-{subtask}"))
    info["changelog_download_ms"] = max(p[0] for p in per_subtask)
    info["changelog_apply_ms"] = max(p[1] for p in per_subtask)
    info["changelog_entries"] = sum(p[2] for p in per_subtask)
    return info


# ----------------------------------------------------------------------------- profile
def load_profile(profile_dir: Path, run: Outcome) -> dict[str, Any]:
    import json
    import pstats

    from bench.keyed_windows import phase_seconds

    files = sorted(str(p) for p in profile_dir.glob("*.prof"))
    stats = pstats.Stats(*files) if files else None
    closes = [json.loads(p.read_text())["close_ms"] for p in profile_dir.glob("*.json")]
    phases = []
    if stats is not None:
        for label, name, caller in SNAPSHOT_PHASES:
            seconds = phase_seconds(stats, name, caller)
            if seconds is not None:
                phases.append((label, seconds))
    return {"snapshots": len(files), "phases": phases, "run": run, "close_ms": mean(closes)}


def print_profile(console: Console, profiles: dict[str, Any]) -> None:
    profile = profiles["on"]
    run: Outcome = profile["run"]
    n = max(profile["snapshots"], 1)
    done = run.completed
    table = Table(title=f"where a checkpoint's time goes: one more 'every epoch' run "
                        f"({run.seconds:.1f} s, {len(done)} checkpoints), the subtasks' "
                        f"snapshots under cProfile ({profile['snapshots']} subtask snapshots)")
    for col in ("phase", "total s", "per subtask snapshot ms"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for label, seconds in profile["phases"]:
        table.add_row(label, f"{seconds:.2f}", f"{seconds * 1000 / n:,.0f}")
    driver = [m.checkpoint_ms for m in run.result.metrics
              if m.checkpoint_id is not None and m.checkpoint_ms is not None]
    table.add_row("driver: complete the checkpoint (mean per checkpoint)", "",
                  f"{mean(driver):,.0f}")
    table.add_row("coordinator's checkpoint duration (mean per checkpoint)", "",
                  f"{mean([c['duration_ms'] for c in done]):,.0f}")
    table.add_row("backend.close per task, every epoch (its flush has little left to do)",
                  "", f"{profile['close_ms']:,.0f}")
    table.add_row(f"backend.close per task, checkpoints off ({profiles['off']['run'].seconds:.1f}"
                  " s run; flushes the epoch's memtables)", "",
                  f"{profiles['off']['close_ms']:,.0f}")
    console.print(table)
    console.print("The two subtasks snapshot in parallel, each at the end of its epoch task: "
                  "a checkpoint adds about the slower subtask's snapshot plus the driver's "
                  "completion to its epoch. RocksDB's checkpoint flushes the memtables, which "
                  "close() would flush anyway a moment later: the flush moves, so the time a "
                  "checkpoint adds is about snapshot - (close off - close every epoch). "
                  "cProfile slows Python code, not the system calls (fsync) or RocksDB's own "
                  "work.", markup=False, highlight=False)


# ----------------------------------------------------------------------------- tables
def print_throughput(console: Console, runs: dict[str, list[Outcome]], args: Any,
                     summary: list[tuple[str, str, str]]) -> None:
    base = median([o.seconds for o in runs[OFF]])
    base_cpu = median([o.cpu_s for o in runs[OFF]])
    table = Table(title=f"checkpoint overhead: keyed windows, {args.rows:,} events, "
                        f"{args.keys:,} keys, 1-minute tumbling count+sum, rocksdb, "
                        f"parallelism 2, local[2], median of {args.repeat} interleaved runs")
    for col in ("config", "wall s (each run)", "rows/s", "vs off (wall)", "CPU s (each run)",
                "vs off (CPU)", "epochs", "checkpoints (periodic + final)", "failed",
                "checkpoint ms (mean)", "checkpoint time / wall", "driver completion ms (mean)",
                "uploaded MB / checkpoint (mean)", "state MB (last)", "windows out"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for config, outcomes in runs.items():
        seconds = median([o.seconds for o in outcomes])
        cpu = median([o.cpu_s for o in outcomes])
        share = [sum(c["duration_ms"] for c in o.completed) / 1000 / o.seconds
                 for o in outcomes]
        done = [c for o in outcomes for c in o.completed]
        driver = [m.checkpoint_ms for o in outcomes for m in o.result.metrics
                  if m.checkpoint_id is not None and m.checkpoint_ms is not None]
        last = outcomes[-1]
        epochs = len(last.result.metrics)
        n = [len(o.completed) for o in outcomes]
        ratio = base / seconds
        table.add_row(
            config, f"{seconds:.1f} ({', '.join(f'{o.seconds:.1f}' for o in outcomes)})",
            f"{args.rows / seconds:,.0f}", f"{ratio:.3f}",
            f"{cpu:.1f} ({', '.join(f'{o.cpu_s:.1f}' for o in outcomes)})",
            f"{base_cpu / cpu:.3f}", str(epochs),
            "-" if config == OFF else f"{max(0, n[-1] - 1)} + 1 (runs: {', '.join(map(str, n))})",
            str(sum(len(o.failed) for o in outcomes)),
            "-" if not done else f"{mean([c['duration_ms'] for c in done]):,.0f}",
            "-" if not done else f"{median(share):.1%}",
            "-" if not driver else f"{mean(driver):,.0f}",
            "-" if not done else f"{mean([c['uploaded_bytes'] for c in done]) / MB:,.2f}",
            "-" if not done else f"{last.completed[-1]['state_size'] / MB:,.2f}",
            f"{last.extra['rows_out']:,}")
        if config != OFF:
            target = " (target >= 0.95)" if config == TEN_S else ""
            summary.append((f"throughput with checkpoints {config}, vs off: wall / CPU",
                            f"{ratio:.3f} / {base_cpu / cpu:.3f}{target}",
                            f"{args.rows / seconds:,.0f} vs {args.rows / base:,.0f} rows/s; "
                            f"checkpoints took {median(share):.1%} of the wall time"))
    console.print(table)
    outs = {o.extra["rows_out"] for os_ in runs.values() for o in os_}
    notes = [
        "rows/s = input rows / wall time of JobRunner.run() (start to end, median). vs off = "
        "median seconds off / median seconds of the configuration (higher is better). CPU s = "
        "user+system CPU seconds of the benchmark's whole process tree (driver, Spark JVM, "
        "Python workers) during the run: on a machine loaded by others it is the steadier "
        "measure of the work a configuration adds. checkpoint time / wall = the summed "
        "durations of a run's completed checkpoints over its wall time (median over runs): "
        "the share of the run spent in checkpoints, measured directly; an upper bound of "
        "what they add, since it includes RocksDB's memtable flush, which close() does "
        "anyway when no checkpoint did (see --profile).",
        f"A run of {args.rows:,} rows reads {args.files // args.files_per_epoch} epochs of "
        f"{args.files_per_epoch} files plus the end-of-input epoch; the 10 s runs took "
        f"{', '.join(f'{o.seconds:.0f}' for o in runs[TEN_S])} s and "
        f"{', '.join(str(max(0, len(o.completed) - 1)) for o in runs[TEN_S])} periodic "
        "checkpoints. The interval is checked when an epoch starts and the checkpoint is "
        "taken at that epoch's end, so checkpoints are at least 10 s plus one epoch apart. "
        "With checkpoints on, the end of input always takes one more (the final checkpoint, "
        "which commits the staged output), counted as '+ 1'; in a run of a few periodic "
        "checkpoints it weighs as much as they do (use more --rows for a longer run).",
        "checkpoint ms = the coordinator's duration of a completed checkpoint: the slowest "
        "subtask's snapshot (flush, hard links, upload of new SSTs, inside the epoch's Spark "
        "job) + the driver completing it (write _metadata, commit the exactly-once sink's "
        "staged files, prune). driver completion ms = the last part alone.",
        "uploaded MB = new bytes sent to checkpoint storage (file:// on the same disk) per "
        "checkpoint; state MB = bytes the last checkpoint references.",
        "With checkpoints on, the files sink is exactly-once: its output is staged per epoch "
        "and committed at the checkpoint; with checkpoints off it commits every epoch.",
        "10 s + changelog: 10 s checkpoints plus a simulated changelog (see the next table).",
    ]
    if len(outs) != 1:
        notes.append(f"MISMATCH: the configurations wrote different window counts: {outs}")
    for note in notes:
        console.print(note, markup=False, highlight=False)
    epochs = Table(title="per epoch, last run of each configuration (ms): duration "
                         "[checkpoint id: coordinator completion ms]")
    epochs.add_column("epoch", justify="right")
    for config in runs:
        epochs.add_column(config, justify="right")
    lasts = {c: {m.epoch: m for m in o[-1].result.metrics} for c, o in runs.items()}
    for e in sorted({e for by in lasts.values() for e in by}):
        cells = []
        for config in runs:
            m = lasts[config].get(e)
            if m is None:
                cells.append("")
                continue
            mark = (f" [{m.checkpoint_id}: {m.checkpoint_ms:,.0f}]"
                    if m.checkpoint_id is not None and m.checkpoint_ms is not None else "")
            cells.append(f"{m.duration_ms:,.0f}{mark}" + ("" if m.total_in else " (no data)"))
        epochs.add_row(str(e), *cells)
    console.print(epochs)


def print_changelog_vs_rewind(console: Console, runs: dict[str, list[Outcome]],
                              changelog: list[dict[str, Any]], replay: dict[str, Any],
                              summary: list[tuple[str, str, str]]) -> None:
    by_epoch: dict[int, list[dict[str, Any]]] = {}
    for r in changelog:
        by_epoch.setdefault(r["epoch"], []).append(r)
    data_epochs = {m.epoch for m in runs[CHANGELOG][-1].result.metrics if m.total_in}
    per_epoch = [rs for e, rs in sorted(by_epoch.items()) if e in data_epochs]
    epoch_bytes = [sum(r["bytes"] for r in rs) for rs in per_epoch]
    epoch_entries = [sum(r["entries"] for r in rs) for rs in per_epoch]
    # The subtasks run in parallel: an epoch waits for the slower one.
    epoch_ms = [max(r["serialize_ms"] + r["upload_ms"] for r in rs) for rs in per_epoch]
    upload_ms = [max(r["upload_ms"] for r in rs) for rs in per_epoch]
    off_epochs = [m.duration_ms for o in runs[OFF] for m in o.result.metrics if m.total_in]
    mean_epoch = mean(off_epochs)
    ten = median([o.seconds for o in runs[TEN_S]])
    logged = median([o.seconds for o in runs[CHANGELOG]])
    n = len(replay.get("epochs", []))
    span_bytes = sum(r["bytes"] for e in replay.get("epochs", []) for r in by_epoch.get(e, []))
    restore = replay.get("restore") or {}
    restore_ms = float(restore.get("ms", 0.0))
    changelog_recovery = (restore_ms + replay.get("changelog_download_ms", 0.0)
                          + replay.get("changelog_apply_ms", 0.0))
    rewind_recovery = replay.get("replay_s", float("nan")) * 1000
    frm = "the start" if replay.get("from") is None else f"checkpoint {replay['from']}"
    to = "the end of data" if replay.get("to") is None else f"checkpoint {replay['to']}"

    table = Table(title="between checkpoints: changelog per epoch (a) versus rewind and replay "
                        "(b), keyed windows at a 10 s interval")
    for col in ("cost", "(a) changelog per epoch", "(b) rewind sources and replay"):
        table.add_column(col, justify="left" if col == "cost" else "right")
    table.add_row("bytes written per epoch (both subtasks, mean / max)",
                  f"{mean(epoch_bytes) / MB:,.2f} / {max(epoch_bytes, default=0) / MB:,.2f} MB "
                  f"({mean(epoch_entries):,.0f} entries)", "0")
    table.add_row("time added per epoch: pickle + upload, slower subtask (mean / max)",
                  f"{mean(epoch_ms):,.0f} / {max(epoch_ms, default=0):,.0f} ms "
                  f"(upload alone {mean(upload_ms):,.0f} ms)", "0")
    table.add_row("  as a share of a mean epoch without checkpoints "
                  f"({mean_epoch:,.0f} ms)", f"{mean(epoch_ms) / mean_epoch:.1%}", "0")
    table.add_row("throughput, measured (median rows/s ratio to '10 s')",
                  f"{ten / logged:.3f}", "1.000")
    table.add_row(f"epochs between {frm} and {to} (the replayed span)",
                  f"{n} epochs, {span_bytes / MB:,.1f} MB of deltas",
                  f"{n} epochs, {replay.get('rows', 0):,} rows, "
                  f"{replay.get('interval_s', float('nan')):.1f} s in the original run")
    restored = ("none: replayed from the start" if not restore else
                f"{restore_ms:,.0f} ms ({restore.get('local', 0)} local, "
                f"{restore.get('remote', 0)} remote)")
    table.add_row("restore the checkpoint (slowest subtask)", "same as (b)", restored)
    table.add_row("then bring the state to the failure point (worst case: just before the "
                  "next checkpoint)",
                  f"download {replay.get('changelog_download_ms', 0):,.0f} ms + apply "
                  f"{replay.get('changelog_apply_ms', 0):,.0f} ms "
                  f"({replay.get('changelog_entries', 0):,} entries)",
                  f"replay {replay.get('replay_epochs_ms', 0):,.0f} ms of epochs "
                  f"({replay.get('replay_rows', 0):,} rows)")
    table.add_row("recovery, worst case (restore + the above; rewind: run() start to the "
                  "last replayed epoch, Spark planning included)",
                  f"{changelog_recovery:,.0f} ms", f"{rewind_recovery:,.0f} ms")
    table.add_row("recovery, failure uniform over the interval (about half the span)",
                  f"{restore_ms + (changelog_recovery - restore_ms) / 2:,.0f} ms",
                  f"{restore_ms + (rewind_recovery - restore_ms) / 2:,.0f} ms")
    table.add_row("needs", "a durable upload before every epoch's sink commit",
                  "replayable sources (files, Kafka offsets, datagen) and deterministic "
                  "operators (both hold here)")
    console.print(table)
    for note in (
        "(a) is measured in the '10 s + changelog' runs: at each RocksDB commit, each keyed "
        "subtask pickles the epoch's write buffer (every put and delete of state and timers; "
        "not the kept output batches) and uploads it with Storage.put_file (sha256, fsync, "
        "rename) to file:// storage on the same disk before committing. A remote store would "
        "add its latency per epoch. Its recovery side is measured by downloading the deltas "
        "of the replayed span and applying them, one WriteBatch per epoch, to a scratch "
        "RocksDB (per subtask; the slower one is shown).",
        f"(b) is measured by resuming the last '10 s' run from {frm} (from_checkpoint, "
        f"max_epochs={n}), i.e. the restart after a failure just before {to}: sources rewind "
        "to the checkpoint's offsets and those epochs run again. Its figure includes a "
        "restart's fixed costs (planning, listing checkpoints), which a changelog restart "
        "pays too but are not in (a)'s figure.",
    ):
        console.print(note, markup=False, highlight=False)
    summary.append(("changelog per epoch (measured throughput vs '10 s')",
                    f"{ten / logged:.3f}",
                    f"{mean(epoch_bytes) / MB:,.2f} MB and {mean(epoch_ms):,.0f} ms per epoch"))
    summary.append(("recovery worst case: changelog vs rewind+replay",
                    f"{changelog_recovery:,.0f} vs {rewind_recovery:,.0f} ms",
                    f"{n} epochs since the checkpoint"))


def print_state(console: Console, cases: list[StateCase], touch: int,
                summary: list[tuple[str, str, str]]) -> None:
    table = Table(title="checkpoint duration and uploaded bytes versus state size: rolling count "
                        "over N keys, parallelism 2; checkpoint 1 after N rows (the first: "
                        f"full), 2 and 3 after {touch:,} more rows updating {touch:,} keys "
                        "(rocksdb: incremental; memory: full every time)")
    for col in ("keys", "backend", "checkpoint", "run s", "entries in state", "state MB",
                "uploaded MB", "uploaded / state", "files",
                "snapshot ms (slowest subtask)", "checkpoint ms (coordinator)"):
        table.add_column(col, justify="right")
    recovery = Table(title="recovery time versus state size: a run resumed from the checkpoint; "
                           "local = local recovery copies present, remote = after deleting "
                           "<local_dir>/.local-recovery (file:// storage, same disk)")
    for col in ("keys", "backend", "from", "state MB", "restored local/remote",
                "restore ms (slowest subtask)", "first epoch ms", "next epoch ms",
                "run() to first epoch s"):
        recovery.add_column(col, justify="right")
    for case in cases:
        label = (f"{case.keys:,}", case.backend)
        for run, what in (("A", "1: N keys"), ("B", f"2: +{touch:,} updates"),
                          ("C", f"3: +{touch:,} updates")):
            meta = case.checkpoints.get(run)
            outcome = case.runs.get(run)
            if meta is None or outcome is None:
                continue
            handles = [h for op in meta.operators.values() for h in op.subtasks]
            files = sum(len(h["files"]) for h in handles)
            entries = sum(sum(h.get("keys", {}).values()) for h in handles)
            share = meta.uploaded_bytes / meta.state_size if meta.state_size else 0.0
            table.add_row(*label, what, f"{outcome.seconds:.1f}", f"{entries:,}",
                          f"{meta.state_size / MB:,.2f}", f"{meta.uploaded_bytes / MB:,.3f}",
                          f"{share:.1%}", str(files),
                          f"{max(float(h.get('duration_ms', 0)) for h in handles):,.0f}",
                          f"{meta.duration_ms:,.0f}")
        for run, where in (("B", "local"), ("C", "remote")):
            outcome = case.runs.get(run)
            source = case.checkpoints.get("A" if run == "B" else "B")
            if outcome is None or source is None:
                continue
            restored = outcome.restores[0] if outcome.restores else {}
            first = outcome.rec.epochs[0][1] if outcome.rec.epochs else None
            after = outcome.rec.epochs[1][1] if len(outcome.rec.epochs) > 1 else None
            recovery.add_row(
                *label, f"chk {source.checkpoint_id} ({where})",
                f"{source.state_size / MB:,.2f}",
                f"{restored.get('local', 0)}/{restored.get('remote', 0)}",
                f"{float(restored.get('ms', float('nan'))):,.0f}",
                "-" if first is None else f"{first.duration_ms:,.0f}",
                "-" if after is None else f"{after.duration_ms:,.0f}",
                f"{outcome.first_epoch_s:.2f}")
        if case.error:
            table.add_row(*label, "FAILED", case.error, *[""] * 8)
        a, b = case.checkpoints.get("A"), case.checkpoints.get("B")
        if a is not None:
            summary.append((f"checkpoint 1 (full), {case.keys:,} keys, {case.backend}",
                            f"{a.duration_ms:,.0f} ms", f"{a.uploaded_bytes / MB:,.1f} MB"))
        if b is not None:
            summary.append((f"checkpoint 2 (incremental), {case.keys:,} keys, {case.backend}",
                            f"{b.duration_ms:,.0f} ms",
                            f"{b.uploaded_bytes / MB:,.2f} MB of {b.state_size / MB:,.1f} MB"))
        for run, where in (("B", "local"), ("C", "remote")):
            outcome = case.runs.get(run)
            if outcome is not None and outcome.restores:
                summary.append((f"restore, {case.keys:,} keys, {case.backend}, {where}",
                                f"{float(outcome.restores[0]['ms']):,.0f} ms",
                                f"first epoch after {outcome.first_epoch_s:.1f} s"))
    console.print(table)
    console.print(
        "entries in state = the handles' key counts (rocksdb: estimate-num-keys per state). "
        "state MB = bytes of every file the checkpoint references; besides the N counters it "
        "holds each subtask's kept output batches of the last 4 epochs (replay of a retried "
        "task), and for rocksdb MANIFEST/OPTIONS/WAL. uploaded = bytes this checkpoint sent "
        "(rocksdb: new SSTs and the private files; memory: one full snapshot every time). "
        "snapshot ms = the slowest subtask's take_snapshot (local copy + upload); checkpoint "
        "ms = the coordinator's duration (that + completing in the driver). Checkpoint 1 is "
        "the final checkpoint of run A (interval 1h, so the only one).",
        markup=False, highlight=False)
    console.print(recovery)
    console.print(
        "restore ms = the runner's restore_report: the slowest subtask's restore_snapshot "
        "(local: verify the copy's sha256 and hard-link/copy it; remote: download and verify "
        "every file). first epoch ms = that epoch's duration (restore, opening the state "
        f"[memory: unpickling it], {touch // 2:,} rows per subtask, commit); next epoch = the "
        "run's second and last epoch (no data; it takes the final checkpoint), for scale: "
        "both are mostly Spark's per-epoch cost at this load. run() to first "
        "epoch = wall time from JobRunner.run() to the first epoch's end (planning, listing and "
        "reading checkpoints included).", markup=False, highlight=False)


def print_summary(console: Console, summary: list[tuple[str, str, str]],
                  loads: dict[str, str]) -> None:
    table = Table(title="summary")
    for col in ("measure", "value", "detail"):
        table.add_column(col, justify="left" if col != "value" else "right")
    for row in summary:
        table.add_row(*row)
    console.print(table)
    console.print("load average (1/5/15 min): " + "; ".join(f"{k} {v}" for k, v in loads.items())
                  + f"; {os.cpu_count()} cores", markup=False, highlight=False)


if __name__ == "__main__":
    main()
