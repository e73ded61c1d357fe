"""`job.execution.mode: continuous` end to end (issue 36): `streamer run` starts one Spark
barrier stage of 2 source and 2 keyed subtasks that live for the whole run, checkpoints it
with barriers in the data every 300 ms, and commits the files sink after each `_metadata`.

- the committed output equals the epoch mode's for the same pipeline and input, on both
  backends, and the run took several checkpoints whose `_metadata` holds each source
  subtask's position (the epoch mode's format);
- a run SIGKILLed when a keyed subtask reaches a later checkpoint, run again, resumes from
  the last completed checkpoint (positions mid-file, state handles) and commits exactly the
  uninterrupted output: nothing lost, nothing twice; the epoch mode refuses to go on from
  that checkpoint (it reads files whole, so it would read the file in progress again).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fragments import parquet_kvts_job
from streamer_process import next_checkpoint, quick_jvm
from warm_jvm import WarmJvm, run_warm

pytestmark = pytest.mark.slow

TS = pa.timestamp("us", tz="UTC")


def write_input(root: Path, files: int = 4, rows: int = 3000, seed: int = 5) -> Path:
    """Parquet files of (k, v, ts): event times rising through the files with some
    disorder; some v negative (the filter drops them)."""
    rnd = random.Random(seed)
    directory = root / "in"
    directory.mkdir()
    for f in range(files):
        base = f * rows * 10
        pq.write_table(pa.table({
            "k": pa.array([rnd.choice("abcdefghij") for _ in range(rows)], pa.string()),
            "v": pa.array([rnd.randint(-3, 20) for _ in range(rows)], pa.int64()),
            "ts": pa.array([(base + i * 10 + rnd.randint(0, 40)) * 1000 for i in range(rows)],
                           pa.int64()).cast(TS)}), directory / f"part-{f:02d}.parquet")
    return directory


def pipeline(root: Path, name: str, mode: str, backend: str, data: Path) -> Path:
    """A filter and a tumbling window of count and sum per key, into a jsonl files sink."""
    path = root / f"{name}.yaml"
    path.write_text(parquet_kvts_job(name, root / "storage", data, root / f"out-{name}",
                                     mode=mode, backend=backend) + quick_jvm())
    return path


def committed(root: Path, name: str) -> Counter[str]:
    """The committed rows of the run's sink (a multiset of JSON lines)."""
    rows: Counter[str] = Counter()
    for path in sorted((root / f"out-{name}").glob("part-*.jsonl")):
        rows.update(line for line in path.read_text().splitlines() if line)
    return rows


def metadata(root: Path, name: str) -> list[dict]:
    """Every retained checkpoint's `_metadata`."""
    found = sorted((root / "storage" / name / "checkpoints").glob("chk-*/_metadata"))
    return [json.loads(p.read_text())["metadata"] for p in found]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, warm_jvm: WarmJvm
              ) -> tuple[Path, Counter[str]]:
    """The input, and the epoch mode's output over it."""
    root = tmp_path_factory.mktemp("continuous")
    data = write_input(root)
    run = run_warm(warm_jvm, pipeline(root, "epochs", "epochs", "rocksdb", data))
    assert run.returncode == 0, run.stderr[-3000:]
    rows = committed(root, "epochs")
    assert sum(json.loads(r)["n"] for r in rows.elements()) > 8000
    return data, rows


@pytest.mark.parametrize("backend", ["rocksdb", "memory"])
def test_a_continuous_run_commits_the_epoch_modes_output(
        tmp_path: Path, reference: tuple[Path, Counter[str]], backend: str,
        warm_jvm: WarmJvm) -> None:
    data, want = reference
    run = run_warm(warm_jvm, pipeline(tmp_path, "gang", "continuous", backend, data))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.finished is not None and run.finished["records_in"] == 12000
    assert committed(tmp_path, "gang") == want
    assert run.finished["records_out"] == sum(want.values())
    metas = metadata(tmp_path, "gang")
    assert metas, "no checkpoint was retained"
    last = metas[-1]
    positions = last["offsets"][next(iter(last["offsets"]))]["continuous"]
    assert sorted(positions) == ["0", "1"] and all(p["ended"] for p in positions.values())
    assert len(run.checkpoints("completed")) >= 2
    # (batches a keyed subtask receives over Flight are realigned before Acero groups them)
    assert "poorly aligned" not in run.stderr


def test_a_killed_continuous_run_resumes_exactly_once(
        tmp_path: Path, reference: tuple[Path, Counter[str]], warm_jvm: WarmJvm) -> None:
    data, want = reference
    path = pipeline(tmp_path, "gang", "continuous", "rocksdb", data)
    # Slices of 250 rows, each source subtask stalled 0.3 s after each: the 24 slices of a
    # subtask last 7 s or more, so the run's checkpoints come mid-input however busy the
    # machine. Killed when a keyed subtask reaches the checkpoint after the run's first,
    # until that first one came while the sources were in the middle of their files (on a
    # busy machine a checkpoint can come before a source read anything: the next run goes
    # on from it). The kill takes the warm JVM with it, as a machine crash does.
    path.write_text(path.read_text().replace("execution: {mode: continuous}",
                                             "execution: {mode: continuous, "
                                             "continuous_batch_rows: 250}"))
    done: list[int] = []
    for _ in range(4):
        armed = next_checkpoint(tmp_path / "storage" / "gang" / "checkpoints") + 1
        first = run_warm(warm_jvm, path, machine_crash=True,
                             env={"STREAMER_TEST_FAILPOINTS":
                                  f"in-task:{armed},source-slice:1:sleep=0.3"})
        assert first.killed, first.stderr[-3000:]
        done += [e["id"] for e in first.checkpoints("completed")]
        assert done and max(done) == armed - 1, done
        positions = metadata(tmp_path, "gang")[-1]["offsets"]["events"]["continuous"]
        if any(p["file"] is not None and p["row"] > 0 for p in positions.values()):
            break
    else:
        pytest.fail(f"no checkpoint of {done} came while a source was mid-file")
    partial = committed(tmp_path, "gang")
    assert sum(partial.values()) < sum(want.values())
    # The epoch mode reads files whole: it refuses to go on from the middle of one.
    epochs = run_warm(warm_jvm, path, env={"STREAMER_EXECUTION_MODE": "epochs"})
    assert epochs.returncode == 2, epochs.stderr[-3000:]
    assert "which the epoch mode can only read whole" in epochs.stderr
    assert "Traceback" not in epochs.stderr
    assert committed(tmp_path, "gang") == partial
    second = run_warm(warm_jvm, path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.finished is not None and second.finished["restored_from"] == max(done)
    assert committed(tmp_path, "gang") == want
