"""The processes of the exchange tests (tests/exchange/test_flight.py): a receiving subtask
and its senders, each in a process of its own (spawned: they import this module)."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from streamer.exchange.alignment import (
    AdvanceWatermark,
    BarrierAligner,
    Deliver,
    InputFinished,
    TakeSnapshot,
)
from streamer.exchange.flight import ExchangeSender, ExchangeServer
from streamer.exchange.gate import InputGate

SCHEMA = pa.schema([("seq", pa.int64()), ("checkpoint", pa.int64()), ("pad", pa.binary())])


def rows(start: int, n: int, checkpoint: int, pad: int = 0) -> pa.RecordBatch:
    """Records `start`..`start + n - 1` of checkpoint `checkpoint`, each `pad` bytes heavier."""
    return pa.record_batch([pa.array(range(start, start + n), pa.int64()),
                            pa.array([checkpoint] * n, pa.int64()),
                            pa.array([b"x" * pad] * n, pa.binary())], schema=SCHEMA)


def receive(channels: int, capacity: int, ports: Any, results: Any, *, delay_s: float = 0.0,
            go: Any = None, idle_timeout_s: float = 60.0) -> None:
    """Serve `channels` channels on 127.0.0.1 and consume them through the aligner (after
    `go` is set, if given; `delay_s` per message: a slow subtask) until every channel
    ended; report what it saw to `results`."""
    server = ExchangeServer("127.0.0.1", channels, capacity)
    ports.put(server.port)
    seen: dict[str, Any] = {"seqs": {c: [] for c in range(channels)}, "snapshots": [],
                            "watermarks": [], "misplaced": 0, "rows": 0}
    try:
        if go is not None:
            go.wait(60)
        gate = InputGate(server, BarrierAligner(channels))
        last = time.monotonic()
        while not gate.aligner.finished:
            events = gate.poll(timeout_s=1.0)
            if events:
                last = time.monotonic()
            elif time.monotonic() - last > idle_timeout_s:
                raise TimeoutError("no message for a minute")
            for event in events:
                if isinstance(event, Deliver):
                    batch = event.payload
                    seen["seqs"][event.channel].extend(batch.column("seq").to_pylist())
                    seen["rows"] += batch.num_rows
                    # Every record of checkpoint n comes after snapshot n - 1, before snapshot n.
                    seen["misplaced"] += sum(
                        1 for c in batch.column("checkpoint").to_pylist()
                        if c != len(seen["snapshots"]) + 1)
                    if delay_s:
                        time.sleep(delay_s)
                elif isinstance(event, TakeSnapshot):
                    seen["snapshots"].append(event.checkpoint)
                elif isinstance(event, AdvanceWatermark):
                    seen["watermarks"].append(event.ms)
                else:
                    assert isinstance(event, InputFinished)
        seen["peaks"] = [server.peak_bytes(c) for c in range(channels)]
        results.put(seen)
    except Exception as exc:  # reported to the test, which fails with it
        results.put({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        server.close()


def send(location: str, channel: int, plan: list[tuple[Any, ...]], progress: Any,
         results: Any, timeout_s: float = 30.0) -> None:
    """Run `plan` on channel `channel`: ("rows", start, n, checkpoint, pad), ("barrier", n),
    ("watermark", ms), ("end",); count each step done in `progress`; report the outcome."""
    start = time.monotonic()
    try:
        sender = ExchangeSender(location, channel, SCHEMA, timeout_s=timeout_s)
        for step in plan:
            if step[0] == "rows":
                sender.send(rows(*step[1:]))
            elif step[0] == "barrier":
                sender.barrier(step[1])
            elif step[0] == "watermark":
                sender.watermark(step[1])
            else:
                sender.end()
            with progress.get_lock():
                progress.value += 1
        results.put({"channel": channel, "ok": True})
    except Exception as exc:
        results.put({"channel": channel, "error": type(exc).__name__, "message": str(exc),
                     "elapsed": time.monotonic() - start})
