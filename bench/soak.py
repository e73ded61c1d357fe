"""Soak: one unbounded job for `--minutes`, sampled for growth in memory, files and storage.

    .venv/bin/python -m bench.soak [--minutes 30] [--every 30] [--savepoint-every 180]
        [--rows-per-second 2000] [--keys 10000] [--dir DIR]

The job: a datagen source at a steady `--rows-per-second` (event time = the row's offset in
milliseconds per split, so event time moves at about wall-clock speed), keyed by one of `--keys`
users into 10 s tumbling windows (count, sum), rocksdb state, parallelism 2, a jsonl files sink,
checkpoints every 3 s (`job.checkpoint.interval: 3s`, `retain: 3`). It runs as
`streamer run --json --no-ui` in a subprocess; every `--savepoint-every` seconds a second process
runs `streamer savepoint trigger` (and `savepoint dispose` afterwards, since savepoints never
expire and would otherwise be counted as growth of nothing).

Every `--every` seconds one row: elapsed, epoch, the driver's (python) RSS and open files, the
driver JVM's RSS and open files, the Python workers' total RSS and open files (the JVM's Python
descendants, found through /proc: psutil is not a dependency), the checkpoint storage's size
and file count, `.tmp` files anywhere under storage and sink, and files left under the sink's
`_staging/`. At the end: the growth of each figure from the end of warm-up (the first 20 % of
the samples taken once the job ran its first epoch) to the end, and exit 1 if a bound is
exceeded. Each process kind has its own bound,
as each grows for its own reasons: the driver's Python (`--max-driver-growth-mb`, default 10:
bounded epoch history, nothing per epoch may stay), the driver JVM: its live heap, used heap
right after a full GC that the soak asks for (`jcmd GC.run`; `--max-jvm-live-growth-mb`,
default 50: what a JVM leak grows), and its RSS (`--max-jvm-growth-mb`, default 700: the heap
grows to its maximum, 1 GB by default, before it is collected in full, a plateau, not a leak)
and the Python workers together (`--max-workers-growth-mb`, default 100: rocksdb block cache
and memtables fill up to their limits); open files over all of them more than
`--max-fd-growth`, or checkpoint storage more than `--max-storage-growth-mb` (a tumbling
window over a fixed key set reaches a steady state size; retained checkpoints must not pile
up).

`--tracemalloc` runs the driver under `bench.traced` (a tracemalloc snapshot every `--every`
seconds) and prints the allocation sites of the driver's Python heap that grew most from
the end of warm-up to the end: where a slow growth of the driver comes from. (Tracing slows
the driver and adds to its RSS: measure figures without it.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

STREAMER = [sys.executable, "-m", "streamer.cli.main"]
JOB = "soak"
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024

PIPELINE = """\
name: soak
job:
  parallelism: 2
  max_parallelism: 128
  state: {{backend: rocksdb}}
  checkpoint: {{interval: 3s, retain: 3}}
sources:
  - id: events
    type: datagen
    splits: 2
    rows_per_second: {rate}
    fields:
      user: "concat('u', cast((offset * 7 + split) % {keys} as string))"
      amount: "cast(offset % 10 as double)"
      ts: "timestamp_millis(1767225600000 + offset * {ms_per_row})"
    event_time: ts
    watermark: {{max_out_of_orderness: 2s}}
operators:
  - id: per_window
    uid: soak-per-window-v1
    input: events
    key_by: [user]
    window: {{tumbling: 10s}}
    aggregate:
      n: count()
      total: sum(amount)
sinks:
  - id: out
    type: files
    input: per_window
    path: {out}
    format: jsonl
