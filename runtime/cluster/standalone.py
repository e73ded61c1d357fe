"""A Spark standalone cluster on 127.0.0.1, started from the Spark distribution that ships
inside pyspark (`bin/spark-class`): one master and N workers, each worker its own process
session so that one can be killed with its executor and Python workers as a crashed machine
would be. The tests and `bench/cluster.py` use it; docs/operations/clusters.md shows the same
commands.

    with StandaloneCluster(workers=2, root=tmp) as cluster:
        cluster.master_url   # spark://127.0.0.1:<port>
        cluster.kill_worker(0)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from streamer.exceptions import StreamerError
from streamer.runtime.cluster.proc_table import process_table


class ClusterStartError(StreamerError):
    """The standalone master or a worker did not come up; the message names its log file."""


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package."""
    import pyspark

    return Path(pyspark.__file__).parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def session_members(sid: int) -> list[int]:
    """The live (not zombie) processes of session `sid` (a worker, its executor JVM, the
    PySpark daemon and its Python workers)."""
    return [pid for pid, fields in process_table().items()
            if len(fields) > 3 and int(fields[3]) == sid and fields[0] != b"Z"]


def kill_session(sid: int, sig: int = signal.SIGKILL, timeout: float = 30.0) -> None:
    """Send `sig` to every process of session `sid` until none is left."""
    deadline = time.monotonic() + timeout
    while members := session_members(sid):
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if time.monotonic() > deadline:
            if sig != signal.SIGKILL:
                sig = signal.SIGKILL
                deadline = time.monotonic() + timeout
                continue
            return
        time.sleep(0.05)


@dataclass
class StandaloneCluster:
    """A master and `workers` workers on 127.0.0.1 (`cores` and `memory` each), logs and
    work directories under `root`. Stopped (every process killed) on exit, even on errors."""

    root: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    #: Heap and JVM options of the master and worker daemons (small: they only coordinate).
    daemon_memory: str = "256m"
    daemon_opts: str = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    port: int = 0
    webui_port: int = 0
    #: Seconds without a heartbeat after which the master declares a worker dead (Spark's
    #: default; a killed worker is noticed at once, by its closed connection).
    worker_timeout: int = 60
    worker_ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    worker_procs: list[subprocess.Popen[bytes] | None] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        """The URL to give `--master`."""
        return f"spark://127.0.0.1:{self.port}"

    @property
    def json_url(self) -> str:
        """The master's state as JSON (workers, applications)."""
        return f"http://127.0.0.1:{self.webui_port}/json/"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_LOG_DIR=str(self.root / "logs"),
                   SPARK_DAEMON_MEMORY=self.daemon_memory,
                   SPARK_DAEMON_JAVA_OPTS=self.daemon_opts,
                   SPARK_MASTER_OPTS=f"-Dspark.worker.timeout={self.worker_timeout}",
                   SPARK_WORKER_DIR=str(self.root / "work"),
                   PYSPARK_PYTHON=sys.executable)
        for name in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET"):
            env.pop(name, None)
        return env

    def _spawn(self, log: Path, *args: str) -> subprocess.Popen[bytes]:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args],
                                    stdout=out, stderr=subprocess.STDOUT, env=self._env(),
                                    start_new_session=True, cwd=self.root)
        self.procs.append(proc)
        return proc

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        """Start the master, then the workers; return once all are registered ALIVE."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.webui_port = self.webui_port or free_port()
        self._spawn(self.root / "logs" / "master.out", "org.apache.spark.deploy.master.Master",
                    "--host", "127.0.0.1", "--port", str(self.port),
                    "--webui-port", str(self.webui_port))
        self._wait(lambda s: s is not None, timeout, "the master", "master.out")
        for i in range(self.workers):
            self.worker_ports.append(free_port())
            self.worker_procs.append(self._start_worker(i))
        self._wait(lambda s: s is not None and self.alive_workers(s) >= self.workers,
                   timeout, f"{self.workers} workers", "worker-0.out")
        return self

    def _start_worker(self, i: int) -> subprocess.Popen[bytes]:
        work = self.root / f"worker-{i}"
        work.mkdir(parents=True, exist_ok=True)
        return self._spawn(self.root / "logs" / f"worker-{i}.out",
                           "org.apache.spark.deploy.worker.Worker", self.master_url,
                           "--cores", str(self.cores), "--memory", self.memory,
                           "--work-dir", str(work), "--host", "127.0.0.1",
                           "--port", str(self.worker_ports[i]), "--webui-port", "0")

    def state(self) -> dict[str, Any] | None:
        """The master's JSON state, or None while it does not answer."""
        try:
            with urllib.request.urlopen(self.json_url, timeout=5) as resp:
                data: dict[str, Any] = json.load(resp)
                return data
        except (OSError, ValueError):
            return None

    @staticmethod
    def alive_workers(state: dict[str, Any]) -> int:
        """How many workers the master has registered as ALIVE."""
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def _wait(self, ready: Any, timeout: float, what: str, log: str) -> None:
        deadline = time.monotonic() + timeout
        why = f"not up after {timeout:.0f}s"
        while time.monotonic() < deadline:
            if ready(self.state()):
                return
            if any(p.poll() is not None for p in self.procs):
                why = "a daemon exited"
                break
            time.sleep(0.3)
        self.stop()
        msg = (f"the Spark standalone cluster did not start: {what} {why}; see "
               f"{self.root / 'logs' / log}")
        raise ClusterStartError(msg)

    def executors(self) -> list[dict[str, Any]]:
        """The executors of running applications, as the master lists them."""
        state = self.state() or {}
        return [e for app in state.get("activeapps", []) for e in app.get("executors", [])]

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker `i` with everything it started (executor JVM, Python workers)."""
        proc = self.worker_procs[i]
        if proc is None:
            return
        kill_session(proc.pid)
        proc.wait()
        self.worker_procs[i] = None
        self.procs.remove(proc)

    def restart_worker(self, i: int, timeout: float = 90.0) -> None:
        """Start worker `i` again (after `kill_worker`) and wait until every worker is up."""
        before = {w["id"] for w in (self.state() or {}).get("workers", [])}
        if self.worker_procs[i] is None:
            self.worker_procs[i] = self._start_worker(i)

        def registered(state: dict[str, Any] | None) -> bool:
            return state is not None and any(
                w.get("state") == "ALIVE" and w["id"] not in before
                and w.get("port") == self.worker_ports[i] for w in state.get("workers", []))

        self._wait(registered, timeout, f"worker {i}", f"worker-{i}.out")

    def stop(self) -> None:
        """Stop every process of the cluster (TERM, then KILL)."""
        for proc in reversed(self.procs):
            kill_session(proc.pid, signal.SIGTERM, timeout=10)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.procs = []
        self.worker_procs = []

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
