"""The Kafka source and sink against a real broker (scripts/kafka_broker.py) and real Spark."""

from __future__ import annotations

import json
import textwrap
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from fragments import files_sink, job, kafka_sink, kafka_source, section, window

from streamer.connectors.base import ConnectorContext
from streamer.connectors.builtin.memory_sink import MemorySink
from streamer.connectors.kafka.kafka_sink import KafkaSink
from streamer.connectors.kafka.kafka_source import KafkaSource
from streamer.connectors.registry import make_sink
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def topic(kafka: Any, partitions: int = 1) -> str:
    return kafka.create_topic(f"t-{uuid.uuid4().hex[:10]}", partitions)


def rows_of(kafka: Any, name: str, isolation: str = "read_committed") -> Counter[str]:
    return Counter(json.dumps(json.loads(v), sort_keys=True)
                   for _k, v, _p, _o in kafka.read(name, isolation))


def counts(kafka: Any, source: str, out: str, *, per_epoch: int = 100, more_sinks: str = "",
           **options: Any) -> str:
    """The topic `source` of (user, ts) records through a count per user and 10 s into the
    topic `out`. `options` go to the source."""
    return (section("sources", kafka_source(kafka.bootstrap, source, per_epoch=per_epoch,
                                            schema="{user: string, ts: bigint}",
                                            out_of_orderness=None, **options))
            + section("operators", window("per_10s", "clicks", "10s", "{n: count()}",
                                          key_by="user"))
            + section("sinks", kafka_sink("per_10s", kafka.bootstrap, out), more_sinks))


def run(spark: Any, text: str, **options: Any) -> tuple[Any, dict[str, MemorySink]]:
    """Run a pipeline in-process; `console` sinks become memory sinks the test can read."""
    spec = load_pipeline_text(textwrap.dedent(text))
    memories: dict[str, MemorySink] = {}

    def sinks(s: Any, ctx: ConnectorContext) -> Any:
        if s.type == "console":
            memories[s.id] = MemorySink(s, ctx)
            return memories[s.id]
        return make_sink(s, ctx)

    result = JobRunner(spec, RunOptions(ui=False, **options), spark=spark,
                       sink_factory=sinks).run()
    return result, memories


def source_of(spark: Any, kafka: Any, **options: Any) -> KafkaSource:
    doc = {"name": "t", "sources": [{"id": "src", "type": "kafka",
                                     "bootstrap_servers": kafka.bootstrap, **options}],
           "sinks": [{"id": "out", "type": "console", "input": "src"}]}
    spec = load_pipeline_text(yaml.safe_dump(doc, sort_keys=False))
    return KafkaSource(spec.sources[0], ConnectorContext(spark, "t"))


# ------------------------------------------------------------------------------ source
@pytest.mark.parametrize("local", [True, False])
def test_bounded_json_source_reads_every_partition_once_with_dead_letters(
        spark: Any, kafka: Any, monkeypatch: Any, local: bool) -> None:
    """With `local`, slices of up to 1,000 records are read by the driver's consumer into a
    local relation (no Spark job); else by consumers in Spark tasks."""
    if not local:
        monkeypatch.setenv("STREAMER_LOCAL_ROWS", "0")
    name = topic(kafka, 3)
    records = [(f"u{i % 5}", {"user": f"u{i % 5}", "n": i}, i % 3) for i in range(900)]
    records.append((None, "{not json", 2))
    records.append((None, {"user": "x", "n": "not a number"}, 0))
    kafka.produce(name, records)
    result, sinks = run(spark, f"""
        name: src-test
        sources:
          - id: src
            type: kafka
            bootstrap_servers: {kafka.bootstrap}
            topic: {name}
            bounded: true
            max_records_per_epoch: 100
            schema: {{user: string, n: bigint}}
            record_timestamp: produced
            event_time: produced
            on_error: bad
        sinks:
          - id: out
            type: console
            input: src
          - id: bad
            type: console
        """)
    assert result.status == "finished"
    got = Counter(r["n"] for r in sinks["out"].committed)
    assert got == Counter(range(900))  # every record once
    assert all(r["produced"] for r in sinks["out"].committed)
    assert result.offsets["src"] == {f"{name}:0": 301, f"{name}:1": 300, f"{name}:2": 301}
    assert result.epochs >= 4  # 301 records per partition at 100 per epoch
    bad = sorted(sinks["bad"].committed, key=lambda r: r["split"])
    assert [(b["split"], b["offset"], b["record"]) for b in bad] == [
        (f"{name}:0", "300", '{"user": "x", "n": "not a number"}'),
        (f"{name}:2", "300", "{not json")]
    assert [b["error"] for b in bad] == [
        "field 'n': \"not a number\" is not a bigint",
        "not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"]
    read = [m for m in result.metrics if m.records_in.get("src")]
    assert [m.local[:1] == ["src"] for m in read] == [local] * len(read)
    assert sum(m.records_in["src"] for m in read) == 900


