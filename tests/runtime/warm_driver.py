"""The driver of a crash campaign's run on a warm JVM (`warm_jvm.py`): `python warm_driver.py
run PIPELINE ...` settles the JVM named by `PYSPARK_GATEWAY_PORT` and
`PYSPARK_GATEWAY_SECRET`, then runs the `streamer` CLI in this process, which attaches to
that JVM as it does under spark-submit.

A test-only step, not the product's: a driver that stopped whatever SparkContext it found in
a JVM it attaches to would stop another driver's job. Here the only other driver of the JVM
is the run the test killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from warm_jvm import CONF_ENV

from streamer import failpoints
from streamer.runtime.cluster.standalone import session_members

#: How long the dead run's tasks, connections and Python workers may take to end.
SETTLE_TIMEOUT_S = 60.0
#: How long the Python workers of a stopped context get to end by themselves.
WORKERS_GRACE_S = 5.0
#: The JVM's threads that run a Python driver's commands (PySpark's pinned-thread mode and
#: the plain gateway), and that run a task.
CONNECTION_CLASSES = ("py4j.ClientServerConnection", "py4j.GatewayConnection")
TASK_THREAD = "Executor task launch worker"
#: Where a connection's thread waits for its driver's next command.
WAITING = "java.io.BufferedReader.readLine"


def wait_for(done: Callable[[], Any], what: str,
             which: Callable[[], Any] = lambda: "") -> None:
    """Poll `done` until it is true; fail the run, naming `what` (and `which`), when it
    never is."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while not done():
        if time.monotonic() > deadline:
            msg = f"warm JVM: {what} still there after {SETTLE_TIMEOUT_S:.0f}s: {which()}"
            raise SystemExit(msg)
        time.sleep(0.05)


def threads(jvm: Any) -> list[tuple[int, str, list[str]]]:
    """Every live thread of the JVM: its id, name and its stack's frames (`class.method`,
    innermost first)."""
    found = []
    for thread in jvm.java.lang.Thread.getAllStackTraces().keySet():
        if thread.isAlive():
            stack = [f"{frame.getClassName()}.{frame.getMethodName()}"
                     for frame in thread.getStackTrace()]
            found.append((thread.getId(), thread.getName(), stack))
    return found


def busy_connections(jvm: Any, mine: int) -> list[str]:
    """The connections of Python drivers, other than this one's, that are running a command
    (the dead run's, until the command returns): a connection's thread that waits for a
    command reads the end of its socket and ends."""
    busy = []
    for tid, name, stack in threads(jvm):
        at = next((i for i, frame in enumerate(stack)
                   if frame.rpartition(".")[0] in CONNECTION_CLASSES), None)
        if tid != mine and at is not None and WAITING not in stack[:at]:
            busy.append(f"{name}: {' < '.join(stack[:6])}")
    return busy


def task_threads(jvm: Any) -> list[str]:
    """The JVM's task threads that are still alive."""
    return [name for _, name, _ in threads(jvm) if name.startswith(TASK_THREAD)]


def end_python_workers(jvm_pid: int) -> int:
    """Wait for the JVM's Python processes to end, now that no SparkContext is left in it;
    SIGKILL those still there after `WORKERS_GRACE_S`, and return how many.

    They are all the dead driver's: a task of its context that started after the crash's
    `kill_workers` (the JVM lives on here) can start a PySpark daemon of its own, and a
    daemon ends only when its JVM does (its stdin closes), as it does when a run that has a
    JVM of its own crashes with it."""
    def others() -> list[int]:
        return [pid for pid in session_members(os.getsid(jvm_pid)) if pid != jvm_pid]

    deadline = time.monotonic() + WORKERS_GRACE_S
    while others() and time.monotonic() < deadline:
        time.sleep(0.05)
    leftovers = others()
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not others(), "the killed driver's Python workers", others)
    return len(leftovers)


def settle() -> None:
    """Stop the SparkContext a killed driver left active in the JVM (its jobs cancelled
    first), and wait until none of its commands, tasks or Python workers is left; then give
    this run's fail points and `STREAMER_*` settings to the Python workers its context
    starts (the JVM's environment is the test's, not this driver's)."""
    from py4j.clientserver import ClientServer, JavaParameters, PythonParameters

    started = time.monotonic()
    # PySpark's connection (`launch_gateway`), without py4j's memory management: it would
    # release the JVM's objects from a connection of their own.
    gateway = ClientServer(
        java_parameters=JavaParameters(port=int(os.environ["PYSPARK_GATEWAY_PORT"]),
                                       auth_token=os.environ["PYSPARK_GATEWAY_SECRET"],
                                       auto_convert=True, enable_memory_management=False),
        python_parameters=PythonParameters(port=0, eager_load=False))
    try:
        jvm = gateway.jvm
        # (`SparkContext.getActive` is `private[spark]`: public in the bytecode of the
        # companion object, which has no static forwarder for it.)
        contexts = jvm.java.lang.Class.forName("org.apache.spark.SparkContext$") \
            .getField("MODULE$").get(None)
        mine = jvm.java.lang.Thread.currentThread().getId()
        jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
        found = (f"{len(busy_connections(jvm, mine))} busy connections, "
                 f"{len(task_threads(jvm))} task threads, "
                 f"{len(session_members(os.getsid(jvm_pid))) - 1} Python processes")
        stopped = 0
        while True:
            active = contexts.getActive()
            if active.isDefined():
                context = active.get()
                context.cancelAllJobs()
                context.stop()
                stopped += 1
            wait_for(lambda: not busy_connections(jvm, mine),
                     "the killed driver's gateway commands", lambda: busy_connections(jvm, mine))
            if not contexts.getActive().isDefined():
                break
        wait_for(lambda: not task_threads(jvm), "the killed driver's tasks",
                 lambda: task_threads(jvm))
        leftovers = end_python_workers(jvm_pid)
        system = jvm.java.lang.System
        prefix = "spark.executorEnv."
        for name in list(system.getProperties().stringPropertyNames()):
            if name.startswith(f"{prefix}STREAMER_"):
                system.clearProperty(name)
        worker_env = {k: v for k, v in os.environ.items() if k.startswith("STREAMER_")}
        if failpoints.ENV in os.environ:  # (the driver sets it for itself in `_start`)
            worker_env[failpoints.DRIVER_PID_ENV] = str(os.getpid())
        for name, value in worker_env.items():
            system.setProperty(f"{prefix}{name}", value)
        # The master this run would give its SparkContext on a JVM of its own
        # (`warm_jvm.own_jvm_conf`): its driver reads it from the JVM, as under spark-submit.
        system.clearProperty("spark.default.parallelism")
        for name, value in json.loads(os.environ.get(CONF_ENV, "{}")).items():
            system.setProperty(name, value)
        print(f"warm JVM {jvm_pid}: found {found}; stopped {stopped} SparkContext(s); "
              f"killed {leftovers} leftover Python process(es); "
              f"settled in {time.monotonic() - started:.2f}s", file=sys.stderr, flush=True)
    finally:
        gateway.close()


if __name__ == "__main__":
    settle()
    from streamer.cli.main import main

    sys.argv[0] = "streamer"
    main()
