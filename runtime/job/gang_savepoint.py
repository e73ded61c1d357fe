"""Savepoints of a continuous job (issue 36): `savepoint trigger` and `stop --savepoint` take
a checkpoint of the gang at once, and the driver writes the savepoint from it.

The epoch mode has its keyed subtasks write their key groups in the savepoint format at the
savepoint epoch. A continuous job's subtasks are busy with the stream, so the driver does
it from the checkpoint instead: each subtask's snapshot is restored into a scratch directory,
opened on its backend and written with `savepoint.format.write_key_groups`, exactly what the
subtask would have written at that barrier. The savepoint's offsets and watermark are the
checkpoint's (a Kafka source's offsets are exact in either mode; a files source's positions
name the rows of the file each subtask was reading).
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from streamer.checkpoint.checkpoint_metadata import CheckpointMetadata


def savepoint_of_checkpoint(owner: Any, node_id: str | None, meta: CheckpointMetadata,
                            url: str) -> bool:
    """Write savepoint `url` from checkpoint `meta` of the gang whose keyed operator is
    `node_id` (None: a stateless one); whether it was written (a failure is reported and
    answered by `complete_savepoint`)."""
    from streamer.runtime.job.savepointing import complete_savepoint

    job = owner.job
    keyed: dict[str, list[dict[str, Any]]] = {}
    if node_id is not None:
        try:
            keyed[node_id] = _key_groups(job, node_id, meta, url, owner.checkpoints.store.url)
        except Exception as exc:  # reported as the savepoint's failure; the job goes on
            keyed[node_id] = [{"subtask": -1,
                               "savepoint_error": f"{type(exc).__name__}: {exc}"}]
    uid_of = {s.uid: s.id for s in job.spec.sources}
    sources = ({uid: dict(o) for uid, o in meta.offsets.items() if uid in uid_of},
               dict(meta.watermark))
    return complete_savepoint(job, owner.control, url, meta.epoch, keyed,
                              checkpointed=True, sources=sources)


def _key_groups(job: Any, node_id: str, meta: CheckpointMetadata, url: str,
                checkpoints_url: str) -> list[dict[str, Any]]:
    """Each subtask's savepoint handle, written from its snapshot in `meta`."""
    from streamer.savepoint.format import write_key_groups
    from streamer.state import SubtaskLocation, key_group_range, open_backend
    from streamer.state.snapshot import restore_snapshot

    stage = job.keyed[node_id]
    cfg = stage.base_config
    state = meta.operators[stage.op.uid]
    scratch = tempfile.mkdtemp(prefix="streamer-savepoint-")
    metas = []
    try:
        for handle in sorted(state.subtasks, key=lambda h: int(h["subtask"])):
            subtask = int(handle["subtask"])
            location = SubtaskLocation(scratch, cfg.job, cfg.uid, subtask)
            restore_snapshot(handle, checkpoints_url, location, local_copy_root=None)
            groups = key_group_range(subtask, state.parallelism, state.max_parallelism)
            with open_backend(state.backend, scratch, cfg.job, cfg.uid, subtask,
                              groups) as backend:
                metas.append({"subtask": subtask,
                              "savepoint": write_key_groups(backend, url, cfg.uid, subtask)})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return metas

