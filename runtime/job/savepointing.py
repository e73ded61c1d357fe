"""Writing a savepoint (docs/concepts/savepoints.md): after the savepoint epoch's checkpoint, the
subtasks have written their key groups in the canonical format; this writes the savepoint's
`_metadata` and answers whoever asked (restoring from one is `runtime.job.recovery`)."""

from __future__ import annotations

import time
from typing import Any

from streamer.runtime.job.job_state import JobState
from streamer.runtime.job.jobcontrol import JobControl


def complete_savepoint(job: JobState, control: JobControl, url: str, epoch: int,
                       keyed_metas: dict[str, Any], checkpointed: bool,
                       sources: tuple[dict[str, Any], dict[str, Any]] | None = None) -> bool:
    """Write the savepoint `url` from the subtasks' key-group files; whether it was
    written (a failure is reported and answered, and a failed stop-with-savepoint leaves
    the job running). `sources`: the offsets and watermark to record (default: the job's
    now, `JobState.saved_sources`)."""
    from streamer import __version__
    from streamer.savepoint.savepoint_metadata import (
        SavepointMetadata,
        pipeline_fingerprint,
        write_metadata,
    )

    errors = [] if checkpointed else ["its checkpoint did not complete"]
    operators = _operators(job, keyed_metas, errors)
    if not errors:
        offsets, watermark = sources or job.saved_sources()
        meta = SavepointMetadata(
            job=job.spec.name, created_at=time.time(), streamer_version=__version__,
            pipeline_fingerprint=pipeline_fingerprint(job.spec), epoch=epoch,
            max_parallelism=job.spec.job.max_parallelism,
            offsets=offsets, watermark=watermark, operators=operators,
            sources={s.uid: s.type for s in job.spec.sources}, run_id=job.run_id,
            drained=control.stop_drain and url == control.stop_savepoint)
        try:
            write_metadata(url, meta)
        except Exception as exc:
            errors.append(f"cannot write its _metadata: {exc}")
    if errors:
        reason = "; ".join(errors)
        job.reporter.message(f"savepoint {url} failed: {reason}")
        control.answer(url, "failed", reason=reason)
        if url == control.stop_savepoint:
            control.stop_failed(reason)
        return False
    control.savepoints.append(url)
    job.reporter.message(f"savepoint written: {url}")
    control.answer(url, "completed", epoch=epoch)
    return True


def _operators(job: JobState, keyed_metas: dict[str, Any],
               errors: list[str]) -> dict[str, dict[str, Any]]:
    """Per operator uid: its definition, states, key-group files, keys and size."""
    from streamer.savepoint.savepoint_metadata import operator_definition

    operators: dict[str, dict[str, Any]] = {}
    for node_id, metas in keyed_metas.items():
        stage = job.keyed[node_id]
        files: list[dict[str, Any]] = []
        states: dict[str, str] = {}
        keys: dict[str, int] = {}
        size = 0
        for meta in metas:
            handle = meta.get("savepoint")
            if handle is None:
                errors.append(f"operator {node_id!r} subtask {meta.get('subtask')}: "
                              f"{meta.get('savepoint_error', 'no savepoint files reported')}")
                continue
            files += handle.get("files", [])
            states.update(handle.get("states", {}))
            for name, n in handle.get("keys", {}).items():
                keys[name] = keys.get(name, 0) + int(n)
            size += int(handle.get("bytes", 0))
        operators[stage.op.uid] = {
            "node": node_id, "definition": operator_definition(stage.op),
            "states": states, "parallelism": stage.parallelism,
            "backend": stage.base_config.backend,
            "files": sorted(files, key=lambda f: int(f.get("key_group", 0))),
            "keys": keys, "bytes": size,
            "next_timers": job.next_timers.get(node_id, {})}
    return operators
