"""The processes of the continuous gang test (tests/runtime/test_continuous_gang.py): keyed
and source subtasks, each in a process of its own (spawned: they import this module), as
the tasks of a barrier stage will host them, reaching the coordinator in the test process
over its control plane."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from streamer.exchange.alignment import MIN_WATERMARK, BarrierAligner
from streamer.exchange.coordination import CoordinationClient
from streamer.exchange.flight import ExchangeSender, ExchangeServer
from streamer.exchange.gate import InputGate
from streamer.runtime.job.barrier_coordinator import keyed_task, source_task


def keyed(subtask: int, channels: int, cfg: Any, coordinator: str, url: str, out_dir: str,
          locations: Any, results: Any, handle: dict[str, Any] | None = None,
          watermark: int = MIN_WATERMARK) -> None:
    """Keyed subtask `subtask`: serve `channels` channels, run the loop (restored from
    `handle`, if given) until every channel ended. At each snapshot n it writes what it
    emitted so far to `out-<subtask>-chk-<n>.json` (the output a sink would commit with n)
    before acknowledging; at the end, `final-<subtask>.json`."""
    from streamer.checkpoint.task import TaskCheckpointing, prepare
    from streamer.operators.continuous import ContinuousSubtask, SnapshotTarget
    from streamer.operators.keyed import open_state_of

    try:
        server = ExchangeServer("127.0.0.1", channels, 1 << 20)
        locations.put((subtask, server.location))
        last = 0
        if handle is not None:
            last = int(handle["checkpoint_id"])
            cfg = replace(cfg, checkpointing=TaskCheckpointing(
                url=url, local_copy_root=None, first_epoch=int(handle["version"]) + 1,
                last={subtask: handle}))
            prepare(cfg, subtask)
        backend = open_state_of(cfg, subtask)
        client = CoordinationClient(coordinator, keyed_task("count", subtask))
        emitted: list[list[Any]] = []

        def ack(checkpoint: int, snapshot: dict[str, Any]) -> None:
            path = Path(out_dir) / f"out-{subtask}-chk-{checkpoint}.json"
            path.write_text(json.dumps(emitted))
            client.ack(checkpoint, {"snapshot": snapshot})

        loop = ContinuousSubtask(
            cfg, backend, out=lambda batch: emitted.extend(
                [r["k"], r["n"]] for r in batch.to_pylist()),
            ack=ack, snapshots=SnapshotTarget(url), base=handle, watermark=watermark,
            batch_rows=100)
        loop.run(InputGate(server, BarrierAligner(channels, last_checkpoint=last,
                                                  watermark=watermark)), timeout_s=1.0)
        backend.close()
        (Path(out_dir) / f"final-{subtask}.json").write_text(json.dumps(emitted))
        results.put(("keyed", subtask, "ended", loop.watermark))
    except Exception as exc:  # reported to the test, which fails with it
        results.put(("keyed", subtask, "error", f"{type(exc).__name__}: {exc}"))


def source(subtask: int, files: list[str], plan: Any, locations: list[str], coordinator: str,
           results: Any, position: dict[str, Any] | None = None, pace_s: float = 0.0,
           stall_after: int | None = None) -> None:
    """Source subtask `subtask` over `files`, one channel to each keyed subtask at
    `locations`, following its barriers. With `stall_after`, it stops reading once it read
    that many rows (it still takes barriers) and waits to be killed; `pace_s` between
    slices keeps it slow enough for checkpoints to fall in the middle of its files."""
    from streamer.runtime.continuous.source_splits import FileSplits
    from streamer.runtime.continuous.source_subtask import SourceSubtask

    try:
        schema = plan.out_schema()
        senders = [ExchangeSender(location, subtask, schema) for location in locations]
        client = CoordinationClient(coordinator, source_task(plan.spec.id, subtask))
        src = SourceSubtask(plan, FileSplits(plan.input, files, 40), senders, ack=client.ack,
                            position=position)
        client.follow_barriers(src.inject)
        while src.step():
            time.sleep(pace_s)
            if stall_after is not None and src.records >= stall_after:
                results.put(("source", subtask, "stalled", src.records))
                while True:  # barriers still flow; the test kills the process
                    src.barriers()
                    time.sleep(0.02)
        results.put(("source", subtask, "ended", src.records))
        time.sleep(0.5)  # (the barrier stream's thread may still be reading)
    except Exception as exc:
        results.put(("source", subtask, "error", f"{type(exc).__name__}: {exc}"))