def test_start_latest_skips_what_was_there_and_lag_counts_the_rest(
        spark: Any, kafka: Any) -> None:
    name = topic(kafka, 2)
    kafka.produce(name, [(None, {"n": i}, i % 2) for i in range(10)])
    source = source_of(spark, kafka, topic=name, start="latest", schema={"n": "int"})
    offsets = source.initial_offsets()
    assert offsets == {f"{name}:0": 5, f"{name}:1": 5}
    assert source.plan(offsets, 0) is None
    kafka.produce(name, [(None, {"n": 100 + i}, i % 2) for i in range(4)])
    piece = source.plan(offsets, 0)
    assert piece is not None and dict(piece.end) == {f"{name}:0": 7, f"{name}:1": 7}
    assert source.lag(offsets, 0) == 4 and source.lag(piece.end, 0) == 0
    assert source.split_lag(offsets, 0) == {f"{name}:0": 2, f"{name}:1": 2}
    assert source.split_lag(piece.end, 0) == {f"{name}:0": 0, f"{name}:1": 0}
    rows = sorted(r["n"] for r in source.read(piece).records.collect())
    assert rows == [100, 101, 102, 103]
    earliest = source_of(spark, kafka, topic=name, schema={"n": "int"})
    assert earliest.initial_offsets() == {f"{name}:0": 0, f"{name}:1": 0}


@pytest.mark.parametrize("local", [True, False])
def test_transactional_input_reads_committed_records_only_across_markers(
        spark: Any, kafka: Any, local: bool) -> None:
    from confluent_kafka import Producer

    from streamer.runtime.plan.local import is_local

    name = topic(kafka, 1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap,
                         "transactional.id": f"tx-{name}"})
    producer.init_transactions(30)
    for n, (count, commit) in enumerate([(3, True), (4, False), (2, True)]):
        producer.begin_transaction()
        for i in range(count):
            producer.produce(name, json.dumps({"n": n * 10 + i}))
        producer.flush(30)  # in the log before the abort (which would otherwise purge them)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    # The coordinator writes the transaction markers after the commit returns; until the last
    # one is written the last stable offset is below the end.
    probe = source_of(spark, kafka, topic=name, schema={"n": "int"})
    deadline = time.monotonic() + 30
    while probe.watermarks([f"{name}:0"])[f"{name}:0"][1] < 12 and time.monotonic() < deadline:
        time.sleep(0.1)
    source = source_of(spark, kafka, topic=name, schema={"n": "int"}, bounded=True)
    offsets = source.initial_offsets()
    piece = source.plan(offsets, 0)
    assert piece is not None
    # 9 records and 3 transaction markers: the range covers 12 offsets.
    assert dict(piece.end) == {f"{name}:0": 12}
    if not local:
        source.ctx.local_rows = 0
    read = source.read(piece)
    assert read.local == local and is_local(read.records) == local
    assert sorted(r["n"] for r in read.records.collect()) == [0, 1, 2, 20, 21]
    assert source.exhausted(piece.end)
    if local:  # the driver's consumer is kept: a second read of the slice gives it again
        again = source.read(piece)
        assert sorted(r["n"] for r in again.records.collect()) == [0, 1, 2, 20, 21]
    source.close()


def test_raw_format_gives_record_columns(spark: Any, kafka: Any) -> None:
    name = topic(kafka, 1)
    kafka.produce(name, [("k1", b"\x00\x01binary", 0), (None, "text", 0)])
    source = source_of(spark, kafka, topic=name, format="raw", bounded=True)
    piece = source.plan(source.initial_offsets(), 0)
    assert piece is not None
    rows = source.read(piece).records.orderBy("offset").collect()
    assert [(r["key"], bytes(r["value"]), r["partition"], r["offset"]) for r in rows] == [
        (b"k1", b"\x00\x01binary", 0, 0), (None, b"text", 0, 1)]
    assert all(r["topic"] == name and r["timestamp"] is not None for r in rows)


def test_a_missing_topic_is_an_error_naming_it(spark: Any, kafka: Any) -> None:
    from streamer.connectors.exceptions import ConnectorError

    source = source_of(spark, kafka, topic="no-such-topic", schema={"n": "int"})
    with pytest.raises(ConnectorError, match="cannot read topic 'no-such-topic'"):
        source.initial_offsets()


