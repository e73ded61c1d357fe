"""The driver JVM's class archive: Spark's classes, loaded and verified once, mapped by every
later driver start (the JDK's class data sharing, a dynamic "AppCDS" archive).

A Spark driver loads about ten thousand classes from Spark's jars before its first job, and
parsing and verifying them is most of a start's CPU. The JDK can save the classes a JVM loaded
into an archive at its exit (`-XX:ArchiveClassesAtExit`) and map that archive into later JVMs
(`-XX:SharedArchiveFile`). On a 2-core machine this cuts a driver's start to its first
finished job by about a third: 8.8 -> 5.4 s and 14.5 -> 9.4 CPU seconds (bench/jvm_start.py,
medians of 3, load 1.1-1.7). JDK 19 automates the same
(`-XX:+AutoCreateSharedArchive`); streamer supports Java 17, so it does the steps itself:

- The archive lives in streamer's cache (`$STREAMER_CACHE/jvm/`, `~/.cache/streamer/jvm/`), one
  for each Java installation and Spark distribution (`archive_path`): an archive that another
  JVM or other jars made is never offered, and the JVM checks the one it is given too.
- A driver started while it exists maps it (`-Xshare:auto`: a JVM that cannot use it starts
  as it would without, so the archive never decides whether a job runs).
- The first driver started without it records its classes, and saves them when it exits. The
  JVM writes them to a file of its own; when the driver's Python process exits, it waits for
  the JVM (`SAVE_TIMEOUT_S`) and renames the file into place, so no JVM maps a half-written
  archive and two first runs at once do not clash. A driver that is killed saves nothing, and
  the next start records again.
- A `spark:` block whose `spark.driver.extraJavaOptions` chooses class sharing itself
  (`-Xshare:off`, or an archive of its own) gets nothing added (docs/guide/pipeline-file.md,
  "Spark settings").
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import subprocess
import time
import uuid
from pathlib import Path

from streamer.connectors.maven import cache_dir

#: How long an exiting driver waits for its JVM to save the archive (seconds). Saving a
#: first run's classes takes seconds on 2 cores; a JVM still saving after this is left to
#: finish, and its file is not renamed (the next start records again).
SAVE_TIMEOUT_S = 120.0
#: Options of a user's that already choose class sharing: streamer adds nothing to those.
USER_CHOICES = ("-Xshare:", "SharedArchiveFile", "ArchiveClassesAtExit",
                "AutoCreateSharedArchive")
#: How many archives the cache keeps (the newest): one for each Java and Spark installation
#: in use, such as a virtual environment for each project.
KEEP = 4
#: The host names of a standalone master on this machine.
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
#: A part file older than this is a dead driver's (a saving JVM that was killed) and removed.
STALE_PART_S = 3600.0
#: The first bytes of a dynamic archive (HotSpot's `CDS_DYNAMIC_ARCHIVE_MAGIC`, little-endian
#: on the machines Spark runs on). The JVM writes an archive's header last, so a file that
#: starts with them was saved whole.
DYNAMIC_MAGIC = bytes.fromhex("a8ab0bf0")


def archive_path(java: str, spark_home: str) -> Path:
    """The archive of the Java at `java` with the jars of the Spark at `spark_home`: named by
    both, so another JDK, Spark version or installation gets an archive of its own."""
    digest = hashlib.sha256()
    binary = Path(java).resolve()
    stat = binary.stat()
    digest.update(f"{binary}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    # The JVM maps an archive only into a JVM whose class path has the same jars, at the
    # same paths, with the same sizes and times; a mismatch would silently map nothing.
    jars = Path(spark_home).resolve() / "jars"
    digest.update(f"{jars}\0".encode())
    for jar in sorted(jars.glob("*.jar")) if jars.is_dir() else ():
        stat = jar.stat()
        digest.update(f"{jar.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return cache_dir() / "jvm" / f"spark-driver-{digest.hexdigest()[:16]}.jsa"


def driver_options(java: str, spark_home: str, given: str) -> str:
    """What to add to the driver's Java options `given` (the effective
    `spark.driver.extraJavaOptions`): map the archive, or record one; nothing when `given`
    chooses class sharing itself. Recording registers the exit step that saves it."""
    if _chooses_itself(given):
        return ""
    archive = archive_path(java, spark_home)
    if archive.is_file():
        return _mapping(archive)
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return ""  # (a cache that cannot be written: the driver starts as Spark's own does)
    _remove_stale_parts(archive)
    # A file of this JVM's own: another driver (or a second JVM of this process) saves to
    # its own.
    part = archive.with_name(f"{archive.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.part")
    return f"-XX:ArchiveClassesAtExit={part}"


def mapped_options(java: str, spark_home: str) -> str:
    """The Java options that map the saved archive of `java` and `spark_home`, or "" while
    there is none (for a JVM that must not record one: a test's warm JVM, which is killed)."""
    archive = archive_path(java, spark_home)
    return _mapping(archive) if archive.is_file() else ""


def executor_options(master: str, java: str, spark_home: str, given: str) -> str:
    """What to add to the executors' Java options `given` on the standalone master `master`:
    the saved archive where every host of the master is this machine's loopback (a cluster
    started here, as `StandaloneCluster` and docs/operations/clusters.md do), whose workers
    start executors from this Spark with the driver's class path. Executors elsewhere have
    other files, so they get nothing, and neither do options that choose class sharing."""
    hosts = {address.rpartition(":")[0]
             for address in master.removeprefix("spark://").split(",")}
    if not master.startswith("spark://") or not hosts <= LOOPBACK or _chooses_itself(given):
        return ""
    return mapped_options(java, spark_home)


def _chooses_itself(given: str) -> bool:
    return any(choice in given for choice in USER_CHOICES)


def _mapping(archive: Path) -> str:
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto"


def save_at_exit(jvm: subprocess.Popen[bytes] | None, options: str) -> None:
    """When `options` (from `driver_options`) record an archive: at this process's exit, end
    the JVM `jvm` (closing its stdin, which PySpark's gateway exits on), wait for it to save
    its classes, and rename the file into place."""
    prefix = "-XX:ArchiveClassesAtExit="
    if jvm is None or not options.startswith(prefix):
        return
    part = Path(options[len(prefix):])
    atexit.register(save, jvm, part)


def save(jvm: subprocess.Popen[bytes], part: Path) -> None:
    """End the recording JVM `jvm`, wait for it to save its classes into `part`, and rename a
    whole archive into place (then keep the newest few); remove a broken one."""
    if jvm.stdin is not None:
        with contextlib.suppress(OSError):
            jvm.stdin.close()
    try:
        jvm.wait(timeout=SAVE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return
    try:
        with open(part, "rb") as saved:
            whole = saved.read(len(DYNAMIC_MAGIC)) == DYNAMIC_MAGIC
    except OSError:
        return
    if whole and jvm.returncode == 0:
        part.replace(part.with_name(part.name.rsplit(".", 2)[0]))
        _remove_old_archives(part.parent)
    else:
        part.unlink(missing_ok=True)


def _remove_old_archives(folder: Path) -> None:
    """Keep the `KEEP` newest archives in `folder`.

    Each Java update or reinstalled Spark saves a new one (about 150 MB), and nothing maps
    the old ones again. A JVM that has one mapped keeps it (a removed file stays readable
    to whoever has it open), and an installation whose archive was removed saves it again.
    """
    archives = sorted(folder.glob("spark-driver-*.jsa"), key=_mtime, reverse=True)
    for old in archives[KEEP:]:
        old.unlink(missing_ok=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _remove_stale_parts(archive: Path) -> None:
    now = time.time()
    for part in archive.parent.glob(f"{archive.name}.*.part"):
        with contextlib.suppress(OSError):
            if now - part.stat().st_mtime > STALE_PART_S:
                part.unlink()
