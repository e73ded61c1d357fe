"""`streamer run FILE --submit --master spark://...`: launch the same runtime as the Spark
driver through `spark-submit` (docs/operations/clusters.md).

What is packaged:
- streamer itself: a zip of the installed package's Python modules (`--py-files`), so
  executors import the driver's exact code;
- the pipeline file (`--files`; the driver, which runs here in client mode, reads it in place);
- the modules named in `process:` are shipped by the runtime itself (`addPyFile`), as in
  local mode;
- Python dependencies: executors run `spark.pyspark.python`, by default this interpreter
  (right when the workers share this machine or an identical image); on other machines,
  `--python-env venv.tar.gz` ships a packed environment (`venv-pack`/`conda-pack`) with
  `--archives` and runs `./streamer-env/bin/python` from it.

The driver entry is a generated two-line script that calls `streamer run FILE <options>` with
the user's options minus the submit ones; inside spark-submit, `create_session` takes the
master from spark-submit. The exit code of spark-submit is the driver's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlparse

from streamer.exceptions import ConfigError
from streamer.pipeline.spec import PipelineSpec
from streamer.runtime.cluster.proc_table import process_table

#: Folders of the repository root (= the package) that are not part of the runtime.
_NOT_SHIPPED = {"tests", "bench", "pipelines", "build", "dist", ".venv", "out"}
ENV_ALIAS = "streamer-env"


@dataclass
class SubmitOptions:
    """How to call spark-submit (the CLI builds this from `run --submit`'s options)."""

    master: str
    deploy_mode: str = "client"
    #: Spark settings for spark-submit (`--conf`), CLI ones over the pipeline's `spark:`.
    conf: dict[str, str] = field(default_factory=dict)
    executor_memory: str | None = None
    num_executors: int | None = None
    #: A packed Python environment (tar.gz) for the executors, shipped with `--archives`.
    python_env: str | None = None
    #: Passed to spark-submit as they are (`--spark-arg`, or after `--`).
    spark_args: list[str] = field(default_factory=list)


def check_options(options: SubmitOptions) -> None:
    """Refuse what spark-submit cannot do for a streamer job, with the fix."""
    if options.deploy_mode not in ("client", "cluster"):
        msg = f"--deploy-mode must be client or cluster, not {options.deploy_mode!r}"
        raise ConfigError(msg)
    if options.deploy_mode == "cluster":
        msg = ("--deploy-mode cluster is not supported: Spark standalone refuses Python "
               "applications in cluster deploy mode, and the streamer driver reads the "
               "pipeline and reports progress here; use --deploy-mode client (the default)")
        raise ConfigError(msg)
    if not options.master or options.master.startswith("local"):
        msg = ("--submit needs a cluster master, e.g. --master spark://HOST:7077 (without "
               "--submit, streamer runs Spark inside this process)")
        raise ConfigError(msg)
    if options.python_env and not os.path.isfile(options.python_env):
        msg = (f"--python-env {options.python_env!r} is not a file; give a packed environment "
               "(e.g. `venv-pack -o env.tar.gz`)")
        raise ConfigError(msg)


def is_loopback(master: str) -> bool:
    """Whether the master runs on this machine's loopback (then so may the driver)."""
    host = urlparse(master.split(",")[0]).hostname or ""
    return master.startswith("local") or host in ("127.0.0.1", "localhost", "::1")


def package_root() -> Path:
    """The directory of the installed `streamer` package."""
    import streamer

    return Path(streamer.__file__).resolve().parent


def build_package(target: Path) -> Path:
    """Zip the streamer package (its modules and package data, no tests or benchmarks) to
    `target/streamer.zip` for `--py-files`."""
    root = package_root()
    out = target / "streamer.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for folder, dirs, files in os.walk(root):
            here = Path(folder)
            dirs[:] = sorted(d for d in dirs if d not in _NOT_SHIPPED and not d.startswith(".")
                             and (here / d / "__init__.py").exists())
            for name in sorted(files):
                if name.endswith((".py", ".properties")) or name == "py.typed":
                    path = here / name
                    zf.write(path, str(Path("streamer") / path.relative_to(root)))
    return out


ENTRY = """\
import sys
from streamer.cli.main import main
sys.argv = ["streamer", *sys.argv[1:]]
main()
"""


def submit_command(pipeline: Path, run_args: Sequence[str], options: SubmitOptions,
                   pipeline_conf: Mapping[str, str], workdir: Path, *,
                   app_name: str) -> list[str]:
    """The spark-submit command line that runs `streamer run <pipeline> <run_args>` as the
    driver of an application on `options.master`."""
    from streamer.runtime.cluster.spark import DEFAULT_CONF

    check_options(options)
    from streamer.runtime.cluster.standalone import spark_home

    entry = workdir / "streamer_driver.py"
    entry.write_text(ENTRY)
    package = build_package(workdir)
    conf: dict[str, str] = {}
    # JVM options must be on spark-submit's command line: the driver JVM starts before the
    # pipeline is read.
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        conf[key] = DEFAULT_CONF[key]
    if is_loopback(options.master):
        conf["spark.driver.host"] = conf["spark.driver.bindAddress"] = "127.0.0.1"
    conf["spark.pyspark.driver.python"] = sys.executable
    conf["spark.pyspark.python"] = sys.executable
    archives = []
    if options.python_env:
        archives.append(f"{os.path.abspath(options.python_env)}#{ENV_ALIAS}")
        conf["spark.pyspark.python"] = f"./{ENV_ALIAS}/bin/python"
    conf.update(pipeline_conf)
    conf.update(options.conf)
    cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", options.master,
           "--deploy-mode", options.deploy_mode, "--name", app_name,
           "--py-files", str(package), "--files", str(pipeline.resolve())]
    if archives:
        cmd += ["--archives", ",".join(archives)]
    if options.executor_memory:
        cmd += ["--executor-memory", options.executor_memory]
    if options.num_executors is not None:
        cmd += ["--num-executors", str(options.num_executors)]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    cmd += [*options.spark_args, str(entry), *run_args]
    return cmd


