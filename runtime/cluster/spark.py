"""Starting Spark: a Java check and a standalone-master check with readable errors, and a quiet,
loopback-only session.

pyspark is imported inside the functions so that `streamer --help` stays instant.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from streamer.runtime.cluster.jvm_archive import driver_options, executor_options, save_at_exit
from streamer.runtime.cluster.standalone import spark_home
from streamer.runtime.exceptions import JavaNotFoundError, SparkStartError

if TYPE_CHECKING:
    from py4j.java_gateway import JavaGateway
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

MIN_JAVA = 17
_LOG4J = Path(__file__).with_name("log4j2.properties")

#: Defaults streamer sets unless the pipeline's `spark:` block or the caller overrides them.
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # The driver listens on loopback only (its RPC and block manager, and the UI: see
    # `ui_bind_address`); a `spark:` block or `--conf` that sets another address opts in.
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    # No "kill" links in the UI: whoever reaches it could otherwise cancel the job's stages.
    "spark.ui.killEnabled": "false",
    # Size shuffles to the job, not to Spark's batch default of 200 (docs/architecture.md,
    # "Spark's workers and streamer's state").
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.adaptive.enabled": "true",
    # Adaptive execution would replace a stage whose input turns out empty (e.g. a filter
    # dropped every record) and with it the source's observe node, whose per-split event
    # times the watermark needs even when no record reaches a keyed operator.
    "spark.sql.adaptive.optimizer.excludedRules":
        "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation",
    # Constraint propagation infers the constraints of every operator of a plan to prune and
    # add filters; its cost grows with the aliased expressions of a projection, and an
    # epoch's plan (sources with event-time columns, key groups, join sides) has many. It
    # took a regular join's epoch of six records 10.9 s of planning, against 1.5 s without
    # (nexmark q3's `tests:` case, `local[2]`), on every epoch. No result depends on it;
    # Spark's docs name this cost. A `spark:` block may turn it on again.
    "spark.sql.constraintPropagation.enabled": "false",
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{_LOG4J}",
    "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{_LOG4J}",
}


#: What a session that only analyzes changes (`runtime.checks.analysis_session`): it runs no
#: shuffle worth splitting and needs no Hive catalog.
ANALYSIS_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.catalogImplementation": "in-memory",
}
#: Its driver JVM's flags: the C1 compiler only (analysis is seconds of cold code, where
#: C2's compile time never pays back) and the serial GC (no GC threads to start on a small
#: heap); it maps the drivers' class archive as every driver does (`jvm_archive`).
#: bench/validate.py measures the gain.
ANALYSIS_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def java_version(java: str) -> int | None:
    """The major version of the `java` executable, or None when it cannot be run."""
    try:
        # A session of its own: a SIGTERM to streamer's process group (docker stop, systemd)
        # during start-up is streamer's to handle, not a reason to call Java broken.
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30,
                             start_new_session=True)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def check_java() -> str:
    """Find Java 17+ as Spark will (JAVA_HOME first, then PATH), or raise a clear error."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    where = f"JAVA_HOME={home}" if home else "PATH"
    fix = ("install Java 17 or newer (e.g. `apt-get install openjdk-17-jre-headless` or "
           "`brew install openjdk@17`) and make it the `java` on PATH, or set JAVA_HOME to it")
    if not java or not Path(java).exists():
        msg = (
            f"Spark needs Java {MIN_JAVA}+, but no `java` was found on "
                                f"{where}; {fix}"
        )
        raise JavaNotFoundError(msg)
    version = java_version(java)
    if version is None:
        msg = f"Spark needs Java {MIN_JAVA}+, but {java} does not run; {fix}"
        raise JavaNotFoundError(msg)
    if version < MIN_JAVA:
        msg = (
            f"Spark needs Java {MIN_JAVA}+, but {java} is Java {version}; "
                                f"{fix}"
        )
        raise JavaNotFoundError(msg)
    return java


def check_master(master: str, timeout: float = 5.0) -> None:
    """For a standalone master (`spark://h1:p1[,h2:p2]`): that one of its hosts accepts a
    connection, so a wrong URL is one clear line instead of a minute of retries and a JVM
    stack trace."""
    import socket

    from streamer.runtime.exceptions import MasterUnreachableError

    if not master.startswith("spark://"):
        return
    problems = []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                return
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            problems.append(f"{address}: {why}")
    msg = (f"cannot reach the Spark master {master} ({'; '.join(problems)}); start the "
           "cluster, or check --master")
    raise MasterUnreachableError(msg)


