"""A continuous source subtask over Kafka partitions
(`runtime.continuous.source_splits.KafkaSplits`) on the real broker, without Spark in the
subtask (the chain is compiled once with Spark): its position at barrier n is each partition's
next offset after exactly the records it sent before the barrier, in the epoch mode's offsets
format; resumed there it sends the rest; its watermark is the least of its partitions'; once
every partition idled it says so on its channels, and records make it active again. """

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from test_continuous_gang import (  # (tests/runtime on sys.path)
    close_channels,
    compiled_chain,
    keyed_config,
)

from streamer.columns import EVENT_TIME
from streamer.exchange.alignment import Barrier, Idle, Records, Watermark
from streamer.exchange.flight import ExchangeSender, ExchangeServer
from streamer.pipeline.source_spec import SourceSpec, WatermarkSpec
from streamer.pipeline.yaml_loader import Path as YamlPath
from streamer.runtime.arrow.arrow_input import ArrowInput
from streamer.runtime.arrow.arrow_sql import Program
from streamer.runtime.continuous.source_splits import KafkaSplits, end_offsets
from streamer.runtime.continuous.source_subtask import KeyedRoute, SourcePlan, SourceSubtask

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

COLUMNS = (("k", "string"), ("v", "bigint"), ("ts", "bigint"))
OOO_MS = 30
TS = pa.timestamp("us", tz="UTC")


@pytest.fixture(scope="module")
def chain(spark: Any) -> tuple[Program, Program]:
    """The event time `timestamp_millis(ts)` and the filter `v >= 0`, compiled by Spark."""
    return compiled_chain(spark, COLUMNS, "timestamp_millis(ts)")


def plan_for(chain: tuple[Program, Program], bootstrap: str, tmp: Any,
             idle_ms: int | None = None) -> SourcePlan:
    """A Kafka source's plan (JSON values, read_committed) feeding a rolling count."""
    spec = SourceSpec(id="events", type="kafka", uid="events-uid", schema=COLUMNS,
                      event_time="timestamp_millis(ts)",
                      watermark=WatermarkSpec(OOO_MS, idle_ms), on_error=None, options={},
                      path=YamlPath("p.yaml"))
    conf = {"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False, "enable.partition.eof": True,
            "auto.offset.reset": "error", "isolation.level": "read_committed"}
    arrow = ArrowInput("events", "kafka", ("keep",), COLUMNS, chain[0], chain[1], (), conf)
    route = KeyedRoute(keyed_config(tmp, 2), ("string",), (("k", pa.string()), (EVENT_TIME, TS)),
                       EVENT_TIME)
    return SourcePlan(spec, arrow, route)


def produce(kafka: Any, topic: str, per_partition: int, seed: int) -> list[list[dict[str, Any]]]:
    """`per_partition` records (k, v, ts ms) in each of 2 partitions, rising times."""
    rnd = random.Random(seed)
    records = [[{"k": rnd.choice("abcdef"), "v": rnd.randint(-3, 20),
                 "ts": 1_000 + i * 10 + rnd.randint(0, OOO_MS)} for i in range(per_partition)]
               for _ in range(2)]
    kafka.produce(topic, [(None, r, p) for p in range(2) for r in records[p]])
    return records


class Channels:
    """Two real channels in this process (one per keyed subtask) and their senders."""

    def __init__(self, plan: SourcePlan) -> None:
        self.servers = [ExchangeServer("127.0.0.1", 1, 16 << 20) for _ in range(2)]
        self.senders = [ExchangeSender(s.location, 0, plan.out_schema()) for s in self.servers]
        self.messages: list[list[Any]] = [[], []]

    def drain(self) -> list[list[Any]]:
        """Every message so far, per channel."""
        for server, got in zip(self.servers, self.messages, strict=True):
            while server.buffered_bytes(0):
                got.append(server.take(0))
        return self.messages

    def close(self) -> None:
        """Close the senders (ended first, if the source did not) and servers."""
        close_channels(self.senders, self.servers)


def sent(messages: list[Any]) -> Counter[str]:
    """Per key, the records the messages carry (the partials' counts)."""
    out: Counter[str] = Counter()
    for m in messages:
        if isinstance(m, Records):
            for r in m.payload.to_pylist():
                out[r["k"]] += r["__p0"]
    return out


