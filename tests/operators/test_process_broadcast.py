"""`run_process` with a broadcast input, on a real memory backend (no Spark): the order in
which a subtask applies an epoch's broadcast and keyed records, and what broadcast state
allows where."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamer.columns import BROADCAST, EVENT_TIME_MS, KEY_GROUP, OUT, ROW_KIND, SEQUENCE
from streamer.operators.process import (
    Context,
    KeyedProcessFunction,
    MapState,
    ProcessFunctionError,
    ValueState,
    run_process,
)
from streamer.state import key_group_range, open_backend
from streamer.state.memory_files import drop_process_cache


class Log(KeyedProcessFunction):
    """Outputs what it saw: each keyed record with the rules then in broadcast state."""

    output_schema = "what string"

    def open(self, ctx: Context) -> None:
        self.rules = ctx.broadcast_state(MapState("rules"))

    def process_broadcast_element(self, row: dict[str, Any], ctx: Context) -> Iterator[dict]:
        self.rules.put(row["name"], ctx.timestamp)
        yield {"what": f"rule {row['name']}"}

    def process_element(self, row: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        yield {"what": f"{row['k']} saw {[k for k, _ in self.rules.items()]}"}


class WritesInProcessElement(Log):
    def process_element(self, row: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        self.rules.put("sneaky", 1)
        return iter(())


class KeyedStateInBroadcast(Log):
    def process_broadcast_element(self, row: dict[str, Any], ctx: Context) -> Iterator[dict]:
        ctx.get_state(ValueState("count")).update(1)
        return iter(())


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Any]:
    opened = open_backend("memory", str(tmp_path), "job", "op", 1, key_group_range(1, 2, 128))
    yield opened
    opened.close()
    drop_process_cache()


def keyed(k: str, kg: int, ts: int, seq: int) -> dict[str, Any]:
    return {"k": k, KEY_GROUP: kg, EVENT_TIME_MS: ts, SEQUENCE: seq, BROADCAST: None}


def rule(name: str, ts: int, seq: int) -> dict[str, Any]:
    return {"k": None, KEY_GROUP: None, EVENT_TIME_MS: ts, SEQUENCE: seq,
            BROADCAST: {"name": name}}


def run(fn: type[KeyedProcessFunction], backend: Any, rows: list[dict[str, Any]]) -> list[str]:
    out = run_process(fn, ("k",), ("k",), rows, backend, 0, 0)
    return [r["what"] for r in out if r[ROW_KIND] == OUT]


def test_broadcast_records_apply_first_in_event_time_then_arrival_order(backend: Any) -> None:
    rows = [keyed("a", 70, 1, 1), rule("late", 9, 2), keyed("b", 64, 5, 3),
            rule("early", 3, 7), rule("tie", 9, 1)]
    assert run(Log, backend, rows) == [
        "rule early", "rule tie", "rule late", "b saw ['early', 'late', 'tie']",
        "a saw ['early', 'late', 'tie']"]
    # The state lives in the subtask's first key group and outlasts the epoch.
    backend.commit(1)
    assert [k for k, _ in backend.map_items("broadcast.rules", 64, b"", b"")] == [
        b"early", b"late", b"tie"]
    assert run(Log, backend, [keyed("c", 80, 10, 1)]) == ["c saw ['early', 'late', 'tie']"]


def test_broadcast_state_is_read_only_outside_process_broadcast_element(backend: Any) -> None:
    with pytest.raises(ProcessFunctionError, match="read-only in process_element"):
        run(WritesInProcessElement, backend, [rule("r", 1, 1), keyed("a", 70, 2, 2)])


def test_keyed_state_is_not_available_for_a_broadcast_record(backend: Any) -> None:
    with pytest.raises(ProcessFunctionError, match="not available in process_broadcast"):
        run(KeyedStateInBroadcast, backend, [rule("r", 1, 1)])


def test_broadcast_state_must_be_a_map_state(backend: Any) -> None:
    ctx = Context(backend, 0, 0, {})
    with pytest.raises(ProcessFunctionError, match="must be a MapState"):
        ctx.broadcast_state(ValueState("rules"))  # type: ignore[arg-type]


PIPELINE = """
name: p
sources:
  - {id: src, type: datagen, fields: {x: "offset"}}
  - {id: rules, type: datagen, fields: {r: "offset"}}
  - {id: other_rules, type: datagen, fields: {r: "offset"}}
operators:
  - {id: k, input: src, key_by: [x], process: "fraud:Detector"BROADCAST}
sinks:
  - {id: out, type: console, input: k}
  - {id: unused, type: console, input: [UNUSED]}
"""


def spec_with(broadcast: str | None) -> Any:
    from streamer.pipeline.validate import load_pipeline_text

    unused = [r for r in ("rules", "other_rules") if r != broadcast]
    return load_pipeline_text(PIPELINE.replace(
        "BROADCAST", f", broadcast: {broadcast}" if broadcast else "").replace(
        "UNUSED", ", ".join(unused)), env={})


@pytest.mark.parametrize(("was", "now", "action"), [
    ("rules", "rules", "restore"), (None, "rules", "restore"),
    ("rules", "other_rules", "refuse"), ("rules", None, "refuse")])
def test_restore_refuses_a_changed_or_removed_broadcast_input(
        was: str | None, now: str | None, action: str) -> None:
    from streamer.savepoint.savepoint_metadata import (
        SavepointMetadata,
        operator_definition,
        plan_restore,
    )

    saved = spec_with(was).operators[0]
    meta = SavepointMetadata(job="p", created_at=0, streamer_version="", pipeline_fingerprint="",
                             epoch=1, max_parallelism=128, offsets={}, watermark={},
                             operators={"k": {"definition": operator_definition(saved)}})
    [decision] = plan_restore(meta, spec_with(now))
    assert decision.action == action, decision
    if action == "refuse":
        assert "broadcast input changed" in decision.reason
