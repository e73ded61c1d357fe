"""Which subtask a keyed task runs (`runtime.subtasks.claim_subtask`) and the worker's one-time
setup (`streamer.worker`), on real files and real processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from streamer.runtime.subtasks import claim_subtask


def test_each_partition_claims_one_subtask_and_keeps_it(tmp_path: Path) -> None:
    claims = str(tmp_path / "claims")
    # Partition 0's worker holds subtask 2, partition 1's holds 0; partition 2 holds nothing
    # (or a subtask out of range, from another parallelism).
    got = {0: claim_subtask(claims, 5, 0, 3, [2]), 1: claim_subtask(claims, 5, 1, 3, [0]),
           2: claim_subtask(claims, 5, 2, 3, [7])}
    assert got == {0: 2, 1: 0, 2: 1}
    # A retried attempt (or a second evaluation) of a partition runs the same subtask,
    # whatever its worker holds now.
    assert [claim_subtask(claims, 5, p, 3, [p]) for p in (2, 1, 0)] == [1, 0, 2]
    # A fourth partition would be a second task for some subtask: refused.
    with pytest.raises(RuntimeError, match="all 3 subtasks claimed"):
        claim_subtask(claims, 5, 3, 3, [])
    # The next epochs claim afresh; claims two epochs behind go.
    assert claim_subtask(claims, 6, 0, 3, [1]) == 1
    assert claim_subtask(claims, 7, 0, 3, []) == 0
    assert sorted(p.name for p in (tmp_path / "claims").iterdir()) == ["6-1", "7-0"]


def _claim(args: tuple[str, int, int]) -> int:
    claims, partition, parallelism = args
    return claim_subtask(claims, 1, partition, parallelism, [0, 1])


def test_concurrent_claims_give_every_subtask_once(tmp_path: Path) -> None:
    """Partitions claiming at once, in other processes, all preferring the same subtasks."""
    claims = str(tmp_path / "claims")
    with ProcessPoolExecutor(4) as pool:
        got = list(pool.map(_claim, [(claims, p, 8) for p in range(8)]))
    assert sorted(got) == list(range(8))


def test_spark_archives_are_read_once_and_others_on_every_invalidation(tmp_path: Path) -> None:
    """After `read_spark_archives_once`, invalidating import caches leaves an archive under
    SPARK_HOME as it was read, and still re-reads any other archive."""
    script = textwrap.dedent(f"""\
        import importlib, os, sys, zipfile
        home, other = {str(tmp_path / "spark")!r}, {str(tmp_path / "user.zip")!r}
        os.makedirs(os.path.join(home, "lib"))
        spark_zip = os.path.join(home, "lib", "spark.zip")
        for path, module in ((spark_zip, "in_spark"), (other, "in_user")):
            with zipfile.ZipFile(path, "w") as z:
                z.writestr(module + ".py", "x = 1")
            sys.path.append(path)
        import in_spark, in_user
        os.environ["SPARK_HOME"] = home
        from streamer.worker import read_spark_archives_once
        read_spark_archives_once()
        for path, module in ((spark_zip, "in_spark_2"), (other, "in_user_2")):
            with zipfile.ZipFile(path, "a") as z:
                z.writestr(module + ".py", "x = 2")
        importlib.invalidate_caches()
        for module in ("in_spark_2", "in_user_2"):
            try:
                importlib.import_module(module)
                print(module, "found")
            except ImportError:
                print(module, "missing")
        """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split("\n")
    assert out[:2] == ["in_spark_2 missing", "in_user_2 found"]


def test_long_lived_objects_are_frozen_when_modules_were_imported() -> None:
    """`freeze_long_lived` freezes what is alive when the process has imported modules since
    it last froze, and leaves later objects to the collector otherwise."""
    script = textwrap.dedent("""\
        import gc
        from streamer.worker import freeze_long_lived
        freeze_long_lived()
        first = gc.get_freeze_count()
        kept = [[i] for i in range(1000)]  # (new objects, no new module)
        freeze_long_lived()
        same = gc.get_freeze_count()
        import fractions  # (a module this process had not imported)
        freeze_long_lived()
        print(first > 0, same == first, gc.get_freeze_count() >= first + 1000)
        """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    assert out == ["True", "True", "True"]