def oracle(rows: list[dict[str, Any]]) -> Counter[str]:
    """Per key, its records that pass the filter."""
    return Counter(r["k"] for r in rows if r["v"] >= 0)


def test_a_kafka_source_barrier_position_resume_and_watermark(kafka: Any, chain: Any,
                                                              tmp_path: Any) -> None:
    topic = kafka.create_topic(f"cont-{uuid.uuid4().hex[:8]}", 2)
    records = produce(kafka, topic, 150, seed=4)
    plan = plan_for(chain, kafka.bootstrap, tmp_path)
    splits = [f"{topic}:0", f"{topic}:1"]
    assert plan.input.conf is not None
    stop = end_offsets(plan.input.conf, splits)
    assert stop == dict.fromkeys(splits, 150)
    channels = Channels(plan)
    acks: dict[int, dict[str, Any]] = {}
    try:
        src = SourceSubtask(plan, KafkaSplits(plan.input, dict.fromkeys(splits, 0), 40,
                                              stop_at=stop), channels.senders,
                            ack=acks.__setitem__)
        step = 0
        while True:
            if step in (1, 3, 4, 7):  # (at least 8 slices of 40 rows, then the end)
                src.inject(step)
            step += 1
            if not src.step():
                break
        messages = channels.drain()
    finally:
        channels.close()
    assert sorted(acks) == [1, 3, 4, 7] and src.records == 300
    for n, position in acks.items():
        offsets = position["offsets"]
        assert position["epoch_offsets"] == offsets and set(offsets) == set(splits)
        before = [r for p in range(2) for r in records[p][:offsets[f"{topic}:{p}"]]]
        assert position["records"] == len(before)
        got = sum((sent(c[:c.index(Barrier(n))] if Barrier(n) in c else c) for c in messages),
                  Counter())
        assert got == oracle(before), f"barrier {n} at {offsets}"
        marks = [m.ms for m in messages[0][:messages[0].index(Barrier(n))]
                 if isinstance(m, Watermark)] if Barrier(n) in messages[0] else []
        parts = [records[p][:offsets[f"{topic}:{p}"]] for p in range(2)]
        if all(parts):
            least = min(max(r["ts"] for r in part) for part in parts) - OOO_MS
            assert marks and marks[-1] == least == position["watermark"]["current"]
    middle = acks[3]
    assert 0 < sum(middle["offsets"].values()) < 300
    channels = Channels(plan)
    try:
        resumed = SourceSubtask(plan, KafkaSplits(plan.input, dict.fromkeys(splits, 0), 40,
                                                  stop_at=stop), channels.senders,
                                ack=lambda n, p: None, position=middle)
        resumed.run()
        rest = channels.drain()
    finally:
        channels.close()
    before = [r for p in range(2) for r in records[p][:middle["offsets"][f"{topic}:{p}"]]]
    assert sent(rest[0]) + sent(rest[1]) == oracle(records[0] + records[1]) - oracle(before)


def test_a_kafka_source_marks_its_channels_idle(kafka: Any, chain: Any, tmp_path: Any) -> None:
    topic = kafka.create_topic(f"idle-{uuid.uuid4().hex[:8]}", 2)
    records = produce(kafka, topic, 20, seed=5)
    plan = plan_for(chain, kafka.bootstrap, tmp_path, idle_ms=300)
    splits = [f"{topic}:0", f"{topic}:1"]
    channels = Channels(plan)
    try:
        src = SourceSubtask(plan, KafkaSplits(plan.input, dict.fromkeys(splits, 0), 40),
                            channels.senders, ack=lambda n, p: None)

        def until(what: Any, timeout_s: float = 30.0) -> None:
            deadline = time.monotonic() + timeout_s
            while not what(channels.drain()[0]):
                assert time.monotonic() < deadline, channels.messages[0]
                src.step()

        until(lambda got: any(isinstance(m, Idle) for m in got))
        first = channels.messages[0].index(Idle())
        assert src.records == 40 and src.idle
        more = produce(kafka, topic, 5, seed=6)
        until(lambda got: any(isinstance(m, Records) for m in got[first:]))
        until(lambda got: got.count(Idle()) == 2)  # idle again, told once more
    finally:
        channels.close()
    assert src.records == 50
    assert sent(channels.messages[0]) + sent(channels.messages[1]) == oracle(
        records[0] + records[1] + more[0] + more[1])