# -------------------------------------------------------------------------------- sink
def sink_of(spark: Any, kafka: Any, name: str, tmp_path: Path, *, exactly_once: bool = True,
            job: str = "t") -> KafkaSink:
    doc = {"name": job, "sources": [{"id": "g", "type": "datagen", "limit": 1,
                                     "fields": {"x": "offset"}}],
           "sinks": [{"id": "out", "type": "kafka", "input": "g", "topic": name,
                      "bootstrap_servers": kafka.bootstrap, "key": "user"}]}
    spec = load_pipeline_text(yaml.safe_dump(doc, sort_keys=False))
    ctx = ConnectorContext(spark, job, storage_url=str(tmp_path / "storage"),
                           exactly_once=exactly_once)
    sink = KafkaSink(spec.sinks[0], ctx)
    sink.open()
    return sink


def frame(spark: Any, start: int, n: int) -> Any:
    return spark.sql(f"SELECT concat('u', id % 3) AS user, id AS n, "
                     f"timestamp_millis(1767225600000 + id * 500) AS ts "
                     f"FROM range({start}, {start + n})")


def test_exactly_once_records_appear_at_commit_once_even_when_committed_again(
        spark: Any, kafka: Any, tmp_path: Path) -> None:
    name = topic(kafka, 2)
    sink = sink_of(spark, kafka, name, tmp_path)
    first = sink.write(1, frame(spark, 0, 50))
    second = sink.write(2, frame(spark, 50, 30))
    assert rows_of(kafka, name) == Counter()  # staged, not in Kafka
    sink.commit(1, first)
    assert sum(rows_of(kafka, name).values()) == 50
    sink.commit(1, first)  # again: a no-op
    sink.close()
    # A new process (a new sink object) commits the checkpoint's handles again after a crash.
    again = sink_of(spark, kafka, name, tmp_path)
    again.commit(1, first)
    again.commit(2, second)
    again.commit(2, second)
    got = kafka.read(name)
    assert sorted(json.loads(v)["n"] for _k, v, _p, _o in got) == list(range(80))
    one = next(json.loads(v) for k, v, _p, _o in got if json.loads(v)["n"] == 1)
    assert one == {"user": "u1", "n": 1, "ts": "2026-01-01T00:00:00.5Z"}
    by_key = {}
    for key, _v, part, _o in got:  # a key always goes to one partition
        assert by_key.setdefault(key, part) == part
    assert list((tmp_path / "storage" / "t" / "sinks" / "out").iterdir()) == []
    again.close()


def test_a_new_lineage_commits_epochs_the_old_one_already_had(
        spark: Any, kafka: Any, tmp_path: Path) -> None:
    name = topic(kafka, 1)
    sink = sink_of(spark, kafka, name, tmp_path)
    for epoch in (1, 2, 3):
        sink.commit(epoch, sink.write(epoch, frame(spark, epoch * 10, 10)))
    sink.recover(0)  # e.g. restored from a savepoint: epoch numbers start over
    sink.commit(2, sink.write(2, frame(spark, 100, 5)))
    assert sum(rows_of(kafka, name).values()) == 35
    sink.close()


def test_a_dead_runs_open_transaction_is_fenced_and_never_visible(
        spark: Any, kafka: Any, tmp_path: Path) -> None:
    from confluent_kafka import Producer

    name = topic(kafka, 1)
    zombie = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": "streamer.t.out"})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(name, json.dumps({"zombie": True}))
    zombie.flush(30)
    sink = sink_of(spark, kafka, name, tmp_path)
    sink.commit(1, sink.write(1, frame(spark, 0, 5)))
    values = [json.loads(v) for _k, v, _p, _o in kafka.read(name)]
    assert len(values) == 5 and not any("zombie" in v for v in values)
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException):
        zombie.commit_transaction(10)  # fenced
    sink.close()


def test_at_least_once_sink_produces_at_write(spark: Any, kafka: Any, tmp_path: Path) -> None:
    name = topic(kafka, 2)
    sink = sink_of(spark, kafka, name, tmp_path, exactly_once=False)
    handle = sink.write(1, frame(spark, 0, 40).repartition(3))
    assert handle["records"] == 40
    assert sum(rows_of(kafka, name, "read_uncommitted").values()) == 40
    sink.close()


def test_kafka_to_windows_to_kafka_in_process_with_checkpoints(
        spark: Any, kafka: Any, tmp_path: Path) -> None:
    source, out = topic(kafka, 2), topic(kafka, 2)
    kafka.produce(source, [(None, {"user": f"u{i % 4}", "ts": 1767225600000 + i * 250}, i % 2)
                           for i in range(400)])
    result, _sinks = run(spark, job("k2k", storage=tmp_path / "storage",
                                    checkpoint="{interval: 1ms}") + counts(kafka, source, out),
                         checkpoints=True)
    assert result.status == "finished" and len(result.checkpoints) >= 2
    got = [json.loads(v) for _k, v, _p, _o in kafka.read(out)]
    assert sum(r["n"] for r in got) == 400
    assert len(got) == len({(r["user"], r["window_start"]) for r in got}) == 4 * 10


