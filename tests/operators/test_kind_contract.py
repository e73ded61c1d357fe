"""The keyed operator contract, tested once over every registered kind (operators/kinds.py),
as the state-backend contract is: each kind runs a small job whose state and timers cross a
savepoint taken mid-run on RocksDB at parallelism 2, restored on the memory backend at
parallelism 3, and the committed output equals an uninterrupted run's. A kind registered
without a case here fails `test_every_registered_kind_has_a_case`.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from streamer.operators.kinds import KINDS
from streamer.pipeline.validate import load_pipeline
from streamer.runtime.job.control import ControlChannel
from streamer.runtime.job.coordinator import JobRunner, RunOptions
from streamer.runtime.observe.metrics import JsonReporter

pytestmark = pytest.mark.spark

BASE = 1_767_225_600_000

#: Kind name -> its operators (reading `bids`, and `asks` for a join), the last one the
#: sink's input.
CASES: dict[str, str] = {
    "window": """
  - id: op
    input: bids
    key_by: [auction]
    window: {sliding: {size: 4s, slide: 2s}}
    aggregate: {n: count(), top: max(price), first_price: first(price)}""",
    "aggregate": """
  - id: op
    input: bids
    key_by: [auction]
    aggregate: {n: count(), total: sum(price), low: min(price)}""",
    "dedupe": """
  - id: op
    input: bids
    key_by: [auction, price]
    dedupe: {within: 3s}""",
    "join": """
  - id: op
    join: {left: bids, right: asks, on: [auction], between: [-2s, 2s], type: left,
           right_prefix: a_}""",
    "process": """
  - id: op
    input: bids
    key_by: [auction]
    process: "contract_process:CountThenEmit\"""",
    "over": """
  - id: op
    input: bids
    key_by: [auction]
    over: {rows: 3}
    aggregate: {recent_avg: avg(price), recent_top: max(price), n: count()}""",
    "top_n": """
  - id: op
    input: bids
    key_by: [auction]
    window: {tumbling: 5s}
    top_n: {n: 2, order_by: [price desc]}""",
}


ASKS = f"""\
  - id: asks
    type: datagen
    limit: 300
    max_records_per_epoch: 100
    fields:
      auction: "cast(offset % 11 as bigint)"
      ask: "cast(offset % 17 as bigint)"
      ts: "timestamp_millis({BASE} + offset * 100)"
    event_time: ts
    watermark: {{max_out_of_orderness: 1s}}
"""


def pipeline(root: Path, kind: str, backend: str, parallelism: int) -> Path:
    text = textwrap.dedent(f"""\
name: contract-{kind.replace("_", "-")}
storage: {root / "storage"}
job:
  parallelism: {parallelism}
  max_parallelism: 16
  checkpoint: {{interval: 1ms}}
  state: {{backend: {backend}, local_dir: {root / "state" / backend}}}
sources:
  - id: bids
    type: datagen
    splits: 2
    limit: 600
    max_records_per_epoch: 200
    fields:
      auction: "cast(offset % 9 as bigint)"
      price: "cast((offset * 31 + split * 7) % 41 as bigint)"
      ts: "timestamp_millis({BASE} + offset * 50 - case when offset % 5 = 2 then 900 else 0 end)"
    event_time: ts
    watermark: {{max_out_of_orderness: 1s}}
{ASKS if kind == 'join' else ''}operators:{CASES[kind]}
sinks:
  - {{id: out, type: files, input: op, path: {root / "out"}, format: jsonl}}
""")
    path = Path(__file__).parent / f".contract-{kind}-{root.name}.yaml"
    path.write_text(text)
    return path


def committed(directory: Path) -> Counter[str]:
    return Counter(json.dumps(json.loads(line), sort_keys=True)
                   for part in sorted(directory.glob("part-*.jsonl"))
                   for line in part.read_text().splitlines() if line.strip())


def run(path: Path, *, stop_at: int | None = None, spark: Any, **options: Any) -> Any:
    spec = load_pipeline(str(path))
    filed: list[Any] = []
    storage = spec.storage

    class Capture:
        def write(self, s: str) -> None:
            for line in s.splitlines():
                event = json.loads(line) if line else {}
                if stop_at and not filed and event.get("event") == "epoch" \
                        and event["epoch"] >= stop_at:
                    filed.append(ControlChannel(storage, spec.name).request(
                        kind="stop", savepoint=True, drain=False))

        def flush(self) -> None:
            pass

    try:
        return JobRunner(spec, RunOptions(ui=False, checkpoints=True, **options), spark=spark,
                         reporter=JsonReporter(Capture())).run()  # type: ignore[arg-type]
    finally:
        path.unlink()


def test_every_registered_kind_has_a_case() -> None:
    assert set(CASES) == set(KINDS)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_kind_crosses_a_savepoint_rescaled_to_the_other_backend(
        spark: Any, tmp_path: Path, kind: str) -> None:
    reference_root, root = tmp_path / "reference", tmp_path / "moved"
    reference = run(pipeline(reference_root, kind, "memory", 2), spark=spark)
    assert reference.status == "finished"
    expected = committed(reference_root / "out")
    assert expected, "the case emits nothing: it tests nothing"

    stopped = run(pipeline(root, kind, "rocksdb", 2), stop_at=2, spark=spark)
    assert stopped.status == "stopped" and len(stopped.savepoints) == 1
    assert sum(committed(root / "out").values()) < sum(expected.values())
    restored = run(pipeline(root, kind, "memory", 3), spark=spark,
                   from_savepoint=stopped.savepoints[0])
    assert restored.status == "finished"
    assert committed(root / "out") == expected
