"""`streamer run` as a real process, for the crash and storage-fault tests: its `--json`
events read line by line as they come, a SIGKILL of every process of the run at once (the
driver, its Spark JVM and the Python workers, as a machine crash would; on a warm JVM,
`warm_jvm.py`, the driver and the JVM's Python workers), and the committed rows of a files
sink.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamer.runtime.cluster.standalone import session_members

#: The `streamer` command of the interpreter running the tests (the project's venv).
STREAMER = Path(sys.executable).with_name("streamer")
#: Variables of the test process a run must not inherit (each test sets its own).
SCRUBBED = ("STREAMER_TEST_FAULTS", "STREAMER_TEST_FAILPOINTS", "STREAMER_TEST_DRIVER_PID")


def quick_jvm() -> str:
    """A pipeline's `spark:` block that makes the driver JVM of a small job start and run
    about twice as fast on a small, busy machine: only the C1 JIT and the serial GC, so no
    compiler or GC threads compete for the cores (measured on 2 cores at load 17: two epochs
    49 s -> 24 s). It changes how fast the job runs, not what it does."""
    from streamer.runtime.cluster.spark import DEFAULT_CONF

    key = "spark.driver.extraJavaOptions"
    options = f"{DEFAULT_CONF[key]} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    return f"spark:\n  {key}: {json.dumps(options)}\n"


def spark_scratch(stderr_file: Path) -> Path:
    """A new Spark scratch directory for the run whose stderr goes to `stderr_file`, next to
    it (`SPARK_LOCAL_DIRS`: the driver's `spark-*` directory, with its `userFiles`, block
    manager and PySpark files). A killed JVM never removes its own, which under /tmp piles up
    (with the S3A jars, about 660 MB a run); `run_streamer` removes it when the run ends."""
    return Path(tempfile.mkdtemp(prefix=f"{stderr_file.stem}.spark-local-",
                                 dir=stderr_file.parent))


@dataclass
class Run:
    """How one `streamer run` process ended, and what it printed."""

    returncode: int
    events: list[dict[str, Any]]
    stderr: str
    seconds: float
    #: Whether the test crashed it (rather than a fail point or the job itself ending it).
    crashed_by_test: bool = False

    @property
    def killed(self) -> bool:
        """Whether the run died of SIGKILL (a fail point or the test)."""
        return self.returncode == -signal.SIGKILL

    @property
    def finished(self) -> dict[str, Any] | None:
        """The `finished` event, if the run printed one."""
        return next((e for e in reversed(self.events) if e.get("event") == "finished"), None)

    def checkpoints(self, status: str | None = None) -> list[dict[str, Any]]:
        """The `checkpoint` events (with the given status)."""
        return [e for e in self.events if e.get("event") == "checkpoint"
                and (status is None or e.get("status") == status)]

    def messages(self) -> list[str]:
        """The texts of the `message` events."""
        return [e["text"] for e in self.events if e.get("event") == "message"]

    def describe(self) -> str:
        """The exit and the end of stderr, for assertion messages."""
        tail = "\n".join(self.stderr.strip().splitlines()[-15:])
        return f"exit {self.returncode} after {self.seconds:.1f}s; stderr ends:\n{tail}"


def crash(sid: int, timeout: float = 60.0) -> None:
    """SIGKILL every process of session `sid` and wait until none is left. (The PySpark
    daemon puts its workers in a process group of their own, so a process group is not
    enough; the session is.)"""
    deadline = time.monotonic() + timeout
    while members := session_members(sid):
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            msg = f"processes {members} of a crashed run are still alive after {timeout}s"
            raise AssertionError(msg)
        time.sleep(0.02)


#: Sees each event of a run (None when none came for a moment) with the seconds since the
#: run started, and says whether to crash the run now.
Watch = Callable[[dict[str, Any] | None, float], bool]


def run_streamer(pipeline: Path, *args: str, env: Mapping[str, str] | None = None,
                 watch: Watch | None = None, timeout: float = 300.0,
                 stderr_file: Path | None = None, driver: Sequence[str] = (str(STREAMER),),
                 also_crash: Callable[[], None] | None = None) -> Run:
    """Run `streamer run <pipeline> --json --no-ui <args>` in a session of its own and
    return how it ended. Whenever it ends, or `watch` says so, every process of its session
    is killed, so no Spark task of a dead run outlives it, and then `also_crash` is called
    (a warm JVM's run: the JVM's Python workers, or the JVM). Its stderr and events are kept
    in `stderr_file` and the `.jsonl` file next to it. `driver` is the `streamer` command
    (`warm_jvm.WarmJvm.driver` attaches the run to a warm JVM)."""
    environment = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    environment.update(env or {})
    err_path = stderr_file or pipeline.with_suffix(".stderr")
    scratch = spark_scratch(err_path)
    environment.setdefault("SPARK_LOCAL_DIRS", str(scratch))  # (one of its own per run)
    started = time.monotonic()
    crashed = False
    events: list[dict[str, Any]] = []

    def crash_run(sid: int) -> None:
        crash(sid)
        if also_crash is not None:
            also_crash()

    lines: queue.Queue[str | None] = queue.Queue()
    with open(err_path, "w+", encoding="utf-8") as err:
        proc = subprocess.Popen(
            [*driver, "run", str(pipeline), "--json", "--no-ui", *args],
            stdout=subprocess.PIPE, stderr=err, text=True, cwd=pipeline.parent,
            env=environment, start_new_session=True)
        assert proc.stdout is not None
        stdout = proc.stdout

        def read() -> None:
            for line in stdout:
                lines.put(line)
            lines.put(None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            while True:
                try:
                    line = lines.get(timeout=0.02)
                except queue.Empty:
                    line = ""
                if line is None:
                    break
                event = None
                if line.strip():
                    try:
                        event = json.loads(line)
                    except ValueError:
                        event = {"event": "text", "text": line.rstrip("\n")}
                    events.append(event)
                elapsed = time.monotonic() - started
                if not crashed and watch is not None and proc.poll() is None \
                        and watch(event, elapsed):
                    crashed = True
                    crash_run(proc.pid)
                if proc.poll() is not None:  # the driver is gone: so is the rest
                    crash_run(proc.pid)
                if elapsed > timeout:
                    crash_run(proc.pid)
                    msg = f"`streamer run {pipeline.name}` ran over {timeout:.0f}s"
                    raise AssertionError(msg)
        finally:
            crash_run(proc.pid)
            proc.wait()
            reader.join(timeout=30)
            shutil.rmtree(scratch, ignore_errors=True)
        err.seek(0)
        stderr = err.read()
    err_path.with_suffix(".jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return Run(proc.returncode, events, stderr, time.monotonic() - started, crashed)


@dataclass
class FilesOutput:
    """The jsonl (or parquet) output directory of a files sink."""

    path: Path
    extension: str = "jsonl"

    def committed(self) -> Counter[str]:
        """The committed rows (every `part-*.<extension>` directly under the path) as a
        multiset of canonical JSON lines (parquet values as JSON gives them, timestamps as
        ISO text)."""
        rows: Counter[str] = Counter()
        for part in sorted(self.path.glob(f"part-*.{self.extension}")):
            if self.extension == "parquet":
                import pyarrow.parquet as pq

                for row in pq.read_table(part).to_pylist():
                    rows[json.dumps(row, sort_keys=True, default=str)] += 1
                continue
            for line in part.read_text().splitlines():
                if line.strip():
                    rows[json.dumps(json.loads(line), sort_keys=True)] += 1
        return rows

    def leftovers(self) -> list[str]:
        """Files under the path that are not committed output: anything staged, temporary
        or hidden (Spark's `.crc` and `_SUCCESS` markers included)."""
        return sorted(str(p.relative_to(self.path)) for p in self.path.rglob("*")
                      if p.is_file() and not (p.parent == self.path
                                              and p.name.startswith("part-")
                                              and p.name.endswith(f".{self.extension}")))


def next_checkpoint(checkpoints: Path) -> int:
    """The id a job's next checkpoint gets: one past every `chk-<n>` under the job's
    `checkpoints` directory, complete or not (as `CheckpointStore.next_id`)."""
    return max((int(p.name.removeprefix("chk-")) for p in checkpoints.glob("chk-*")),
               default=0) + 1


def diff(got: Counter[str], want: Counter[str], limit: int = 10) -> str:
    """What `got` lacks and has too much of, compared with `want` (for assertion messages)."""
    missing, extra = want - got, got - want
    parts = [f"{sum(got.values())} rows committed, {sum(want.values())} expected; "
             f"{sum(missing.values())} missing, {sum(extra.values())} extra"]
    parts += [f"  - missing x{n}: {row}" for row, n in list(missing.items())[:limit]]
    parts += [f"  + extra   x{n}: {row}" for row, n in list(extra.items())[:limit]]
    return "\n".join(parts)
