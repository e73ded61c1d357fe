"""Bad records in `job.execution.mode: continuous` (issue 36): a source with `on_error` sends
each record its subtasks cannot decode, or whose event time is null, to the dead-letter sink
the epoch mode writes, staged per checkpoint and committed after `_metadata`.

- JSON-lines files (a field of the wrong type, a line that is not JSON, an array, records
  without `ts` or with a null one, a file of bad lines only) through a filter and a
  1-second window: the committed windows AND the dead letters (file, line, record, the
  field that failed) equal the epoch mode's over the same files;
- Kafka (values that are not JSON, an empty one, a record without `ts`) through a filter
  and a rolling count: the same, with partition and offset;
- without `on_error` the run fails as the epoch mode's does, naming the record, with no
  traceback and no restart;
- a run SIGKILLed at a later checkpoint and run again commits each dead letter once.
"""

from __future__ import annotations

import datetime
import json
import re
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fragments import (
    BASE_MS,
    KEEP,
    click_records,
    files_sink,
    files_source,
    job,
    kafka_source,
    section,
    totals,
    window,
    write_pipeline,
)
from streamer_process import FilesOutput, diff, next_checkpoint, quick_jvm
from warm_jvm import WarmJvm, run_warm

pytestmark = pytest.mark.slow

#: The checkpoints of the continuous runs (the epoch runs: one per epoch).
CONTINUOUS = "{interval: 300ms}"


def _line(user: str, ms: int, qty: Any, **extra: Any) -> str:
    ts = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat()
    return json.dumps({"user": user, "grp": 1, "ts": ts, "amount": 1.0, "qty": qty, **extra})


#: Bad lines, by file and line number (1-based) they replace.
BAD = {
    0: {5: _line("u1", BASE_MS, "lots"), 10: "", 40: "{not json"},
    1: {7: '{"user": "u2", "grp": 1, "amount": 1.0, "qty": 3}', 90: "[1, 2]"},
    2: {3: _line("u3", BASE_MS, 1, ts=None), 200: '{"user": "u4", "grp": "x", "qty": 1}'},
}


#: (file name, line) of every line that is not a record, the last file's two included.
BAD_LINES = {(f"part-{f:02d}.jsonl", line) for f, lines in BAD.items() for line in lines} \
    | {("part-03.jsonl", 1), ("part-03.jsonl", 2)}


def write_files(root: Path, files: int = 3, rows: int = 1500) -> Path:
    """`files` JSON-lines files of events rising in time through the files (in order within
    each file), with the `BAD` lines, and a last file of bad lines only."""
    directory = root / "in"
    directory.mkdir()
    for f in range(files):
        lines = []
        for i in range(1, rows + 1):
            ms = BASE_MS + (f * rows + i) * 10
            lines.append(BAD.get(f, {}).get(i, _line(f"u{i % 7}", ms, i % 5 - 1)))
        (directory / f"part-{f:02d}.jsonl").write_text("\n".join(lines) + "\n")
    (directory / f"part-{files:02d}.jsonl").write_text('garbage\n{"grp": "y"}\n')
    return directory


def files_job(root: Path, mode: str, data: Path, *, on_error: str | None = "dead") -> Path:
    """The files -> filter -> 1 s window per user -> jsonl job, dead letters to `dead`."""
    checkpoint = CONTINUOUS if mode == "continuous" else "{interval: 1ms}"
    text = (job(mode, root, checkpoint=checkpoint, backend="rocksdb",
                execution=f"{{mode: {mode}}}")
            + section("sources", files_source(data, on_error=on_error))
            + section("operators", KEEP, window("per_user", "keep", "1s",
                                                "{n: count(), total: sum(qty)}"))
            + section("sinks", files_sink("per_user", root / "out"),
                      *([files_sink(None, root / "dead", id="dead")] if on_error else []))
            + quick_jvm())
    return write_pipeline(root, text)


