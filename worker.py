"""What streamer's Spark tasks do to the PySpark Python worker process they run in
(`prepare_task`, called first by every task: keyed subtasks, Kafka readers and producers).

**Spark's archives are read once, not every task.** PySpark's worker calls
`importlib.invalidate_caches()` at the start of every task (`worker.setup_spark_files`). Its
`sys.path` holds Spark's own archives (`$SPARK_HOME/python/lib/pyspark.zip`, the py4j zip and
the spark-core jar, which PySpark puts there), and on Python 3.11 every `zipimporter` of them
(one per package imported from an archive: ~20 once pyspark.sql is loaded) re-reads its
archive's whole directory when invalidated. Measured in a local[2] worker: 105 ms for the
first invalidation, ~14 ms per task on average over the table-join benchmark's tasks (py-spy,
`zipimporter.invalidate_caches` under `setup_spark_files`), paid by every keyed task however
small. Those archives belong to the Spark installation and do not change while a worker
lives, so `read_spark_archives_once` makes invalidation skip them; every other archive (a
user's `--py-files` zip) is invalidated as before.

**The worker's long-lived objects are left out of its per-task collection.** PySpark's daemon
runs a full `gc.collect()` in a reused worker after every task (`daemon.py`, "gc.collect()"
after `worker(sock, ...)`), which walks every object the worker tracks: the imported modules
(pyspark, pyarrow, numpy, rocksdict and streamer's own) and what stays between tasks (parked
state handles, the table join's decoded rows). Measured with py-spy on the table-join
benchmark: 55-80 ms per task in each worker, and the worker reads its next task only after it.
`freeze_long_lived` moves the objects alive at the start of a task into the permanent
generation (`gc.freeze`, CPython's tool for exactly this: long-lived objects of a pre-forked
worker) whenever the task finds modules it has not frozen yet (the first tasks of a worker,
and any that imports something new), so the daemon's collection walks only what later tasks
create. Frozen objects are still freed by reference counting; only a reference cycle among
them that becomes garbage later is kept, and freezing happens a handful of times per worker.
Measured: bench/joins.py's table cell 1.35 -> 1.17 s (medians of 12 warm runs each).
"""

from __future__ import annotations

import gc
import os
import sys
import zipimport
from typing import Any

_installed = False
#: How many modules this process had when it last froze its objects (`freeze_long_lived`).
_frozen_with = 0


def spark_archive(archive: str) -> bool:
    """Whether `archive` (a zipimporter's archive path) is one of Spark's own: under
    `$SPARK_HOME` (the pip-installed pyspark package directory, or a Spark distribution)."""
    home = os.environ.get("SPARK_HOME")
    if not home:
        return False
    return os.path.abspath(archive).startswith(os.path.abspath(home) + os.sep)


def read_spark_archives_once() -> None:
    """Make `zipimporter.invalidate_caches` skip Spark's archives in this process (once)."""
    global _installed
    if _installed:
        return
    original = zipimport.zipimporter.invalidate_caches

    def invalidate_caches(self: Any) -> None:
        if not spark_archive(self.archive):
            original(self)

    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]
    _installed = True


def freeze_long_lived() -> None:
    """Move this process's objects into the permanent generation when it has imported
    modules since it last did (see the module docstring)."""
    global _frozen_with
    if len(sys.modules) != _frozen_with:
        gc.freeze()
        _frozen_with = len(sys.modules)


def prepare_task() -> None:
    """What a streamer task calls first in a PySpark Python worker (not in the driver)."""
    read_spark_archives_once()
    freeze_long_lived()
