"""`job.execution.mode: continuous` from Kafka to Kafka (issue 36), on the real broker:
a bounded 2-partition topic of JSON clicks, a filter, a rolling count per user, and a Kafka
sink keyed by user, run as one barrier stage of long-running subtasks.

- exactly_once: the keyed subtasks stage the sink's records for each checkpoint and the
  driver commits them in one transaction after `_metadata`; a `read_committed` reader sees
  each user's updates counting up by the records that passed the filter, none twice, the
  last one the user's total;
- at_least_once: the keyed subtasks produce as they emit (the low-latency path) and flush
  at each barrier; the records are there before the run ends, with the same totals;
- `streamer stop --savepoint` of a job in one mode, restored in the other at another
  parallelism and on another backend: the two runs commit the uninterrupted run's windows.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from fragments import (
    CLICKS_SCHEMA,
    TOTAL,
    click_records,
    files_sink,
    job,
    kafka_sink,
    kafka_source,
    section,
    window,
)
from streamer_process import quick_jvm
from warm_jvm import WarmJvm, run_warm

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

PER_PARTITION = 1500


def pipeline(root: Path, bootstrap: str, topic: str, out: str, mode: str) -> Path:
    """Kafka clicks -> amount >= 2 -> count per user -> Kafka, continuously."""
    text = f"""\
name: kafka-gang
storage: {root / 'storage'}
job:
  parallelism: 2
  checkpoint: {{interval: 300ms, mode: {mode}}}
  execution: {{mode: continuous}}
sources:
  - id: clicks
    type: kafka
    bootstrap_servers: {bootstrap}
    topic: {topic}
    bounded: true
    schema: {CLICKS_SCHEMA}
    event_time: timestamp_millis(ts)
    watermark: {{max_out_of_orderness: 1s}}
operators:
  - {{id: paid, input: clicks, filter: "amount >= 2"}}
  - {{id: per_user, input: paid, key_by: [user], aggregate: {{n: count()}}}}
{section("sinks")}{kafka_sink("per_user", bootstrap, out)}{quick_jvm()}"""
    path = root / "kafka-gang.yaml"
    path.write_text(text)
    return path


def expected() -> Counter[str]:
    """Per user, the clicks that pass the filter."""
    return Counter(value["user"] for _, value, _ in click_records(PER_PARTITION)
                   if value["amount"] >= 2)


def updates(rows: list[tuple[Any, Any, int, int]]) -> dict[str, list[int]]:
    """Per user, the counts its update records carry, in the order of their partition."""
    found: dict[str, list[int]] = defaultdict(list)
    for _key, value, _partition, _offset in rows:
        record = json.loads(value)
        found[record["user"]].append(record["n"])
    return found


@pytest.mark.parametrize("mode", ["exactly_once", "at_least_once"])
def test_kafka_to_a_rolling_count_to_kafka_runs_continuously(
        tmp_path: Path, kafka: Any, mode: str, warm_jvm: WarmJvm) -> None:
    topic = kafka.create_topic(f"clicks-{uuid.uuid4().hex[:8]}", partitions=2)
    out = kafka.create_topic(f"counts-{uuid.uuid4().hex[:8]}", partitions=2)
    kafka.produce(topic, click_records(PER_PARTITION))
    run = run_warm(warm_jvm, pipeline(tmp_path, kafka.bootstrap, topic, out, mode))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.finished is not None and run.finished["records_in"] == 2 * PER_PARTITION
    assert len(run.checkpoints("completed")) >= 2
    want = expected()
    records = kafka.read(out, isolation="read_committed")
    assert run.finished["records_out"] == len(records)
    got = updates(records)
    assert {user: counts[-1] for user, counts in got.items()} == dict(want)
    for user, counts in got.items():  # a user's records are in one partition, in order
        assert counts == sorted(set(counts)), f"{user}: {counts}"


# ------------------------------------------------------------------ savepoints across modes

def windows(root: Path, bootstrap: str, topic: str, *, name: str, mode: str, bounded: bool,
            parallelism: int, backend: str) -> Path:
    """Kafka clicks -> amount >= 2 -> 1 s tumbling count and sum per user -> jsonl files."""
    text = (job(name, storage=root / "storage", parallelism=parallelism,
                checkpoint="{interval: 300ms}", backend=backend, execution=f"{{mode: {mode}}}")
            + section("sources", kafka_source(bootstrap, topic, per_epoch=None, bounded=bounded))
            + section("operators", '  - {id: paid, input: clicks, filter: "amount >= 2"}\n',
                      window("per_user", "paid", "1s", TOTAL))
            + section("sinks", files_sink("per_user", root / f"out-{name}"))
            + quick_jvm())
    path = root / f"{name}-{mode}.yaml"
    path.write_text(text)
    return path


def rows_of(directory: Path) -> Counter[str]:
    """The committed rows of a jsonl files sink."""
    rows: Counter[str] = Counter()
    for path in sorted(directory.glob("part-*.jsonl")):
        rows.update(line for line in path.read_text().splitlines() if line)
    return rows


def stop_with_savepoint(warm_jvm: WarmJvm, path: Path, storage: Path, job: str
                        ) -> tuple[Any, str]:
    """Run `path` (an unbounded source) until its first checkpoint, then `streamer stop
    --savepoint`: the run and the savepoint's path."""
    import threading
    import time

    from typer.testing import CliRunner

    from streamer.cli.main import app

    ran: list[Any] = []
    thread = threading.Thread(target=lambda: ran.append(run_warm(warm_jvm, path)))
    thread.start()
    checkpoints = storage / job / "checkpoints"
    deadline = time.monotonic() + 240
    while not list(checkpoints.glob("chk-*/_metadata")):
        assert time.monotonic() < deadline and thread.is_alive(), "no checkpoint came"
        time.sleep(0.2)
    result = CliRunner().invoke(app, ["stop", job, "--savepoint", "--storage", str(storage)])
    thread.join(240)
    assert result.exit_code == 0, result.output
    return ran[0], result.output.strip().splitlines()[-1]