def outputs(root: Path) -> tuple[Counter[str], Counter[str]]:
    """The committed rows of the job's sink and of its dead letters."""
    return FilesOutput(root / "out").committed(), FilesOutput(root / "dead").committed()


@pytest.fixture(scope="module")
def files_reference(tmp_path_factory: pytest.TempPathFactory, warm_jvm: WarmJvm
                    ) -> tuple[Path, Counter[str], Counter[str]]:
    """The input files, and the epoch mode's windows and dead letters over them."""
    root = tmp_path_factory.mktemp("dead-letters")
    data = write_files(root)
    run = run_warm(warm_jvm, files_job(root / "epochs", "epochs", data))
    assert run.returncode == 0, run.stderr[-3000:]
    out, dead = outputs(root / "epochs")
    assert sum(json.loads(r)["n"] for r in out.elements()) > 2000
    # every bad line is a dead letter (the blank line is no record), with its line
    assert sum(dead.values()) == 8, dead
    lines = {(Path(d["split"]).name, d["offset"]) for d in map(json.loads, dead)}
    assert ("part-00.jsonl", "5") in lines and ("part-03.jsonl", "2") in lines
    return data, out, dead


def test_a_continuous_run_sends_the_epoch_modes_dead_letters(
        tmp_path: Path, files_reference: tuple[Path, Counter[str], Counter[str]],
        warm_jvm: WarmJvm) -> None:
    data, want_out, want_dead = files_reference
    run = run_warm(warm_jvm, files_job(tmp_path, "continuous", data))
    assert run.returncode == 0, run.stderr[-3000:]
    out, dead = outputs(tmp_path)
    assert dead == want_dead, diff(dead, want_dead)
    assert out == want_out, diff(out, want_out)
    assert FilesOutput(tmp_path / "dead").leftovers() == []


def test_without_on_error_a_bad_record_fails_the_run_naming_it(
        tmp_path: Path, files_reference: tuple[Path, Counter[str], Counter[str]],
        warm_jvm: WarmJvm) -> None:
    data, _, _ = files_reference
    runs = {mode: run_warm(warm_jvm, files_job(tmp_path / mode, mode, data, on_error=None))
            for mode in ("epochs", "continuous")}
    for run in runs.values():
        assert "Traceback" not in run.stderr
        assert "source 'events' cannot decode the record at split" in run.stderr, \
            run.stderr[-3000:]
        assert re.search(r"part-0[0-3]\.jsonl", run.stderr), run.stderr[-3000:]
        assert "add on_error: <sink id>" in run.stderr
    assert runs["continuous"].returncode == runs["epochs"].returncode != 0
    # (the continuous mode names the line: the epoch mode, the block it was read in; which
    # bad line ends the run depends on which subtask reaches one first)
    named = re.search(r"(part-0\d\.jsonl) offset (\d+): ", runs["continuous"].stderr)
    assert named is not None, runs["continuous"].stderr[-3000:]
    assert (named[1], int(named[2])) in BAD_LINES, named[0]


def test_a_killed_run_commits_each_dead_letter_once(
        tmp_path: Path, files_reference: tuple[Path, Counter[str], Counter[str]],
        warm_jvm: WarmJvm) -> None:
    """Killed when a keyed subtask reaches the checkpoint after the run's first, once that
    first one committed some dead letters (on a busy machine a checkpoint can come before a
    source read anything: then the next run is killed the same way; each source subtask
    stalls 0.1 s after each slice of 50 rows, so the input lasts): the run again commits the
    rest, none twice. The kill takes the warm JVM with it, as a machine crash does."""
    data, want_out, want_dead = files_reference
    path = files_job(tmp_path, "continuous", data)
    text = path.read_text().replace("execution: {mode: continuous}",
                                    "execution: {mode: continuous, continuous_batch_rows: 50}")
    path.write_text(text)
    checkpoints = tmp_path / "storage" / "continuous" / "checkpoints"
    for _ in range(4):
        armed = next_checkpoint(checkpoints) + 1
        first = run_warm(warm_jvm, path, machine_crash=True,
                         env={"STREAMER_TEST_FAILPOINTS":
                              f"in-task:{armed},source-slice:1:sleep=0.1"})
        assert first.killed, first.stderr[-3000:]
        assert [e["id"] for e in first.checkpoints("completed")][-1:] == [armed - 1]
        _, partial = outputs(tmp_path)
        if partial:
            break
    else:
        pytest.fail("no checkpoint committed a dead letter before the kill")
    second = run_warm(warm_jvm, path)
    assert second.returncode == 0, second.stderr[-3000:]
    out, dead = outputs(tmp_path)
    assert 0 < sum(partial.values()) < sum(want_dead.values())
    assert dead == want_dead, diff(dead, want_dead)
    assert out == want_out, diff(out, want_out)


