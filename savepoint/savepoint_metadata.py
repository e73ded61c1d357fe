"""Savepoints as directories: `_metadata`, listing, disposal, and the compatibility check that
decides, per operator, whether a pipeline can take a savepoint's state.

    <savepoint dir>/_metadata             JSON: format, job, streamer version, pipeline
                                          fingerprint, epoch, max_parallelism, source offsets
                                          by uid, watermark, per operator uid its definition,
                                          state names and kinds, key counts and files
    <savepoint dir>/<uid>/kg-<n>.parquet  the canonical state of one key group (savepoint.format)

A savepoint is self-contained (nothing points into checkpoint storage) and relocatable: file
paths in `_metadata` are relative to its directory, so a copy anywhere restores the same.
Savepoints are created under `<storage>/<job>/savepoints/` unless a target is given, and they
never expire: only `streamer savepoint dispose` deletes one.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from streamer.pipeline.spec import OperatorSpec, PipelineSpec
from streamer.savepoint.exceptions import SavepointError
from streamer.storage import MissingFileError, Storage, StorageError

FORMAT = 1
METADATA = "_metadata"

__all__ = ["SavepointError", "SavepointMetadata", "plan_restore", "read_metadata"]


def operator_definition(op: OperatorSpec) -> dict[str, Any]:
    """What an operator's state layout depends on: keys, window, aggregates, dedupe, process
    class. Lateness, emit mode, late outputs, parallelism and backend are not part of it."""
    window = None
    if op.window is not None:
        w = op.window
        window = {"kind": w.kind, "size_ms": w.size_ms, "slide_ms": w.slide_ms,
                  "gap_ms": w.gap_ms, "count": w.count, "time": w.time or "event"}
    out: dict[str, Any] = {"kind": op.keyed_kind, "key_by": list(op.key_by), "window": window,
                           "aggregates": [[a.name, a.function, a.arg,
                                           *([a.filter] if a.filter else [])]
                                          for a in op.aggregates],
                           "dedupe": op.dedupe_within_ms is not None, "process": op.process}
    if op.broadcast is not None:  # (absent without: older savepoints still match)
        out["broadcast"] = op.broadcast
    if op.top_n is not None:  # (the rows kept per key depend on n and the order)
        out["top_n"] = {"n": op.top_n.n, "order_by": [list(o) for o in op.top_n.order_by]}
    if op.join is not None:  # (absent for other operators: older savepoints still match)
        j = op.join
        jw = j.window
        out["join"] = {"type": j.type, "left_key": list(j.left_key),
                       "right_key": list(j.right_key), "between": (
                           [j.lower_ms, j.upper_ms] if j.mode in ("interval", "regular") else None),
                       "window": ({"kind": jw.kind, "size_ms": jw.size_ms,
                                   "slide_ms": jw.slide_ms} if jw is not None else None)}
        if j.mode == "table":  # (absent for interval and window joins: older savepoints match)
            out["join"]["table"] = j.as_of or "processing_time"
    return out


def pipeline_fingerprint(spec: PipelineSpec) -> str:
    """A sha256 over the sources', operators' and sinks' definitions (not tests or spark)."""
    parts = {
        "sources": [[s.id, s.uid, s.type, s.event_time] for s in spec.sources],
        "operators": [[o.id, o.uid, o.kind, list(o.inputs), o.filter, list(o.columns),
                       operator_definition(o) if o.kind == "keyed" else None]
                      for o in spec.operators],
        "sinks": [[k.id, k.type, list(k.inputs)] for k in spec.sinks]}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class SavepointMetadata:
    """The body of a savepoint's `_metadata`."""

    job: str
    created_at: float
    streamer_version: str
    pipeline_fingerprint: str
    epoch: int
    max_parallelism: int
    offsets: dict[str, dict[str, Any]]
    watermark: dict[str, Any]
    #: uid -> {"node", "definition", "states": {name: kind}, "parallelism", "backend",
    #: "files": [...], "keys": {state: n}, "bytes"}
    operators: dict[str, dict[str, Any]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # uid -> type
    run_id: str = ""
    drained: bool = False

    def to_json(self) -> dict[str, Any]:
        """The JSON body of `_metadata`."""
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> SavepointMetadata:
        """Parse `_metadata` (ValueError/KeyError/TypeError if malformed)."""
        if body.get("format") != FORMAT:
            msg = f"savepoint format {body.get('format')!r}; this streamer reads {FORMAT}"
            raise ValueError(msg)
        return cls(**{k: v for k, v in body.items() if k != "format"})

    @property
    def size(self) -> int:
        """Bytes of state files."""
        return sum(int(op.get("bytes", 0)) for op in self.operators.values())


def new_savepoint_url(storage_url: str, job: str, target: str | None = None) -> str:
    """A new savepoint directory: under `target` if given, else `<storage>/<job>/savepoints`."""
    base = target or f"{storage_url.rstrip('/')}/{job}/savepoints"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    url = Storage(f"{base.rstrip('/')}/savepoint-{stamp}-{uuid.uuid4().hex[:6]}").url
    return url.removeprefix("file://")  # a local savepoint is shown as a plain path


def write_metadata(url: str, meta: SavepointMetadata) -> None:
    """Complete a savepoint (written last, atomically)."""
    body = json.dumps(meta.to_json(), sort_keys=True, indent=1).encode()
    digest = hashlib.sha256(body).hexdigest()
    Storage(url).write_atomic(METADATA, json.dumps(
        {"sha256": digest, "metadata": meta.to_json()}, sort_keys=True, indent=1).encode())


def read_metadata(url: str) -> SavepointMetadata:
    """A savepoint's metadata (SavepointError if it is missing, incomplete or damaged)."""
    storage = Storage(url)
    try:
        raw = storage.read_bytes(METADATA)
    except MissingFileError as exc:
        msg = (f"{storage.url} is not a savepoint (no {METADATA}: wrong path, or the "
               "savepoint never completed)")
        raise SavepointError(msg) from exc
    except StorageError as exc:
        msg = f"cannot read savepoint {storage.url}: {exc}"
        raise SavepointError(msg) from exc
    try:
        envelope = json.loads(raw)
        body = envelope["metadata"]
        text = json.dumps(body, sort_keys=True, indent=1).encode()
        if hashlib.sha256(text).hexdigest() != envelope["sha256"]:
            msg = f"savepoint {storage.url}: {METADATA} does not match its checksum"
            raise SavepointError(msg)
        return SavepointMetadata.from_json(body)
    except SavepointError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        msg = f"savepoint {storage.url}: {METADATA} is unreadable ({exc})"
        raise SavepointError(msg) from exc


def list_savepoints(storage_url: str, job: str) -> list[tuple[str, SavepointMetadata | None,
                                                              str | None]]:
    """(url, metadata or None, problem) of every savepoint under the job's default place."""
    base = Storage(f"{storage_url.rstrip('/')}/{job}/savepoints")
    out: list[tuple[str, SavepointMetadata | None, str | None]] = []
    for name in base.ls(""):
        url = base.child(name).url
        try:
            out.append((url, read_metadata(url), None))
        except SavepointError as exc:
            out.append((url, None, str(exc)))
    return sorted(out, key=lambda item: item[1].created_at if item[1] else 0, reverse=True)


def dispose(url: str) -> None:
    """Delete a savepoint directory (after checking it is one)."""
    read_metadata(url)
    storage = Storage(url)
    storage.rm("", recursive=True)


# ---------------------------------------------------------------------- compatibility
@dataclass
class Decision:
    """What restoring does with one operator's state."""

    operator: str  # operator id in the pipeline, or the uid if the pipeline lacks it
    uid: str
    action: str  # restore | start-empty | drop | refuse
    reason: str


def plan_restore(meta: SavepointMetadata, spec: PipelineSpec, *,
                 allow_non_restored: bool = False) -> list[Decision]:
    """Per keyed operator: restore its state, start it empty (new operator), drop state whose
    operator is gone (only with `allow_non_restored`), or refuse (state it cannot read)."""
    decisions = []
    keyed = {op.uid: op for op in spec.operators if op.kind == "keyed"}
    mp = spec.job.max_parallelism
    for uid, op in keyed.items():
        saved = meta.operators.get(uid)
        if saved is None:
            decisions.append(Decision(op.id, uid, "start-empty",
                                      "new operator: no state for its uid in the savepoint"))
            continue
        changes = _changes(saved.get("definition", {}), operator_definition(op))
        if meta.max_parallelism != mp:
            changes.insert(0, f"max_parallelism changed from {meta.max_parallelism} to {mp} "
                              "(key groups are fixed for the life of the state)")
        if changes:
            decisions.append(Decision(op.id, uid, "refuse", "; ".join(changes)))
        else:
            keys = sum(int(v) for v in saved.get("keys", {}).values())
            decisions.append(Decision(op.id, uid, "restore",
                                      f"{keys:,} entries, {len(saved.get('files', []))} key "
                                      "group files"))
    for uid, saved in meta.operators.items():
        if uid in keyed:
            continue
        node = str(saved.get("node", uid))
        if allow_non_restored:
            decisions.append(Decision(node, uid, "drop", "no operator with this uid; its "
                                      "state is dropped (--allow-non-restored-state)"))
        else:
            decisions.append(Decision(node, uid, "refuse", "no operator with this uid in the "
                                      "pipeline; give it back its uid, or pass "
                                      "--allow-non-restored-state to drop the state"))
    return decisions


def _changes(was: dict[str, Any], now: dict[str, Any]) -> list[str]:
    out = []
    labels = {"kind": "the operator kind", "key_by": "key_by", "window": "the window",
              "aggregates": "the aggregates", "dedupe": "dedupe", "process": "the process "
              "function", "join": "the join", "top_n": "the top-N (n, order_by)"}
    for name, label in labels.items():
        if was.get(name) != now.get(name):
            out.append(f"{label} changed from {_show(was.get(name))} to {_show(now.get(name))}"
                       " (the saved state cannot be read with the new definition)")
    if was.get("broadcast") is not None and was.get("broadcast") != now.get("broadcast"):
        # (adding a broadcast input is fine: its broadcast state starts empty)
        out.append(f"the broadcast input changed from {_show(was.get('broadcast'))} to "
                   f"{_show(now.get('broadcast'))} (the saved broadcast state was built from "
                   "the old input's records; keep its id, or restore without the state)")
    return out


def _show(value: Any) -> str:
    if isinstance(value, list) and value and isinstance(value[0], list):
        return "[" + ", ".join(f"{a[0]}: {a[1]}({a[2] or ''})" for a in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items() if v is not None) + "}"
    return json.dumps(value)
