"""The continuous mode's crash campaign (issue 36): Kafka -> filter -> keyed tumbling window
-> transactional Kafka sink, one barrier stage of long-running subtasks, SIGKILLed 10 times
(`STREAMER_TEST_CONTINUOUS_CRASH_KILLS`) and restarted each time: at every fail point of a
continuous checkpoint once, then again in a new order, with random kills between:

- `barrier-injected`: the driver injected barrier n, no subtask has aligned on it yet;
- `mid-upload`: a keyed subtask is half-way through uploading its snapshot of n;
- `in-task`: a keyed subtask uploaded its snapshot of n, not acknowledged yet;
- `after-metadata`: `_metadata` of n is written, the sink's transaction not begun;
- `mid-transaction`: the sink's records of n are produced in its open transaction;
- `random`: the whole run (driver, JVM, Python workers), at a random moment.

Each kill is armed for the run's first or second checkpoint, so it lands mid-stream. The
runs share one warm Spark JVM (`warm_jvm.py`, as the epoch mode's crash campaigns do): a
fail point kills the driver and the JVM's Python workers (the subtasks), and the next run's
driver stops what is left in the JVM before it starts; the campaign's first kill and its
random ones kill the JVM too, as a machine crash does. The last run goes to the end; a
`read_committed` consumer then sees exactly what one uninterrupted run writes, each record
once. A run whose stream runs out before its fail point ends that lap (its output is checked
the same way) and the kills go on in a new one.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fragments import CLICKS_SCHEMA, CRASH_AGGREGATE, click_records, kafka_sink, window
from streamer_process import Run, next_checkpoint, quick_jvm
from test_crash import RandomCrash
from warm_jvm import WarmJvm, run_warm

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

KILLS = int(os.environ.get("STREAMER_TEST_CONTINUOUS_CRASH_KILLS", "10"))
SEED = int(os.environ.get("STREAMER_TEST_CRASH_SEED", str(random.randrange(1 << 30))))
PER_PARTITION = 80_000
POINTS = ("barrier-injected", "mid-upload", "in-task", "after-metadata", "mid-transaction",
          "random")
JOB = "ccrash"


def pipeline(root: Path, bootstrap: str, source: str, sink: str) -> Path:
    """The campaign's job: exactly once, checkpoints every 300 ms."""
    text = f"""\
name: {JOB}
storage: {root / 'storage'}
job:
  parallelism: 2
  checkpoint: {{interval: 300ms}}
  execution: {{mode: continuous}}
sources:
  - id: clicks
    type: kafka
    bootstrap_servers: {bootstrap}
    topic: {source}
    bounded: true
    schema: {CLICKS_SCHEMA}
    event_time: timestamp_millis(ts)
    watermark: {{max_out_of_orderness: 1s}}
operators:
  - {{id: paid, input: clicks, filter: "amount >= 1"}}
{window("per_window", "paid", "5s", CRASH_AGGREGATE)}sinks:
{kafka_sink("per_window", bootstrap, sink)}{quick_jvm()}"""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "job.yaml"
    path.write_text(text)
    return path


def committed(kafka: Any, topic: str) -> Counter[str]:
    """What a read_committed consumer sees: (key, value) pairs as canonical JSON."""
    return Counter(json.dumps([key, json.loads(value)], sort_keys=True)
                   for key, value, _p, _o in kafka.read(topic, "read_committed"))


def test_sigkill_a_continuous_job_at_its_fail_points_then_read_committed_sees_each_once(
        kafka: Any, tmp_path: Path, warm_jvm: WarmJvm) -> None:
    jvm = warm_jvm
    source = kafka.create_topic(f"ccrash-in-{uuid.uuid4().hex[:8]}", 2)
    kafka.produce(source, click_records(PER_PARTITION))
    out = kafka.create_topic(f"ccrash-ref-{uuid.uuid4().hex[:8]}", 2)
    reference = run_warm(jvm, pipeline(tmp_path / "reference", kafka.bootstrap, source, out))
    assert reference.returncode == 0, reference.stderr[-3000:]
    want = committed(kafka, out)
    assert sum(want.values()) > 100

    rng = random.Random(SEED)
    log = [f"seed {SEED} (STREAMER_TEST_CRASH_SEED={SEED} repeats the choices)"]
    deck: list[str] = []
    kills = laps = 0
    while kills < KILLS:
        laps += 1
        assert laps <= 3, "the kills do not take effect\n" + "\n".join(log)
        root = tmp_path / f"lap-{laps}"
        out = kafka.create_topic(f"ccrash-out-{uuid.uuid4().hex[:8]}", 2)
        path = pipeline(root, kafka.bootstrap, source, out)
        log.append(f"lap {laps}")
        while kills < KILLS:
            if not deck:
                deck = list(POINTS)
                rng.shuffle(deck)
            point = deck.pop()
            machine = kills == 0 or point == "random"
            starts = jvm.starts
            run, what, number = crash_run(jvm, path, root, point, rng, machine)
            done = [e["id"] for e in run.checkpoints("completed")]
            log.append(f"{what}: {'killed' if run.killed else run.returncode}, "
                       f"checkpoints {done} ({'new' if jvm.starts > starts else 'warm'} JVM"
                       f"{', killed too' if machine and run.killed else ''})")
            print(log[-1], flush=True)
            if run.killed:
                kills += 1
                continue
            # Not killed: only right if the stream ran out before the kill came (its
            # checkpoint never taken, or the run over before the random moment); this lap's
            # output is then complete.
            assert run.returncode == 0 and run.finished is not None \
                and run.finished["status"] == "finished" \
                and all(n < number for n in done) \
                and (point != "mid-transaction" or run.finished["records_out"] == 0), \
                "\n".join(log) + "\n" + run.stderr[-3000:]
            break
        else:
            last = run_warm(jvm, path)
            assert last.returncode == 0, "\n".join(log) + "\n" + last.stderr[-3000:]
        got = committed(kafka, out)
        assert got == want, ("\n".join(log) + f"\nmissing {sum((want - got).values())}, "
                             f"twice or more {sum((got - want).values())}")


def crash_run(jvm: WarmJvm, path: Path, root: Path, point: str, rng: random.Random,
              machine: bool) -> tuple[Run, str, int]:
    """One run on `jvm` armed to die at `point` (with the JVM if `machine`): the run, what
    was armed, and the first checkpoint id it cannot complete unkilled (none for `random`
    and `mid-transaction`, which is armed for the run's first commit of records: a run left
    nothing to read commits none)."""
    if point == "random":
        delay = rng.uniform(0.5, 4.0)  # (after `started`, or at the 1st completed checkpoint)
        return run_warm(jvm, path, watch=RandomCrash(0, delay), machine_crash=True), \
            f"random {delay:.2f}s after start", 1 << 30
    number = next_checkpoint(root / "storage" / JOB / "checkpoints") + (rng.random() < 0.3)
    if point == "mid-transaction":  # (a sink epoch: the run's first commit of records; a run
        number = 1                  # that produces none never reaches it)
    run = run_warm(jvm, path, env={"STREAMER_TEST_FAILPOINTS": f"{point}:{number}"},
                   machine_crash=machine)
    return run, f"{point}:{number}", 1 << 30 if point == "mid-transaction" else number
