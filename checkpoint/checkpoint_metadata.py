"""Completed checkpoints on the job's storage: `_metadata`, listing, validation, pruning.

Layout under `<storage>/<job>/checkpoints/` (docs/concepts/checkpoints.md, in the spirit of
Flink's):

    chk-<n>/_metadata                     the checkpoint exists iff this file does (written last,
                                          atomically; JSON with a sha256 of its own body)
    chk-<n>/<uid>/subtask-<k>/...         files only checkpoint n uses (private)
    shared/<uid>/subtask-<k>/...          rocksdb SSTs that several checkpoints reference

A checkpoint records, at one epoch boundary: each source's offsets per split (by source uid),
the watermark tracker, each keyed operator's subtask state handles (by operator uid), the sink
handles staged since the previous checkpoint (committed right after `_metadata` is written and
again, idempotently, on recovery), and the next timer per keyed operator.

Shared files are reference-counted by the retained checkpoints' `_metadata` themselves: pruning
keeps the newest `retain` completed checkpoints and deletes every shared file none of them
references. Nothing else tracks references, so a crash anywhere leaves nothing to reconcile.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from streamer.exceptions import StreamerError
from streamer.storage import MissingFileError, Storage, StorageError

FORMAT = 1
METADATA = "_metadata"
SHARED = "shared"
_CHK = re.compile(r"^chk-(\d+)$")


class CheckpointError(StreamerError):
    """A checkpoint cannot be written, read or used."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's `_metadata` or one of its files is damaged or missing."""


def checkpoint_root(storage_url: str, job: str) -> str:
    """The URL of a job's checkpoint directory: `<storage>/<job>/checkpoints`."""
    return f"{storage_url.rstrip('/')}/{job}/checkpoints"


@dataclass
class OperatorState:
    """One keyed operator's state in a checkpoint: a handle per subtask."""

    node: str
    backend: str
    parallelism: int
    max_parallelism: int
    subtasks: list[dict[str, Any]]

    @property
    def state_size(self) -> int:
        """Bytes of state referenced (shared and private)."""
        return sum(int(h.get("state_size", 0)) for h in self.subtasks)

    @property
    def uploaded_bytes(self) -> int:
        """Bytes uploaded by this checkpoint (the incremental part)."""
        return sum(int(h.get("uploaded_bytes", 0)) for h in self.subtasks)


@dataclass
class CheckpointMetadata:
    """What `chk-<n>/_metadata` holds."""

    checkpoint_id: int
    job: str
    run_id: str
    epoch: int
    created_at: float
    mode: str
    #: source uid -> split -> offset (JSON values)
    offsets: dict[str, dict[str, Any]]
    #: the watermark tracker (see `runtime.watermarks.WatermarkTracker.to_json`)
    watermark: dict[str, Any]
    #: operator uid -> its subtasks' state handles
    operators: dict[str, OperatorState] = field(default_factory=dict)
    #: sink id -> [[epoch, handle], ...] staged since the previous checkpoint, to commit
    sinks: dict[str, list[list[Any]]] = field(default_factory=dict)
    #: operator uid -> {"event": ms | None, "processing": ms | None}
    next_timers: dict[str, dict[str, int | None]] = field(default_factory=dict)
    #: source id -> uid and operator id -> uid, so a changed pipeline is recognized
    uids: dict[str, dict[str, str]] = field(default_factory=dict)
    duration_ms: float = 0.0
    #: records read since the previous checkpoint and in all, per source uid
    records: dict[str, int] = field(default_factory=dict)

    # ------------------------------------------------------------------ figures
    @property
    def state_size(self) -> int:
        """Bytes of keyed state the checkpoint references."""
        return sum(op.state_size for op in self.operators.values())

    @property
    def uploaded_bytes(self) -> int:
        """Bytes this checkpoint uploaded (new SSTs, private files)."""
        return sum(op.uploaded_bytes for op in self.operators.values())

    def referenced(self) -> set[str]:
        """Storage-relative paths of every state file the checkpoint needs."""
        return {f["path"] for op in self.operators.values() for h in op.subtasks
                for f in h.get("files", [])}

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        """The JSON body of `_metadata`."""
        body = asdict(self)
        body["format"] = FORMAT
        return body

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> CheckpointMetadata:
        """Parse the body of `_metadata` (raises KeyError/TypeError/ValueError if malformed)."""
        if body.get("format") != FORMAT:
            msg = f"checkpoint format {body.get('format')!r} is not {FORMAT}"
            raise ValueError(msg)
        data = {k: v for k, v in body.items() if k != "format"}
        data["operators"] = {uid: OperatorState(**op) for uid, op in data["operators"].items()}
        return cls(**data)


