"""The driver JVM's class archive (runtime/cluster/jvm_archive.py): the first driver records
Spark's classes and saves them when its process exits, and the next driver maps them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from streamer.runtime.cluster import jvm_archive
from streamer.runtime.cluster.spark import check_java
from streamer.runtime.cluster.standalone import spark_home

#: A driver's Python process: a session, one job, and which archive its JVM has mapped (the
#: JVM maps the archive file into its memory: /proc/<pid>/maps names it).
DRIVER = textwrap.dedent("""\
    import os, sys
    from pyspark import SparkContext
    from streamer.runtime.cluster.spark import create_session
    spark = create_session("archive", master="local[1]", ui=False)
    assert spark.range(5).selectExpr("sum(id) AS s").collect()[0].s == 10
    jvm = SparkContext._gateway.proc.pid
    maps = open(f"/proc/{jvm}/maps").read()
    print("MAPPED" if ".jsa" in maps and sys.argv[1] in maps else "NOT MAPPED", flush=True)
    """)


def drive(archive: Path) -> str:
    done = subprocess.run([sys.executable, "-c", DRIVER, str(archive)], capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.mark.slow
def test_the_first_driver_saves_the_archive_at_exit_and_the_next_maps_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMER_CACHE", str(tmp_path / "cache"))
    archive = jvm_archive.archive_path(check_java(), str(spark_home()))
    assert not archive.exists()
    assert drive(archive) == "NOT MAPPED"
    # Saved whole, under its own name, and no part file is left.
    assert archive.read_bytes()[:4] == jvm_archive.DYNAMIC_MAGIC
    assert [p.name for p in archive.parent.iterdir()] == [archive.name]
    assert drive(archive) == "MAPPED"


def test_the_archive_is_named_by_the_java_and_the_spark_jars(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMER_CACHE", str(tmp_path / "cache"))
    java = tmp_path / "java"
    java.write_text("a")
    spark = tmp_path / "spark"
    (spark / "jars").mkdir(parents=True)
    (spark / "jars" / "spark-core.jar").write_text("1")
    first = jvm_archive.archive_path(str(java), str(spark))
    assert first.parent == tmp_path / "cache" / "jvm"
    assert jvm_archive.archive_path(str(java), str(spark)) == first
    (spark / "jars" / "hadoop.jar").write_text("2")
    second = jvm_archive.archive_path(str(java), str(spark))
    java.write_text("another build")
    assert len({first, second, jvm_archive.archive_path(str(java), str(spark))}) == 3


def test_a_driver_records_maps_or_leaves_the_users_choice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMER_CACHE", str(tmp_path / "cache"))
    java, spark = str(tmp_path / "java"), str(tmp_path / "spark")
    Path(java).write_text("a")
    archive = jvm_archive.archive_path(java, spark)
    recording = jvm_archive.driver_options(java, spark, "-Dlog4j2.configurationFile=x")
    assert recording.startswith(f"-XX:ArchiveClassesAtExit={archive}.{os.getpid()}-")
    assert recording.endswith(".part")
    assert jvm_archive.driver_options(java, spark, "") != recording  # a file for each JVM
    assert jvm_archive.mapped_options(java, spark) == ""
    archive.write_bytes(jvm_archive.DYNAMIC_MAGIC)
    mapped = f"-XX:SharedArchiveFile={archive} -Xshare:auto"
    assert jvm_archive.driver_options(java, spark, "") == mapped
    assert jvm_archive.mapped_options(java, spark) == mapped
    for own in ("-Xshare:off", "-XX:SharedArchiveFile=/mine.jsa", "-XX:+AutoCreateSharedArchive"):
        assert jvm_archive.driver_options(java, spark, f"-Xmx1g {own}") == ""


def test_a_dead_drivers_old_part_file_is_removed(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMER_CACHE", str(tmp_path / "cache"))
    java, spark = str(tmp_path / "java"), str(tmp_path / "spark")
    Path(java).write_text("a")
    archive = jvm_archive.archive_path(java, spark)
    archive.parent.mkdir(parents=True)
    old, young = (archive.with_name(f"{archive.name}.{pid}.part") for pid in (1, 2))
    for part in (old, young):
        part.write_bytes(b"\0")
    hours_ago = old.stat().st_mtime - 2 * jvm_archive.STALE_PART_S
    os.utime(old, (hours_ago, hours_ago))
    jvm_archive.driver_options(java, spark, "")
    assert not old.exists() and young.exists()


def test_only_executors_of_a_cluster_on_this_machine_map_the_archive(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMER_CACHE", str(tmp_path / "cache"))
    java, spark = str(tmp_path / "java"), str(tmp_path / "spark")
    Path(java).write_text("a")
    here = "spark://127.0.0.1:7077,localhost:7078"
    assert jvm_archive.executor_options(here, java, spark, "") == ""  # none saved yet
    archive = jvm_archive.archive_path(java, spark)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(jvm_archive.DYNAMIC_MAGIC)
    mapped = f"-XX:SharedArchiveFile={archive} -Xshare:auto"
    assert jvm_archive.executor_options(here, java, spark, "-Dx=1") == mapped
    for elsewhere in ("spark://10.0.0.5:7077", "spark://127.0.0.1:7077,node2:7077",
                      "local[2]", "yarn"):
        assert jvm_archive.executor_options(elsewhere, java, spark, "") == ""
    assert jvm_archive.executor_options(here, java, spark, "-Xshare:off") == ""


def test_a_cache_that_cannot_be_written_starts_the_driver_without_an_archive(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("STREAMER_CACHE", str(blocker / "cache"))
    java = tmp_path / "java"
    java.write_text("a")
    assert jvm_archive.driver_options(str(java), str(tmp_path / "spark"), "") == ""


def test_saving_keeps_the_newest_archives(tmp_path: Path) -> None:
    for age in range(6):
        old = tmp_path / f"spark-driver-{age}.jsa"
        old.write_bytes(b"x")
        os.utime(old, (1_000_000 - age, 1_000_000 - age))
    (tmp_path / "other.txt").write_text("kept")
    jvm = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                           stdin=subprocess.PIPE)
    part = tmp_path / "spark-driver-new.jsa.1-ab.part"
    part.write_bytes(jvm_archive.DYNAMIC_MAGIC + b"rest")
    jvm_archive.save(jvm, part)  # the exit step: ends the "JVM", renames, prunes
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "other.txt", "spark-driver-0.jsa", "spark-driver-1.jsa", "spark-driver-2.jsa",
        "spark-driver-new.jsa"]