def quiet_python_loggers() -> None:
    """Silence PySpark's Python-side loggers, which print JSON error records to stderr for
    errors that streamer reports itself.
    """
    for name in ("py4j", "pyspark", "SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def gang_slots(master: str | None, parallelism: int | None, conf: Mapping[str, str]
               ) -> tuple[str | None, dict[str, str]]:
    """The master and conf of a continuous job's session: in local mode, a task slot for
    each of its source and keyed subtasks (a barrier stage is scheduled only whole: Spark
    refuses one with more tasks than slots), while the keyed operators keep the
    parallelism they would have (`spark.default.parallelism`: the cores, or the job's).
    Under spark-submit, or on a cluster, the slots are the cluster's."""
    out = dict(conf)
    # A gang restarted after a lost executor waits for its slots: Spark re-checks them every
    # `interval` (15 s by default), up to `maxFailures` times; check each second, for 3 min.
    out.setdefault("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
    out.setdefault("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "180")
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # spark-submit's master and slots, as given
        return master, out
    if master is not None and not master.startswith("local"):
        return master, out
    inside = (master or "local[*]").removeprefix("local").strip("[]").split(",")[0]
    cores = (os.cpu_count() or 1) if inside in ("", "*") else int(inside)
    keyed = parallelism or int(out.get("spark.default.parallelism", cores))
    out.setdefault("spark.default.parallelism", str(keyed))
    return f"local[{max(cores, 2 * keyed)}]", out


def task_slots(spark: SparkSession) -> int:
    """How many tasks the session's executors run at once now: what Spark holds a barrier
    stage's task count against."""
    sc = spark.sparkContext._jsc.sc()
    return int(sc.maxNumConcurrentTasks(sc.resourceProfileManager().defaultResourceProfile()))


def create_session(app_name: str = "streamer", master: str | None = None,
                   conf: Mapping[str, str] | None = None,
                   ui: bool = True) -> SparkSession:
    """Start (or reuse) the SparkSession; `master` defaults to `local[*]`, the embedded mode.

    When the process was launched by spark-submit the master comes from there.
    """
    java = check_java()
    quiet_python_loggers()
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if master and not submitted:
        check_master(master)
    settings = dict(DEFAULT_CONF)
    if not submitted:
        # Python workers must run this interpreter (the one streamer is installed in), not
        # whatever `python3` is first on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        settings["spark.pyspark.python"] = os.environ["PYSPARK_PYTHON"]
    if not ui:
        settings["spark.ui.enabled"] = "false"
    settings.update(merged_conf(settings, conf or {}))
    home = os.environ.get("SPARK_HOME") or str(spark_home())  # (the one PySpark launches)
    key = "spark.executor.extraJavaOptions"
    sharing = executor_options(master or "", java, home, settings.get(key, ""))
    if sharing:
        settings[key] = f"{settings.get(key, '')} {sharing}".strip()
    spark_conf = SparkConf().setAppName(app_name)
    if master or not submitted:
        spark_conf.setMaster(master or "local[*]")
    for key, value in settings.items():
        spark_conf.set(key, value)
    if SparkContext._active_spark_context is None:
        gateway = None if submitted else start_jvm(spark_conf, settings, java, home)
        SparkContext(conf=spark_conf, gateway=gateway)
    spark = SparkSession.builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def start_jvm(spark_conf: SparkConf, settings: Mapping[str, str], java: str,
              home: str) -> JavaGateway:
    """Launch the driver's JVM (PySpark's gateway, on `java`, from the Spark at `home`), which
    resolves `spark.jars.packages` first, with the class archive of `jvm_archive` (mapped, or
    recorded and saved at this process's exit).

    The JVM's own output (start-up banners, warnings, Ivy's resolution report) goes to a log
    file, not the user's terminal; errors that matter reach the user through streamer's
    messages. The JVM gets a process group of its own: a SIGTERM to streamer's group (what a
    service manager or `kill -TERM -<pgid>` sends) must reach only streamer, whose graceful
    stop needs the JVM alive; PySpark already keeps Ctrl-C from it. It still ends with
    streamer: it exits when its stdin (a pipe from here) closes.
    """
    from pyspark.errors import PySparkRuntimeError
    from pyspark.java_gateway import launch_gateway

    log = spark_log_path()
    log.parent.mkdir(parents=True, exist_ok=True)
    start = log.stat().st_size if log.exists() else 0
    key = "spark.driver.extraJavaOptions"
    given = spark_conf.get(key) or ""
    sharing = driver_options(java, home, given)
    if sharing:
        spark_conf.set(key, f"{given} {sharing}".strip())
    with open(log, "ab") as sink, _jvm_environment(ui_bind_address(settings)):
        try:
            gateway = launch_gateway(spark_conf, popen_kwargs={
                "stdout": sink, "stderr": sink, "process_group": 0})
            save_at_exit(gateway.proc, sharing)
            return gateway
        except PySparkRuntimeError as exc:
            packages = settings.get("spark.jars.packages")
            if not packages:
                raise
            with open(log, "rb") as out:
                out.seek(start)
                report = out.read().decode(errors="replace")
            raise SparkStartError(unresolved_message(packages, report, log)) from exc


def unresolved_message(packages: str, report: str, log: Path) -> str:
    """What to tell the user when Spark's Ivy could not resolve `packages` (its `report`)."""
    reasons = re.findall(r"unresolved dependency: ([^\]]+)\]", report)
    reasons += [line.strip(" :\t") for line in report.splitlines() if "download failed" in line]
    reason = "; ".join(dict.fromkeys(" ".join(r.split()) for r in reasons)) or "see the log"
    return (f"Spark could not resolve spark.jars.packages ({packages}): {reason}. Check the "
            "coordinates and that Maven Central (https://repo1.maven.org) is reachable: the "
            "first run downloads the jars, later runs read them from Spark's Ivy cache. "
            f"Spark's report is in {log}")


#: Settings whose value is a comma-separated list to which streamer's defaults add entries
#: the engine needs: a user's value is merged with the default instead of replacing it.
MERGED_LISTS = ("spark.sql.adaptive.optimizer.excludedRules",)


def merged_conf(defaults: Mapping[str, str], conf: Mapping[str, str]) -> dict[str, str]:
    """`conf` with each `MERGED_LISTS` value extended by the default's entries it lacks (the
    rule exclusion the watermark needs stays however the user sets the list)."""
    out = dict(conf)
    for key in MERGED_LISTS:
        if key in conf and defaults.get(key):
            given = [item.strip() for item in conf[key].split(",") if item.strip()]
            missing = [item for item in defaults[key].split(",") if item not in given]
            out[key] = ",".join(given + missing)
    return out


def ui_bind_address(settings: Mapping[str, str]) -> str | None:
    """The address Spark's UI listens on: where the driver binds. Spark has no setting for
    it; its UI binds to the JVM's `SPARK_LOCAL_IP`, else to every address (`0.0.0.0`). None
    when the user set `SPARK_LOCAL_IP` themselves (Spark's own variable: theirs wins)."""
    if os.environ.get("SPARK_LOCAL_IP"):
        return None
    return settings.get("spark.driver.bindAddress") or settings.get("spark.driver.host")


@contextlib.contextmanager
def _jvm_environment(local_ip: str | None) -> Iterator[None]:
    """`SPARK_LOCAL_IP` for the JVM launched inside the block only (PySpark passes the
    process environment to it), so the Python process's own environment is left as it was."""
    if local_ip is None:
        yield
        return
    os.environ["SPARK_LOCAL_IP"] = local_ip
    try:
        yield
    finally:
        os.environ.pop("SPARK_LOCAL_IP", None)


def spark_log_path() -> Path:
    """Where the embedded Spark driver's own console output is written."""
    base = os.environ.get("STREAMER_LOG_DIR") or os.path.join(tempfile.gettempdir(),
                                                              "streamer-logs")
    return Path(base) / f"spark-driver-{os.getpid()}.log"


#: What the small-epoch mode sets for the epoch's Spark actions. An epoch's plan holds
#: literals that change every epoch (offsets, the watermark, the epoch's sequence base), and
#: Spark inlines primitive literals into the Java code it generates, so every epoch compiled
#: new classes: 2-12 per epoch at 20-850 ms each on 2 busy cores. Interpreted evaluation
#: compiles nothing and costs microseconds per row, which wins when rows are few. Adaptive
#: execution re-plans after every shuffle (a Spark job per shuffle stage), and one shuffle
#: partition is plenty for the pre-aggregation of a few rows. Measured near-empty epochs
#: (bench/latency.py): keyed 467 -> 240 ms, stateless 90 -> 56 ms. A small keyed epoch also
#: routes its rows before aggregating them: one shuffle instead of two.
SMALL_EPOCH_CONF: dict[str, str] = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "1",
    # A small keyed epoch routes records before aggregating them and relies on a union of
    # two inputs partitioned alike keeping that partitioning (runtime/plan/keyed_plan.py).
    "spark.sql.unionOutputPartitioning": "true",
}


class EpochConf:
    """Switches a session between the small-epoch settings and its own, per epoch, setting
    only what differs (a JVM round trip each)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.own = {key: spark.conf.get(key, None) for key in SMALL_EPOCH_CONF}
        self.small = False

    def use(self, small: bool) -> None:
        """Apply the small-epoch settings (`small`) or the session's own."""
        if small == self.small:
            return
        for key, value in (SMALL_EPOCH_CONF if small else self.own).items():
            if value is None:
                self.spark.conf.unset(key)
            else:
                self.spark.conf.set(key, value)
        self.small = small
