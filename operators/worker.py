"""What a keyed task does once per PySpark Python worker process before its first task.

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
"""

from __future__ import annotations

import os
import zipimport
from typing import Any

_installed = False


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