"""


# ------------------------------------------------------------------------------- /proc
def _proc_children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def _descendants(pid: int, children: dict[int, list[int]]) -> list[int]:
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_KB / 1024
    except (OSError, IndexError, ValueError):
        return 0.0


def _open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _live_heap_mb(pid: int) -> float:
    """The JVM's live heap: its old generation right after a full GC (`jcmd GC.run`, then
    `jstat -gc`), what a leak grows; RSS grows anyway until the heap reaches its maximum. 0
    when the JDK's tools are missing."""
    try:
        subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, timeout=60,
                       check=True)
        out = subprocess.run(["jstat", "-gc", str(pid)], capture_output=True, text=True,
                             timeout=60, check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return 0.0
    fields = dict(zip(out[0].split(), out[1].split(), strict=False))
    # The old generation only: a full GC leaves every live object there, and the young one
    # refills at once with what the running epoch allocates (measured: +-100 MB of noise).
    return float(fields.get("OU", 0)) / 1024


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass
class Sample:
    """One row of the table."""

    elapsed: float
    epoch: int
    driver_mb: float
    driver_fds: int
    jvm_mb: float
    jvm_live_mb: float
    jvm_fds: int
    workers: int
    workers_mb: float
    workers_fds: int
    storage_mb: float
    storage_files: int
    tmp_files: int
    staging_files: int


def _tree_size(root: Path) -> tuple[float, int, int, int]:
    """(MB, files, .tmp files, files under a _staging/ directory) below `root`."""
    size = files = tmp = staging = 0
    for dirpath, _dirs, names in os.walk(root):
        in_staging = "_staging" in Path(dirpath).parts
        for name in names:
            try:
                size += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
            files += 1
            tmp += name.endswith(".tmp")
            staging += in_staging
    return size / 2**20, files, tmp, staging


def sample(started: float, epoch: int, driver: int, storage: Path, out: Path) -> Sample:
    """Measure the job's processes and its storage now."""
    children = _proc_children()
    below = _descendants(driver, children)
    jvms = [p for p in below if _comm(p) == "java"]
    jvm_below = {q for j in jvms for q in _descendants(j, children)}
    workers = [p for p in jvm_below if _comm(p).startswith("python")]
    ckpt_mb, ckpt_files, _, _ = _tree_size(storage / JOB / "checkpoints")
    _, _, out_tmp, staging = _tree_size(out)
    _, _, other_tmp, _ = _tree_size(storage)
    return Sample(
        elapsed=time.monotonic() - started, epoch=epoch,
        driver_mb=_rss_mb(driver), driver_fds=_open_files(driver),
        jvm_mb=sum(_rss_mb(j) for j in jvms), jvm_live_mb=sum(_live_heap_mb(j) for j in jvms),
        jvm_fds=sum(_open_files(j) for j in jvms),
        workers=len(workers), workers_mb=sum(_rss_mb(w) for w in workers),
        workers_fds=sum(_open_files(w) for w in workers),
        storage_mb=ckpt_mb, storage_files=ckpt_files,
        tmp_files=out_tmp + other_tmp, staging_files=staging)


COLUMNS = [("elapsed", "{:>7.0f}"), ("epoch", "{:>6d}"), ("driver_mb", "{:>9.1f}"),
           ("driver_fds", "{:>10d}"), ("jvm_mb", "{:>7.1f}"), ("jvm_live_mb", "{:>11.1f}"),
           ("jvm_fds", "{:>7d}"),
           ("workers", "{:>7d}"), ("workers_mb", "{:>10.1f}"), ("workers_fds", "{:>11d}"),
           ("storage_mb", "{:>10.2f}"), ("storage_files", "{:>13d}"), ("tmp_files", "{:>9d}"),
           ("staging_files", "{:>13d}")]


def header() -> str:
    """The table's header line."""
    return " | ".join(f"{name:>{len(fmt.format(0))}}" for name, fmt in COLUMNS)


def row(s: Sample) -> str:
    """One sample as a table line."""
    return " | ".join(fmt.format(getattr(s, name)) for name, fmt in COLUMNS)


# ------------------------------------------------------------------------------ the run
class Job:
    """`streamer run --json` in a subprocess, its last epoch read from stdout by a thread."""

    def __init__(self, pipeline: Path, storage: Path, log: Path,
                 command: list[str] | None = None) -> None:
        self.epoch = 0
        self.checkpoints = 0
        self.failed_checkpoints = 0
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [*(command or STREAMER), "run", str(pipeline), "--json", "--no-ui", "--storage",
             str(storage)],
            stdout=subprocess.PIPE, stderr=self.log, text=True, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.write(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "epoch":
                self.epoch = int(event.get("epoch", self.epoch))
            elif event.get("event") == "checkpoint":
                if event.get("status") == "completed":
                    self.checkpoints += 1
                else:
                    self.failed_checkpoints += 1

    def stop(self, timeout: float = 120.0) -> int:
        """SIGTERM (a clean stop after a final checkpoint); SIGKILL past `timeout`."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(5)
        self.log.flush()
        return self.proc.returncode


def trigger_savepoint(storage: Path, target: Path) -> str:
    """A savepoint from a second process, then disposed; returns a short outcome."""
    done = subprocess.run(
        [*STREAMER, "savepoint", "trigger", JOB, "--storage", str(storage),
         "--target", str(target), "--timeout", "300"],
        capture_output=True, text=True, timeout=330)
    if done.returncode != 0:
        return f"savepoint failed (exit {done.returncode}): {done.stderr.strip()[-200:]}"
    path = done.stdout.strip().splitlines()[-1].strip()
    subprocess.run([*STREAMER, "savepoint", "dispose", path], capture_output=True, timeout=120)
    return f"savepoint ok: {path}"


def warmed_up(samples: list[Sample]) -> int:
    """The index of the sample that ends warm-up: the first 20 % of the samples taken
    once the job ran its first epoch (on a busy machine Spark's start alone takes minutes)."""
    running = [i for i, s in enumerate(samples) if s.epoch > 0] or list(range(len(samples)))
    return running[max(0, len(running) // 5 - 1)]


def growth(samples: list[Sample], base: int) -> dict[str, float]:
    """Each figure's change from sample `base` to the end."""
    return {name: getattr(samples[-1], name) - getattr(samples[base], name)
            for name, _ in COLUMNS[2:]}


def _print_traces(traces: Path, base: int) -> None:
    """What grew in the driver's Python heap from the end of warm-up (sample `base`; the
    snapshots are taken at the samples' pace) to the last snapshot."""
    from bench.traced import compare, snapshots

    snaps = snapshots(traces)
    if len(snaps) < 2:
        print("# tracemalloc: too few snapshots")
        return
    first = snaps[min(len(snaps) - 2, base)]
    for line in compare(first, snaps[-1]):
        print(f"# tracemalloc: {line}")


def main(argv: list[str] | None = None) -> int:
    """Run the soak; print the table and the growth; exit 1 when a bound is exceeded."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--every", type=float, default=30.0, help="seconds between rows")
    ap.add_argument("--savepoint-every", type=float, default=180.0, help="seconds")
    ap.add_argument("--rows-per-second", type=int, default=2000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp)")
    ap.add_argument("--max-driver-growth-mb", type=float, default=10.0,
                    help="bound on the driver's (python) RSS growth after warm-up")
    ap.add_argument("--max-jvm-growth-mb", type=float, default=700.0,
                    help="bound on the driver JVM's RSS growth after warm-up (its heap "
                    "grows to -Xmx, 1 GB by default, before it is collected in full)")
    ap.add_argument("--max-jvm-live-growth-mb", type=float, default=50.0,
                    help="bound on the driver JVM's live heap (after a full GC) growth")
    ap.add_argument("--max-workers-growth-mb", type=float, default=100.0,
                    help="bound on the Python workers' total RSS growth after warm-up")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="trace the driver's Python heap (bench.traced) and print what grew")
    ap.add_argument("--max-fd-growth", type=int, default=50,
                    help="bound on driver + JVM + workers open files growth after warm-up")
    ap.add_argument("--max-storage-growth-mb", type=float, default=20.0,
                    help="bound on checkpoint storage growth after warm-up")
    args = ap.parse_args(argv)

    work = args.dir or Path(tempfile.mkdtemp(prefix="streamer-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    storage, out, target = work / "storage", work / "out", work / "savepoints"
    ms_per_row = max(1, round(1000 * 2 / args.rows_per_second))  # 2 splits
    pipeline = work / "soak.yaml"
    pipeline.write_text(PIPELINE.format(rate=args.rows_per_second, keys=args.keys,
                                        ms_per_row=ms_per_row, out=out))
    print(f"# soak: {args.minutes} min, {args.rows_per_second} rows/s, {args.keys} keys, "
          f"work dir {work}, load {os.getloadavg()[0]:.1f} at start, {os.cpu_count()} cpus",
          flush=True)
    started = time.monotonic()
    traces = work / "tracemalloc"
    command = ([sys.executable, "-m", "bench.traced", str(traces), str(args.every)]
               if args.tracemalloc else None)
    job = Job(pipeline, storage, work / "job.log", command)
    samples: list[Sample] = []
    events: list[str] = []
    next_sample = started + args.every
    next_savepoint = started + args.savepoint_every
    deadline = started + args.minutes * 60
    print(header(), flush=True)
    sp_thread: threading.Thread | None = None
    try:
        while time.monotonic() < deadline and job.proc.poll() is None:
            now = time.monotonic()
            if now >= next_savepoint and (sp_thread is None or not sp_thread.is_alive()):
                def _sp() -> None:
                    events.append(f"{time.monotonic() - started:.0f}s "
                                  f"{trigger_savepoint(storage, target)}")
                sp_thread = threading.Thread(target=_sp, daemon=True)
                sp_thread.start()
                next_savepoint = now + args.savepoint_every
            if now >= next_sample:
                s = sample(started, job.epoch, job.proc.pid, storage, out)
                samples.append(s)
                print(row(s), f"load {os.getloadavg()[0]:.1f}", flush=True)
                next_sample += args.every
            time.sleep(0.5)
    finally:
        code = job.stop()
    print(f"# job exit {code}; epochs {job.epoch}; checkpoints {job.checkpoints} completed, "
          f"{job.failed_checkpoints} failed; load {os.getloadavg()[0]:.1f} at end", flush=True)
    for event in events:
        print(f"# {event}")
    final = _tree_size(out)
    print(f"# after stop: .tmp {final[2]}, _staging files {final[3]}, sink files {final[1]}")
    if len(samples) < 2:
        print("# too few samples for growth", file=sys.stderr)
        return 1
    base = warmed_up(samples)
    g = growth(samples, base)
    print(f"# growth after warm-up (from {samples[base].elapsed:.0f} s): "
          + ", ".join(f"{k} {v:+.1f}" for k, v in g.items()))
    # a plateau (a JVM heap filling up to -Xmx) grows early; a leak grows in both halves
    late = growth(samples, (base + len(samples) - 1) // 2)
    print("# growth over the last half: " + ", ".join(f"{k} {v:+.1f}" for k, v in late.items()))
    if args.tracemalloc:
        _print_traces(traces, base)
    fds = g["driver_fds"] + g["jvm_fds"] + g["workers_fds"]
    failures = []
    for name, what, bound in (("driver_mb", "the driver's RSS", args.max_driver_growth_mb),
                              ("jvm_live_mb", "the driver JVM's live heap",
                               args.max_jvm_live_growth_mb),
                              ("jvm_mb", "the driver JVM's RSS", args.max_jvm_growth_mb),
                              ("workers_mb", "the Python workers' RSS",
                               args.max_workers_growth_mb)):
        print(f"# {what}: grew {g[name]:+.1f} MB after warm-up (bound {bound:g} MB), "
              f"{late[name]:+.1f} MB over the last half")
        if g[name] > bound:
            failures.append(f"{what} grew {g[name]:.1f} MB > {bound:g} MB")
    if fds > args.max_fd_growth:
        failures.append(f"open files grew {fds} > {args.max_fd_growth}")
    if g["storage_mb"] > args.max_storage_growth_mb:
        failures.append(f"checkpoint storage grew {g['storage_mb']:.1f} MB "
                        f"> {args.max_storage_growth_mb} MB")
    if code not in (0, None):
        failures.append(f"job exited {code}; see {work / 'job.log'}")
    for failure in failures:
        print(f"# FAIL: {failure}")
    if not failures:
        print("# OK: every figure within its bound")
    if args.dir is None and not failures:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
