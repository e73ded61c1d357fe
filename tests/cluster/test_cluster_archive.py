"""The executors of a standalone cluster on this machine map the driver's class archive
(runtime/cluster/jvm_archive.py `executor_options`), as the driver does."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from streamer.runtime.cluster import jvm_archive
from streamer.runtime.cluster.spark import check_java
from streamer.runtime.cluster.standalone import StandaloneCluster, spark_home

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

#: A driver on the cluster: one job on both executors, then which of the application's
#: executor JVMs have the archive mapped (/proc/<pid>/maps names the file).
DRIVER = textwrap.dedent("""\
    import subprocess, sys
    from streamer.runtime.cluster.spark import create_session
    spark = create_session("archive", master=sys.argv[1], ui=False)
    assert spark.range(100).repartition(4).selectExpr("sum(id) AS s").collect()[0].s == 4950
    app = spark.sparkContext.applicationId
    pids = subprocess.run(["pgrep", "-f", f"CoarseGrainedExecutorBackend.*{app}"],
                          capture_output=True, text=True).stdout.split()
    print(len(pids), sum(sys.argv[2] in open(f"/proc/{pid}/maps").read() for pid in pids))
    """)


def drive(master: str, archive: str) -> str:
    done = subprocess.run([sys.executable, "-c", DRIVER, master, archive], capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_executors_on_this_machine_map_the_drivers_class_archive(
        standalone: StandaloneCluster) -> None:
    archive = jvm_archive.archive_path(check_java(), str(spark_home()))
    if not archive.is_file():
        drive(standalone.master_url, str(archive))  # the first driver saves it at its exit
    assert archive.is_file()
    got = drive(standalone.master_url, str(archive))
    assert got == "2 2", got
