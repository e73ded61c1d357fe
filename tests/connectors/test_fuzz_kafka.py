"""Fuzzing Kafka values: random bytes and truncated JSON among good records, read from a real
broker (tests/kafka_broker.py) by a source with `on_error`. The job must finish and account
for every record produced: each in the output or, with its partition and offset, in the dead
letters; every good record arrives. The driver's consumer (a local epoch) and consumers in
Spark tasks both read them. Derandomized and few examples, as each is a Spark run."""

from __future__ import annotations

import json
import textwrap
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from streamer.connectors.base import ConnectorContext
from streamer.connectors.builtin.memory_sink import MemorySink
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
SETTINGS = settings(max_examples=2, deadline=None, database=None, derandomize=True,
                    phases=[Phase.explicit, Phase.generate],  # each example is a Spark run
                    suppress_health_check=list(HealthCheck))
GOOD = 30
#: Damage to one record's value: random bytes, or its JSON cut short (at 0: an empty value).
DAMAGE = st.lists(st.tuples(st.integers(0, 10_000),
                            st.one_of(st.binary(min_size=1, max_size=40), st.integers(0, 30))),
                  max_size=8)


def values(damage: list[tuple[int, Any]]) -> tuple[list[bytes], set[int]]:
    """The values to produce (`GOOD` JSON records, some damaged) and the indexes damaged."""
    out = [json.dumps({"n": i, "s": f"v{i}"}).encode() for i in range(GOOD)]
    touched = set()
    for where, what in damage:
        i = where % GOOD
        out[i] = what if isinstance(what, bytes) else out[i][:what]
        touched.add(i)
    return out, touched


@pytest.mark.parametrize("local", [True, False], ids=["driver-consumer", "task-consumers"])
@SETTINGS
@given(damage=DAMAGE)
@example(damage=[(1, b"\xff\xfe\x00garbage"), (2, 5), (3, b'{"n": "x"}'), (4, 0),
                 (5, b"\x00" * 40), (6, b'{"n": 1e400}'), (7, b"[1, 2]")])
def test_damaged_kafka_values_are_output_or_dead_letters(spark: Any, kafka: Any, local: bool,
                                                        damage: Any) -> None:
    produced, touched = values(damage)
    name = kafka.create_topic(f"fuzz-{uuid.uuid4().hex[:10]}", 2)
    kafka.produce(name, [(None, v, i % 2) for i, v in enumerate(produced)])
    spec = load_pipeline_text(textwrap.dedent(f"""
        name: fuzz-kafka
        job: {{execution: {{local_rows: {1000 if local else 0}}}}}
        sources:
          - id: src
            type: kafka
            bootstrap_servers: {kafka.bootstrap}
            topic: {name}
            bounded: true
            schema: {{n: bigint, s: string}}
            on_error: dead
        sinks:
          - {{id: out, type: console, input: src}}
          - {{id: dead, type: console}}
        """))
    memories: dict[str, MemorySink] = {}

    def sinks(s: Any, ctx: ConnectorContext) -> MemorySink:
        memories[s.id] = MemorySink(s, ctx)
        return memories[s.id]

    result = JobRunner(spec, RunOptions(ui=False), spark=spark, sink_factory=sinks).run()
    assert result.status == "finished", result.reason
    out, dead = memories["out"].committed, memories["dead"].committed
    assert len(out) + len(dead) == len(produced), (len(out), dead)
    assert set(range(GOOD)) - touched <= {r["n"] for r in out}  # every good record
    assert all(d["source"] == "src" and d["error"] and d["split"].startswith(f"{name}:")
               and d["offset"] is not None for d in dead), dead
    positions = {(d["split"], d["offset"]) for d in dead}
    assert len(positions) == len(dead)  # each dead letter a record of its own
    assert result.dead_letters == len(dead) and result.records_in == len(out)