@pytest.mark.parametrize(("stop_in", "restore_in"), [
    (("continuous", 2, "rocksdb"), ("epochs", 3, "memory")),
    (("epochs", 3, "memory"), ("continuous", 2, "rocksdb")),
])
def test_stop_with_savepoint_in_one_mode_then_restore_in_the_other(
        tmp_path: Path, kafka: Any, stop_in: tuple[str, int, str],
        restore_in: tuple[str, int, str], warm_jvm: WarmJvm) -> None:
    """Another mode, parallelism and backend: the two runs commit the uninterrupted run's
    windows, none twice, none lost."""
    topic = kafka.create_topic(f"clicks-{uuid.uuid4().hex[:8]}", partitions=2)
    kafka.produce(topic, click_records(PER_PARTITION))
    reference = windows(tmp_path, kafka.bootstrap, topic, name="reference", mode="epochs",
                        bounded=True, parallelism=2, backend="rocksdb")
    assert run_warm(warm_jvm, reference).returncode == 0
    want = rows_of(tmp_path / "out-reference")
    assert sum(json.loads(r)["n"] for r in want.elements()) == sum(expected().values())

    mode, parallelism, backend = stop_in
    first = windows(tmp_path, kafka.bootstrap, topic, name="moving", mode=mode,
                    bounded=False, parallelism=parallelism, backend=backend)
    run, savepoint = stop_with_savepoint(warm_jvm, first, tmp_path / "storage", "moving")
    assert run.returncode == 0 and run.finished["status"] == "stopped", run.stderr[-3000:]
    assert savepoint in run.finished["reason"]
    assert (Path(savepoint) / "_metadata").is_file()
    before = rows_of(tmp_path / "out-moving")
    # (the source never ends: its last windows wait in the savepoint's state)
    assert sum(before.values()) < sum(want.values())

    mode, parallelism, backend = restore_in
    second = windows(tmp_path, kafka.bootstrap, topic, name="moving", mode=mode,
                     bounded=True, parallelism=parallelism, backend=backend)
    restored = run_warm(warm_jvm, second, "--from-savepoint", savepoint)
    assert restored.returncode == 0, restored.stderr[-3000:]
    after = rows_of(tmp_path / "out-moving")
    assert after == want, f"missing {want - after}, extra {after - want}"


@pytest.mark.parametrize("mode", ["exactly_once", "at_least_once"])
def test_a_stateless_pipeline_runs_in_its_source_subtasks(
        tmp_path: Path, kafka: Any, mode: str, warm_jvm: WarmJvm) -> None:
    """Kafka -> filter -> Kafka: no keyed operator, so the gang is the source subtasks alone,
    each writing the sink (staged per checkpoint, or produced at once)."""
    topic = kafka.create_topic(f"clicks-{uuid.uuid4().hex[:8]}", partitions=2)
    out = kafka.create_topic(f"paid-{uuid.uuid4().hex[:8]}", partitions=2)
    kafka.produce(topic, click_records(PER_PARTITION))
    text = pipeline(tmp_path, kafka.bootstrap, topic, out, mode).read_text()
    text = text.replace('''  - {id: per_user, input: paid, key_by: [user], aggregate: {n: count()}}
''', "").replace("input: per_user", "input: paid")
    path = tmp_path / "stateless.yaml"
    path.write_text(text)
    run = run_warm(warm_jvm, path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.finished is not None and run.finished["records_in"] == 2 * PER_PARTITION
    want = Counter(json.dumps(value, sort_keys=True) for _, value, _ in
                   click_records(PER_PARTITION) if value["amount"] >= 2)
    got = Counter(json.dumps(json.loads(value), sort_keys=True)
                  for _k, value, _p, _o in kafka.read(out, isolation="read_committed"))
    assert got == want
    assert run.finished["records_out"] == sum(got.values())