@pytest.mark.slow
def test_spark_client_reads_what_the_confluent_client_reads(kafka: Any, tmp_path: Path) -> None:
    """`client: spark` (Spark's Kafka connector, its jars put on the session by `streamer
    run`) and the default confluent client give one job the same output and dead letters."""
    import subprocess
    import sys

    source = topic(kafka, 2)
    kafka.produce(source, [(None, {"user": f"u{i % 6}", "ts": 1767225600000 + i * 300}, i % 2)
                           for i in range(1000)] + [(None, "oops", 1)])
    outputs = {}
    for client in ("confluent", "spark"):
        out = topic(kafka, 2)
        path = tmp_path / f"{client}.yaml"
        path.write_text(
            f"name: clients-{client}\nstorage: {tmp_path / 'storage'}\n"
            + counts(kafka, source, out, per_epoch=200, client=client, on_error="bad",
                     more_sinks=files_sink(None, tmp_path / client / "bad", id="bad")))
        streamer = Path(sys.executable).with_name("streamer")
        done = subprocess.run([str(streamer), "run", str(path), "--no-ui", "--quiet"],
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        bad = [json.loads(line) for f in sorted((tmp_path / client / "bad").glob("part-*"))
               for line in f.read_text().splitlines()]
        outputs[client] = (rows_of(kafka, out), [(b["split"], b["offset"], b["record"])
                                                 for b in bad])
    assert sum(outputs["confluent"][0].values()) == 6 * 30  # 300 s of clicks, 6 users
    assert outputs["confluent"][1] == [(f"{source}:1", "500", "oops")]
    assert outputs["spark"] == outputs["confluent"]


def test_watermark_is_per_partition_the_slowest_one_holds_it(spark: Any, kafka: Any) -> None:
    """Partition 0 runs 100 s ahead of partition 1 in event time: the job's watermark follows
    partition 1 (a per-source watermark would follow partition 0 and drop p1's records)."""
    name = topic(kafka, 2)
    base = 1767225600000
    kafka.produce(name, [(None, {"p": 0, "ts": base + i * 1000}, 0) for i in range(100, 110)]
                  + [(None, {"p": 1, "ts": base + i * 1000}, 1) for i in range(10)])
    result, sinks = run(spark, f"""
        name: wm-test
        sources:
          - id: src
            type: kafka
            bootstrap_servers: {kafka.bootstrap}
            topic: {name}
            bounded: true
            max_records_per_epoch: 5
            schema: {{p: int, ts: bigint}}
            event_time: timestamp_millis(ts)
            watermark: {{max_out_of_orderness: 1s}}
        operators:
          - id: per_10s
            input: src
            key_by: p
            window: {{tumbling: 10s}}
            aggregate: {{n: count()}}
        sinks:
          - id: out
            type: console
            input: per_10s
        """)
    first = result.metrics[0]
    # Epoch 1 read p0 up to 104 s and p1 up to 4 s: the watermark is p1's, 4 s - 1 s.
    assert first.watermark == base + 3000
    assert sorted((r["p"], r["n"]) for r in sinks["out"].committed) == [(0, 10), (1, 10)]


def test_a_local_read_that_fails_is_a_clear_restartable_error(
        spark: Any, kafka: Any, monkeypatch: Any) -> None:
    """A slice read on the driver whose partition is gone fails as a failed read task
    would: a message naming the source, partition and offsets (`ReadFailed`, which the
    runtime turns into a failed epoch and a restart)."""
    from streamer.connectors.base import SourceSlice
    from streamer.connectors.exceptions import ReadFailed
    from streamer.connectors.kafka import kafka_source

    monkeypatch.setattr(kafka_source, "READ_TIMEOUT_S", 2.0)  # (no progress for 60 s)

    name = topic(kafka, 1)
    source = source_of(spark, kafka, topic=name, schema={"n": "int"})
    gone = f"gone-{uuid.uuid4().hex[:8]}"
    piece = SourceSlice(source_id="src", start={f"{gone}:0": 0}, end={f"{gone}:0": 5},
                        payload={"ranges": [[gone, 0, 0, 5]]})
    started = time.monotonic()
    with pytest.raises(ReadFailed) as failed:
        source.read(piece)
    assert time.monotonic() - started < 20
    text = str(failed.value)
    assert text.startswith(f"source 'src' cannot read {gone}:0 offsets [0, 5) from "), text
    assert "check that the broker is running" in text
    source.close()