def submit(pipeline: Path, run_args: Sequence[str], options: SubmitOptions,
           pipeline_conf: Mapping[str, str], *, app_name: str) -> int:
    """Run spark-submit in the foreground (its output is the driver's) and return its exit
    code (the driver's exit code)."""
    from streamer.runtime.cluster.spark import check_java, check_master
    from streamer.runtime.cluster.standalone import spark_home

    check_java()
    check_options(options)
    check_master(options.master)
    with tempfile.TemporaryDirectory(prefix="streamer-submit-") as tmp:
        cmd = submit_command(pipeline, run_args, options, pipeline_conf, Path(tmp),
                             app_name=app_name)
        env = dict(os.environ)
        env["SPARK_HOME"] = str(spark_home())
        for name in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET"):
            env.pop(name, None)
        if is_loopback(options.master):
            env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        proc = subprocess.Popen(cmd, env=env)
        with forwarded_sigterm(proc, str(Path(tmp) / "streamer_driver.py")):
            return wait_for_driver(proc)


def wait_for_driver(proc: subprocess.Popen[bytes]) -> int:
    """spark-submit's exit code (the driver's); the first Ctrl-C (which the terminal sends
    the driver too) lets the driver stop at its next boundary, a second ends spark-submit."""
    interrupted = False
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            if interrupted:
                proc.terminate()
                proc.wait()
                return 130
            interrupted = True


def descendants(root: int) -> list[int]:
    """The live processes below `root`, from /proc (parents before children)."""
    children: dict[int, list[int]] = {}
    for pid, fields in process_table().items():
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def driver_pids(root: int, entry: str) -> list[int]:
    """The processes below spark-submit (`root`) that run `entry`: the Python driver."""
    found = []
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if entry.encode() in fh.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


@contextlib.contextmanager
def forwarded_sigterm(proc: subprocess.Popen[bytes], entry: str) -> Iterator[None]:
    """A SIGTERM to `streamer run --submit` (a service manager's stop) reaches the driver,
    which stops gracefully as a local run does (a last checkpoint, then exit), and the
    application then ends and frees its cores; without this, the driver ran on with nobody
    to stop it. A second SIGTERM, or one before the driver started, ends spark-submit."""
    asked: list[bool] = []

    def forward(signum: int, frame: object) -> None:
        drivers = [] if asked else driver_pids(proc.pid, entry)
        asked.append(True)
        for pid in drivers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if not drivers:
            proc.terminate()

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def submit_job(spec: PipelineSpec, pipeline: Path, run_args: Sequence[str], options: SubmitOptions,
               *, debug: bool = False) -> int:
    """Submit the loaded pipeline `spec` (from `pipeline`) with `streamer run` options
    `run_args`; the driver's exit code."""
    name = spec.name
    args = [*(["--debug"] if debug else []), "run", str(pipeline.resolve()), *run_args]
    # The connectors' packages go after the user's, theirs from `--conf` included.
    conf = submit_conf(spec, options.conf)
    return submit(pipeline, args, replace(options, conf={}), conf, app_name=f"streamer:{name}")


def submit_conf(spec: PipelineSpec, cli: Mapping[str, str] | None = None) -> dict[str, str]:
    """The pipeline's `spark:` block, `cli` (`--conf`) over it, and what its connectors need at
    the session's start (the Kafka connector and S3A on `spark.jars.packages` after the user's
    own, the `fs.s3a.*` settings): under spark-submit the session exists before the driver's
    code runs, so they go on the command line, where spark-submit resolves the packages and
    ships their jars to the executors."""
    from streamer.connectors.registry import session_conf

    conf = {str(k): str(v) for k, v in (spec.spark or {}).items()}
    conf.update(cli or {})
    conf.update(session_conf(spec, conf))
    return conf
