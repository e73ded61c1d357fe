"""One warm Spark driver JVM for the laps of a crash campaign (issue 38).

Every `streamer run` of a crash campaign used to start a JVM of its own: about 6.5 s to a
SparkSession and 9 s to the first finished job on 2 cores, before the run did anything. A
`WarmJvm` is PySpark's gateway JVM (`spark-submit pyspark-shell`, launched the way
`pyspark.java_gateway.launch_gateway` does, with the runs' driver options), started once and
handed to each run's driver through `PYSPARK_GATEWAY_PORT` and `PYSPARK_GATEWAY_SECRET`, the
variables PySpark attaches to an existing gateway with (as under spark-submit).

A run's driver is `warm_driver.py`, which settles the JVM before it runs the CLI: a killed
driver leaves its SparkContext active in the JVM, with its tasks running. The driver dies
with its session as before (`streamer_process.crash`); the JVM's Python workers are killed
with it at once (`kill_workers`); the next driver cancels and stops what is left and waits
until no task, no connection of the dead driver and no Python worker is left before the run
goes on (`warm_driver.settle`). `crash` kills the JVM too: a kill that models a machine crash.

A job whose connectors need jars at JVM start (S3A's `hadoop-aws` and the AWS SDK on
`spark.jars.packages`, as `runtime/cluster/submit.submit_conf` says for spark-submit) gets a
JVM started with them: `configure` reads the settings of the lap's pipeline file that only
apply at JVM start (`start_conf`) and passes them to spark-submit, which resolves the
packages (from Spark's Ivy cache) and puts the jars on the driver's class path, as a run's
own JVM start does; a lap whose settings differ starts a new JVM.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from pyspark.serializers import UTF8Deserializer, read_int
from streamer_process import SCRUBBED, Run, crash, run_streamer

from streamer.runtime.cluster.jvm_archive import mapped_options
from streamer.runtime.cluster.spark import DEFAULT_CONF, check_java, ui_bind_address
from streamer.runtime.cluster.standalone import session_members, spark_home

#: The driver of a run on a warm JVM: settles the JVM, then runs the `streamer` CLI.
DRIVER = Path(__file__).with_name("warm_driver.py")
#: The JVM options of the runs' drivers (`streamer_process.quick_jvm`), which only apply at
#: JVM start; the runs' pipelines set them too, where they have no effect on a warm JVM.
JAVA_OPTIONS = (f"{DEFAULT_CONF['spark.driver.extraJavaOptions']} "
                "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
START_TIMEOUT_S = 120.0
#: The settings that only apply when the driver's JVM starts: spark-submit's, not a
#: SparkContext's (a run on a warm JVM sets them too, with no effect).
START_KEYS = ("spark.jars", "spark.jars.packages", "spark.jars.excludes", "spark.jars.ivy",
              "spark.jars.ivySettings", "spark.jars.repositories",
              "spark.driver.extraJavaOptions", "spark.driver.extraClassPath",
              "spark.driver.extraLibraryPath", "spark.driver.memory")


def start_conf(pipeline: Path) -> dict[str, str]:
    """The settings of the pipeline file `pipeline` (its `spark:` block and what its
    connectors add at the session's start) that only apply at JVM start (`START_KEYS`)."""
    from streamer.pipeline.validate import load_pipeline
    from streamer.runtime.cluster.submit import submit_conf

    conf = submit_conf(load_pipeline(str(pipeline)))
    return {key: value for key, value in conf.items() if key in START_KEYS}


class WarmJvm:
    """A gateway JVM in a session of its own under `root` (its log, its Spark scratch
    directory and working directory), started on first use and again after a `crash`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None
        self.port, self.secret = 0, ""
        self.starts = 0
        #: How long its last start took (to the gateway's port).
        self.start_seconds = 0.0
        #: How many Python processes `kill_workers` killed (for the campaign's log).
        self.workers_killed = 0
        self._log: IO[bytes] | None = None
        self._scratch: Path | None = None
        #: The JVM-start settings of the runs it serves (`configure`).
        self.conf: dict[str, str] = {}

    def configure(self, pipeline: Path) -> None:
        """Serve runs of the pipeline file `pipeline`: a JVM started with other JVM-start
        settings than its (`start_conf`) is closed, and the next `env` starts one with them."""
        conf = start_conf(pipeline)
        if conf != self.conf:
            self.close()
            self.conf = conf

    def start(self) -> None:
        """Launch the JVM (if it is not running) and read its gateway's port and secret."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self.close()
        self.starts += 1
        began = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        scratch = self._scratch = Path(tempfile.mkdtemp(prefix="spark-local-", dir=self.root))
        info_dir = Path(tempfile.mkdtemp(prefix="gateway-", dir=self.root))
        info = info_dir / "info"
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
        env.update({"SPARK_HOME": str(spark_home()), "SPARK_CONNECT_MODE": "0",
                    "_PYSPARK_DRIVER_CONN_INFO_PATH": str(info), "SPARK_LOCAL_DIRS": str(scratch),
                    "PYSPARK_PYTHON": sys.executable})
        local_ip = ui_bind_address(DEFAULT_CONF)
        if local_ip:
            env["SPARK_LOCAL_IP"] = local_ip
        conf = {"spark.driver.extraJavaOptions": JAVA_OPTIONS, **self.conf}
        # Spark's classes from the driver's class archive, as a run's own JVM start maps it
        # (runtime/cluster/jvm_archive.py); a warm JVM never records one (it is killed).
        conf["spark.driver.extraJavaOptions"] += " " + mapped_options(check_java(),
                                                                     str(spark_home()))
        command = [str(spark_home() / "bin" / "spark-submit"),
                   *(arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")),
                   "pyspark-shell"]
        self._log = open(self.root / f"warm-jvm-{self.starts}.log", "ab")  # noqa: SIM115
        # stdin stays a pipe from the test process: the JVM ends when the tests do.
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=self._log,
                                     stderr=self._log, env=env, cwd=self.root,
                                     start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not info.is_file():  # (the JVM writes it elsewhere, then renames it)
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                msg = f"the warm JVM did not start; see {self.root}/warm-jvm-{self.starts}.log"
                raise AssertionError(msg)
            time.sleep(0.05)
        with open(info, "rb") as fh:
            self.port = read_int(fh)
            self.secret = UTF8Deserializer().loads(fh)
        info.unlink()
        info_dir.rmdir()
        self.start_seconds = time.monotonic() - began

    @property
    def driver(self) -> tuple[str, str]:
        """The command of a run's driver on this JVM (in place of `streamer`)."""
        return (sys.executable, str(DRIVER))

    def env(self) -> dict[str, str]:
        """The variables a run's driver attaches to this JVM with (started if need be)."""
        self.start()
        return {"PYSPARK_GATEWAY_PORT": str(self.port), "PYSPARK_GATEWAY_SECRET": self.secret,
                "PYSPARK_PYTHON": sys.executable}

    @property
    def sid(self) -> int | None:
        """The JVM's session (it leads it), None when it is not running."""
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def kill_workers(self) -> None:
        """SIGKILL the JVM's Python processes (the PySpark daemon and its workers), as the
        crash of a run's driver kills them when the run has a JVM of its own; the next
        driver's `settle` stops what the dead driver left running in the JVM."""
        if self.proc is None:
            return
        for pid in session_members(self.proc.pid):
            if pid != self.proc.pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    self.workers_killed += 1

    def crash(self) -> None:
        """SIGKILL the JVM and every process of its session (a machine crash); the next
        `env` starts a new one."""
        if self.proc is not None:
            crash(self.proc.pid)
        self.close()

    def close(self) -> None:
        """Kill the JVM's session, if it runs, remove its Spark scratch directory (a killed
        JVM leaves its block manager's and its contexts' files there) and forget it."""
        if self.proc is not None:
            crash(self.proc.pid)
            self.proc.wait()
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


#: The session settings of a run on a warm JVM that its driver sets in the JVM before its
#: SparkContext starts (`warm_driver.settle`): JSON, from `own_jvm_conf`.
CONF_ENV = "STREAMER_TEST_WARM_CONF"


def own_jvm_conf(pipeline: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The master (and a continuous job's default parallelism) a run of `pipeline` would
    give its SparkContext on a JVM of its own: `local[*]`, or for a continuous job a slot
    for each of its subtasks (`gang_slots`). On a warm JVM, as under spark-submit, the
    driver takes them from the JVM instead (`spark.master` of its start, `local[*]`)."""
    from streamer.pipeline.validate import load_pipeline
    from streamer.runtime.cluster.spark import gang_slots

    spec = load_pipeline(str(pipeline))
    if spec.job.execution.with_overrides({**os.environ, **env}).mode != "continuous":
        return {"spark.master": "local[*]"}
    master, conf = gang_slots(None, spec.job.parallelism, spec.spark)
    return {"spark.master": str(master),
            "spark.default.parallelism": conf["spark.default.parallelism"]}


def run_warm(jvm: WarmJvm, pipeline: Path, *args: str, env: dict[str, str] | None = None,
             machine_crash: bool = False, **options: Any) -> Run:
    """`run_streamer(pipeline, *args, ...)` on `jvm` (started, or started anew when the
    pipeline's JVM-start settings differ from its last run's: `configure`), with the master
    a run on its own JVM would have (`own_jvm_conf`). When the run ends or is killed, the
    JVM's Python workers die with it (as they do with a JVM of the run's own), and with
    `machine_crash` the JVM too."""
    jvm.configure(pipeline)
    environment = {**(env or {}), **jvm.env(),
                   CONF_ENV: json.dumps(own_jvm_conf(pipeline, env or {}))}
    return run_streamer(pipeline, *args, env=environment, driver=jvm.driver,
                        also_crash=jvm.crash if machine_crash else jvm.kill_workers, **options)
