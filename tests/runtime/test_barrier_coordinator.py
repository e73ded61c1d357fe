"""The continuous mode's barrier coordinator (`runtime.job.barrier_coordinator`) over its
real control plane (Arrow Flight on 127.0.0.1), without Spark: a source subtask's client
follows its barriers and acknowledges each with a position, a keyed subtask's with the
handle of a real snapshot. A checkpoint completes once both acknowledged, in the epoch
mode's `_metadata`; one a subtask does not acknowledge is declined, nothing is written for
it, its late acknowledgement is ignored, and the next one completes.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from streamer.checkpoint.checkpoint_metadata import CheckpointError, CheckpointStore
from streamer.exchange.coordination import CoordinationClient
from streamer.runtime.job.barrier_coordinator import (
    BarrierCoordinator,
    CheckpointDeclinedError,
    GangLayout,
    KeyedLayout,
    keyed_handles,
    keyed_task,
    source_positions,
    source_task,
)
from streamer.state import key_group_range, open_backend
from streamer.state.snapshot import take_snapshot


def position(rows: int) -> dict[str, Any]:
    """A source subtask's position after `rows` rows of file `a`."""
    return {"done": [], "file": "a", "row": rows, "records": rows, "ended": False,
            "epoch_offsets": {"files": ["z"] if rows > 2 else []},
            "watermark": {"current": rows * 10, "finished": [],
                          "splits": [["events", "files", rows * 10, 0]], "operators": {}}}


def test_checkpoints_complete_on_every_ack_and_are_declined_without_one(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "storage"), "job")
    layout = GangLayout("job", {"events": ("events-uid", 1)},
                        {"count": KeyedLayout("count-uid", "memory", 1, 8)})
    coordinator = BarrierCoordinator(layout, store, run_id="run")
    source = CoordinationClient(coordinator.location, source_task("events", 0))
    keyed = CoordinationClient(coordinator.location, keyed_task("count", 0))
    barriers: list[int] = []
    seen = threading.Condition()

    def on_barrier(n: int) -> None:
        source.ack(n, position(n))
        with seen:
            barriers.append(n)
            seen.notify_all()

    backend = open_backend("memory", str(tmp_path / "state"), "job", "count-uid", 0,
                           key_group_range(0, 1, 8))
    try:
        source.follow_barriers(on_barrier)
        handles = {}
        for n in (1, 2, 3):
            checkpoint = coordinator.trigger()
            assert checkpoint == n
            with seen:
                assert seen.wait_for(lambda n=n: n in barriers, 30)
            backend.commit(n)
            handles[n] = take_snapshot(backend, store.url, n, base=None, local_copy_root=None)
            if n == 2:  # the keyed subtask does not acknowledge in time
                with pytest.raises(CheckpointDeclinedError, match=r"keyed/count/0"):
                    coordinator.wait(n, 1.0)
                keyed.ack(n, {"snapshot": handles[n]})  # late: ignored
                continue
            keyed.ack(n, {"snapshot": handles[n]})
            meta = coordinator.wait(n, 30)
            assert meta.checkpoint_id == n and meta.epoch == n
    finally:
        backend.close()
        source.close()
        keyed.close()
        coordinator.close()
    assert coordinator.completed == [1, 3]
    with pytest.raises(CheckpointError, match="never completed"):
        store.read(2)
    meta = store.read(3)
    assert source_positions(meta, "events-uid") == {0: position(3)}
    assert meta.offsets["events-uid"]["files"] == ["z"]
    assert keyed_handles(meta, "count-uid") == {0: handles[3]}
    assert meta.watermark["current"] == 30
    assert meta.watermark["splits"] == [["events", "files@0", 30, 0]]
    assert meta.uids == {"sources": {"events": "events-uid"},
                         "operators": {"count": "count-uid"}}