# ------------------------------------------------------------------ Kafka

PER_PARTITION = 400
#: Bad values, by (partition, position among the partition's records).
KAFKA_BAD: dict[tuple[int, int], Any] = {
    (0, 10): b"not json", (0, 11): "", (1, 50): b"{\"user\": ",
    (1, 51): {"user": "u1", "amount": 2.0}, (0, 300): b"\xff\xfe binary",
}


def kafka_input(kafka: Any) -> str:
    """A 2-partition topic of clicks with the `KAFKA_BAD` values among them."""
    topic = kafka.create_topic(f"clicks-{uuid.uuid4().hex[:8]}", partitions=2)
    records: list[tuple[Any, Any, int]] = []
    seen = Counter[int]()
    for key, value, partition in click_records(PER_PARTITION):
        bad = KAFKA_BAD.get((partition, seen[partition]))
        if bad is not None:
            records.append((None, bad, partition))
        records.append((key, value, partition))
        seen[partition] += 1
    kafka.produce(topic, records)
    return topic


def kafka_job(root: Path, mode: str, bootstrap: str, topic: str) -> Path:
    """Kafka clicks -> a rolling count per user -> jsonl, dead letters to `dead`."""
    checkpoint = CONTINUOUS if mode == "continuous" else "{interval: 1ms}"
    text = (job(mode, root, checkpoint=checkpoint, execution=f"{{mode: {mode}}}")
            + section("sources", kafka_source(bootstrap, topic, per_epoch=300,
                                              on_error="dead"))
            + section("operators", totals(aggregate="{n: count(), last: max(ts)}"))
            + section("sinks", files_sink("totals", root / "out"),
                      files_sink(None, root / "dead", id="dead"))
            + quick_jvm())
    return write_pipeline(root, text)


@pytest.mark.kafka
def test_kafka_dead_letters_are_the_epoch_modes(tmp_path: Path, kafka: Any,
                                                warm_jvm: WarmJvm) -> None:
    topic = kafka_input(kafka)
    runs = {}
    for mode in ("epochs", "continuous"):
        run = run_warm(warm_jvm, kafka_job(tmp_path / mode, mode, kafka.bootstrap, topic))
        assert run.returncode == 0, run.stderr[-3000:]
        runs[mode] = outputs(tmp_path / mode)
    (want_out, want_dead), (out, dead) = runs["epochs"], runs["continuous"]
    assert sum(want_dead.values()) == len(KAFKA_BAD), want_dead
    assert {json.loads(d)["split"] for d in want_dead} == {f"{topic}:0", f"{topic}:1"}
    assert dead == want_dead, diff(dead, want_dead)
    # (a rolling count's updates depend on the epochs; each user's last count does not)
    assert last_counts(out) == last_counts(want_out)


def last_counts(rows: Counter[str]) -> dict[str, int]:
    """Each user's highest count among a rolling count's updates."""
    found: dict[str, int] = {}
    for row in map(json.loads, rows):
        found[row["user"]] = max(found.get(row["user"], 0), row["n"])
    return found