def _encode(meta: CheckpointMetadata) -> bytes:
    body = json.dumps(meta.to_json(), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(body.encode()).hexdigest()
    return json.dumps({"sha256": digest, "metadata": json.loads(body)}, sort_keys=True,
                      indent=1).encode()


def _decode(raw: bytes, where: str) -> CheckpointMetadata:
    try:
        envelope = json.loads(raw)
        body = envelope["metadata"]
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        if hashlib.sha256(text.encode()).hexdigest() != envelope["sha256"]:
            msg = f"{where}: the checksum does not match its contents"
            raise CorruptCheckpointError(msg)
        return CheckpointMetadata.from_json(body)
    except CorruptCheckpointError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        msg = f"{where}: unreadable ({type(exc).__name__}: {exc})"
        raise CorruptCheckpointError(msg) from exc


@dataclass
class Listed:
    """One `chk-<n>` directory: its metadata, or why it is not a usable checkpoint."""

    checkpoint_id: int
    meta: CheckpointMetadata | None
    problem: str | None = None

    @property
    def complete(self) -> bool:
        """Whether the checkpoint has valid metadata and every file it references."""
        return self.meta is not None and self.problem is None


class CheckpointStore:
    """A job's checkpoints on fsspec storage."""

    def __init__(self, storage_url: str, job: str) -> None:
        self.url = checkpoint_root(storage_url, job)
        self.job = job
        self.storage = Storage(self.url)

    @staticmethod
    def dir_of(checkpoint_id: int) -> str:
        """`chk-<n>`."""
        return f"chk-{checkpoint_id}"

    def ids(self) -> list[int]:
        """The ids of every `chk-<n>` directory, completed or not, ascending."""
        found = []
        for name in self.storage.ls(""):
            match = _CHK.match(name.rstrip("/").rsplit("/", 1)[-1])
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def next_id(self) -> int:
        """An id above every existing `chk-<n>` (failed ones included)."""
        ids = self.ids()
        return (ids[-1] + 1) if ids else 1

    def write(self, meta: CheckpointMetadata) -> None:
        """Complete a checkpoint: create its `_metadata` atomically and exclusively (a
        conditional PUT on an object store), so a run that lost its claim to the job cannot
        replace a checkpoint another run completed. Writing the same bytes again is fine."""
        rel, body = f"{self.dir_of(meta.checkpoint_id)}/{METADATA}", _encode(meta)
        if not self.storage.create_exclusive(rel, body) and self.storage.read_bytes(rel) != body:
            msg = (f"checkpoint {meta.checkpoint_id} of job {self.job!r} was completed by "
                   f"another run ({self.storage.path(rel)}); is a second run of the job "
                   "writing to the same storage? `streamer list` shows the runs")
            raise CheckpointError(msg)

    def read(self, checkpoint_id: int) -> CheckpointMetadata:
        """The metadata of checkpoint `checkpoint_id` (CorruptCheckpointError if damaged,
        CheckpointError if it does not exist or never completed)."""
        rel = f"{self.dir_of(checkpoint_id)}/{METADATA}"
        where = f"checkpoint {checkpoint_id} of job {self.job!r} ({self.storage.path(rel)})"
        try:
            raw = self.storage.read_bytes(rel)
        except MissingFileError as exc:
            msg = f"{where} does not exist or never completed"
            raise CheckpointError(msg) from exc
        except StorageError as exc:
            msg = f"{where}: cannot read it: {exc}"
            raise CorruptCheckpointError(msg) from exc
        meta = _decode(raw, where)
        if meta.checkpoint_id != checkpoint_id:
            msg = f"{where}: its metadata says it is checkpoint {meta.checkpoint_id}"
            raise CorruptCheckpointError(msg)
        return meta

    def check_files(self, meta: CheckpointMetadata) -> str | None:
        """Why the checkpoint's state files are not all there with their sizes (None: fine).
        Contents are verified against their sha256 when a subtask restores them."""
        sizes = {f["path"]: f["size"] for op in meta.operators.values() for h in op.subtasks
                 for f in h.get("files", [])}
        for path, size in sorted(sizes.items()):
            try:
                found = self.storage.info(path)
            except StorageError as exc:
                return f"cannot read {path}: {exc}"
            if found is None:
                return f"file {path} is missing"
            if found != size:
                return f"file {path} has {found} bytes, its checkpoint recorded {size}"
        return None

    def list(self, *, check_files: bool = True) -> builtins.list[Listed]:
        """Every `chk-<n>` directory, newest first, with its metadata or problem."""
        out = []
        for cid in reversed(self.ids()):
            try:
                meta = self.read(cid)
            except CheckpointError as exc:
                if not self.storage.exists(f"{self.dir_of(cid)}/{METADATA}"):
                    out.append(Listed(cid, None, "incomplete: no _metadata (it failed or was "
                                                 "interrupted)"))
                else:
                    out.append(Listed(cid, None, str(exc)))
                continue
            problem = self.check_files(meta) if check_files else None
            out.append(Listed(cid, meta, problem))
        return out

    def latest(self, *, skipped: builtins.list[Listed] | None = None,
               exclude: Iterable[int] = ()) -> CheckpointMetadata | None:
        """The newest complete checkpoint not in `exclude`; damaged ones newer than it are
        added to `skipped` (incomplete ones, which never completed, are not)."""
        excluded = set(exclude)
        for item in self.list():
            if item.checkpoint_id in excluded:
                continue
            if item.complete:
                return item.meta
            if skipped is not None and not (item.problem or "").startswith("incomplete"):
                skipped.append(item)
        return None

    def resolve(self, ref: str) -> CheckpointMetadata:
        """A checkpoint named by its id (`7`) or a path/URL ending in `chk-7`."""
        text = ref.rstrip("/")
        if text.endswith(f"/{METADATA}"):
            text = text[: -len(METADATA) - 1]
        tail = text.rsplit("/", 1)[-1]
        match = _CHK.match(tail)
        if text.isdigit():
            cid = int(text)
        elif match:
            cid = int(match.group(1))
        else:
            msg = f"{ref!r} names no checkpoint; give its number (e.g. 7) or its chk-7 path"
            raise CheckpointError(msg)
        meta = self.read(cid)
        problem = self.check_files(meta)
        if problem:
            msg = f"checkpoint {cid} of job {self.job!r} cannot be used: {problem}"
            raise CorruptCheckpointError(msg)
        return meta

    # ------------------------------------------------------------------ cleanup
    def prune(self, retain: int, *, keep: Iterable[int] = (),
              temporaries_after_s: float | None = None) -> builtins.list[int]:
        """Keep the newest `retain` complete checkpoints (and `keep`); delete older ones,
        failed ones older than the newest complete one, shared files nothing retained
        references, and (with `temporaries_after_s`) temporary files of writes and uploads
        that were killed midway, once they are that old. Returns the deleted checkpoint ids."""
        if temporaries_after_s is not None:
            self.storage.remove_stale_temporaries("", temporaries_after_s)
        listed = self.list(check_files=False)
        complete = [item for item in listed if item.meta is not None]
        kept = {item.checkpoint_id for item in complete[:retain]} | set(keep)
        newest = complete[0].checkpoint_id if complete else None
        deleted = []
        for item in listed:
            cid = item.checkpoint_id
            if cid in kept or newest is None or cid > newest:
                continue  # a newer incomplete one may still be in progress
            self.storage.rm(self.dir_of(cid), recursive=True)
            deleted.append(cid)
        referenced: set[str] = set()
        for item in complete:
            if item.checkpoint_id in kept and item.meta is not None:
                referenced |= item.meta.referenced()
        self._prune_shared(referenced, newest)
        return deleted

    def _prune_shared(self, referenced: set[str], newest: int | None) -> None:
        if newest is None:
            return
        base = self.storage.path("").rstrip("/") + "/"
        try:
            found = self.storage.fs.find(self.storage.path(SHARED))
        except FileNotFoundError:
            return
        for full in found:
            rel = full[len(base):] if full.startswith(base) else full
            if rel not in referenced and not rel.rsplit("/", 1)[-1].startswith("."):
                self.storage.rm(rel)

    def delete_all(self) -> None:
        """Remove every checkpoint of the job (a fresh start)."""
        self.storage.rm("", recursive=True)


def now() -> float:
    """Seconds since the Unix epoch (checkpoint creation times)."""
    return time.time()
