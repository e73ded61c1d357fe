"""The job registry and control channel, both on the job's storage, so they work wherever
the job runs (locally, or the driver of a spark-submit on a cluster) as long as the storage is
shared.

    <storage>/<job>/job.json                      status, run id, host, pid, start time,
                                                  heartbeat, phase (starting | running |
                                                  restarting), epoch, last checkpoint, figures
    <storage>/<job>/claims/<generation>.json      the run that claimed each generation,
                                                  created exclusively (one winner per race)
    <storage>/<job>/control/requests/<id>.json    savepoint | stop | cancel, from the CLI,
                                                  naming the generation it was sent to
    <storage>/<job>/control/responses/<id>.json   the job's answer (path of a savepoint, ...)

The running job writes `job.json` at every epoch boundary and from a heartbeat thread; a
heartbeat older than the run's `job.heartbeat_timeout` (recorded in `job.json` as
`heartbeat_timeout_s`, so a reader without the pipeline file knows it) means the job is dead
(killed, machine lost), and a new run takes it over. A run on this machine is dead as soon as
its process is gone, so a killed run can be restarted at once. The job polls `control/requests/`
at every epoch boundary, from its first one on, and answers every request it takes
(`runtime.job.jobcontrol`); a client waiting for an answer (`ControlChannel.wait`) watches
`job.json`, so a run that ends or dies first is reported at once.

A run taken over while it was not dead after all (paused, or cut off from the storage for
longer than its heartbeat timeout) finds the newer claim (`claims/<its generation + 1>.json`) at its
next heartbeat, boundary or commit: from then on it writes nothing to `job.json`, commits no
checkpoint and ends with `ClaimLostError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from streamer.exceptions import StreamerError
from streamer.storage import Storage, StorageError

#: The longest time between two heartbeats (a third of the heartbeat timeout, when sooner).
HEARTBEAT_S = 5.0
#: The heartbeat timeout of a record that does not carry one (`job.heartbeat_timeout`'s
#: default; runs before the setting did not record theirs).
STALE_AFTER_S = 30.0
KINDS = ("savepoint", "stop", "cancel")
#: Where runs claim a job, one exclusively created file per generation.
CLAIMS = "claims"
#: Claims lost to other runs before giving up (each loss re-reads the newest claim).
CLAIM_ATTEMPTS = 5


class JobControlError(StreamerError):
    """A job cannot be started, found or controlled."""


class JobAlreadyRunningError(JobControlError):
    """Another run of the job has a live heartbeat."""


class ClaimLostError(JobControlError):
    """Raised in a run that another run took over (its heartbeat looked stale: the process
    was paused, or could not reach the storage): it stops at once, without committing, and
    the newer run carries on from the last checkpoint. Nothing to do unless the takeover was
    unexpected: then look for what paused the run (swap, a stopped container, the storage)."""


def job_storage(storage_url: str, job: str) -> Storage:
    """The job's directory on its storage."""
    return Storage(f"{storage_url.rstrip('/')}/{job}")


def _read_json(storage: Storage, rel: str) -> dict[str, Any] | None:
    try:
        raw = storage.read_bytes(rel)
    except StorageError:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _claim_name(generation: int) -> str:
    return f"{CLAIMS}/{generation:012d}.json"


def _claim_generation(name: str) -> int | None:
    stem = name.removesuffix(".json")
    return int(stem) if name.endswith(".json") and stem.isdigit() else None


def _pid_namespace() -> str | None:
    """The PID namespace of this process (Linux): pids mean something only within one."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _process_gone(record: dict[str, Any]) -> bool:
    """Whether the run of `record` ran here (same host and PID namespace) and its process no
    longer exists: it was killed or crashed, and need not be waited for until its heartbeat
    goes stale. A reused pid keeps the run alive, so this errs on the side of waiting."""
    if record.get("host") != socket.gethostname() \
            or record.get("pid_namespace") != _pid_namespace():
        return False
    try:
        pid = int(record["pid"])
        if pid == os.getpid():
            return False
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (KeyError, TypeError, ValueError, OSError):
        return False
    return False


def heartbeat_timeout(record: dict[str, Any]) -> float:
    """Seconds the heartbeat of `record`'s run may be old before the run is dead."""
    try:
        return float(record.get("heartbeat_timeout_s", STALE_AFTER_S))
    except (TypeError, ValueError):
        return STALE_AFTER_S


def state_of(record: dict[str, Any], now: float | None = None) -> str:
    """Running | finished | stopped | failed | cancelled | dead (running, but its heartbeat is
    stale or its process on this machine is gone)."""
    status = str(record.get("status", "unknown"))
    if status == "running":
        age = (now or time.time()) - float(record.get("heartbeat_at", 0))
        if age > heartbeat_timeout(record) or _process_gone(record):
            return "dead"
    return status


class JobRegistry:
    """`job.json` of one job: claimed by a run, kept fresh by heartbeats, closed at the end."""

    def __init__(self, storage_url: str, job: str,
                 heartbeat_timeout_s: float = STALE_AFTER_S) -> None:
        self.job = job
        #: Recorded in the claim: how old this run's heartbeat may get before it is dead.
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.storage = job_storage(storage_url, job)
        self.record: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The claim of the run that took the job over from this one, once seen.
        self.lost: dict[str, Any] | None = None

    def read(self) -> dict[str, Any] | None:
        """The job's record, or None if it never ran with this storage."""
        return _read_json(self.storage, "job.json")

    def claim(self, run_id: str, info: dict[str, Any]) -> str | None:
        """Register this run; refuse if another run is alive. Returns a note when a dead run
        (stale heartbeat, or its process on this machine gone) was taken over.

        A claim is the exclusive creation of `claims/<generation>.json`, one past the newest
        (`Storage.create_exclusive`): of runs that start at the same instant exactly one
        creates it; the others read it and are refused, naming the winner."""
        for _ in range(CLAIM_ATTEMPTS):
            generation, holder = self._holder()
            note = self._check_holder(holder, run_id)
            now = time.time()
            record = {"job": self.job, "run_id": run_id, "status": "running",
                      "host": socket.gethostname(), "pid": os.getpid(),
                      "pid_namespace": _pid_namespace(), "started_at": now,
                      "heartbeat_at": now, "heartbeat_timeout_s": self.heartbeat_timeout_s,
                      "generation": generation + 1,
                      "claim_token": uuid.uuid4().hex, **info}
            body = json.dumps(record, default=str).encode()
            if self.storage.create_exclusive(_claim_name(generation + 1), body):
                self.record = record
                self._write()
                self._prune_claims(generation + 1)
                return note
        msg = (f"job {self.job!r} could not be claimed: {CLAIM_ATTEMPTS} other runs claimed it "
               f"meanwhile; see `streamer list`")
        raise JobAlreadyRunningError(msg)

    def _holder(self) -> tuple[int, dict[str, Any] | None]:
        """The newest claim's generation and its run's record: `job.json` once the run wrote
        it, else the claim itself (its start is its first heartbeat)."""
        generations = [g for name in self.storage.ls(CLAIMS)
                       if (g := _claim_generation(name)) is not None]
        current = self.read()
        if not generations:
            return 0, current  # never claimed through claims/ (or a registry before them)
        newest = max(generations)
        claimed = _read_json(self.storage, _claim_name(newest))
        if claimed is None:  # unreadable: a store without atomic creation, mid-write
            claimed = {"run_id": "(unknown)", "status": "running", "heartbeat_at": time.time()}
        if current is not None and current.get("run_id") == claimed.get("run_id"):
            return newest, current
        return newest, claimed

    def _check_holder(self, holder: dict[str, Any] | None, run_id: str) -> str | None:
        """Refuse when `holder` is another live run; a note when it is a dead one."""
        if not holder or holder.get("status") != "running":
            return None
        if state_of(holder) == "running" and holder.get("run_id") != run_id:
            age = time.time() - float(holder.get("heartbeat_at", 0))
            msg = (f"job {self.job!r} is already running (run {holder.get('run_id')} on "
                   f"{holder.get('host')}, pid {holder.get('pid')}, heartbeat "
                   f"{age:.0f} s ago); stop it first (`streamer stop {self.job}`), or wait "
                   f"{heartbeat_timeout(holder):g} s after it died (its job.heartbeat_timeout)")
            raise JobAlreadyRunningError(msg)
        return (f"taking over job {self.job!r} from run {holder.get('run_id')}, which "
                "died without cleaning up")

    def _prune_claims(self, generation: int) -> None:
        """Keep the newest claims (a racing run reads the newest), delete older ones."""
        with contextlib.suppress(StorageError):
            for name in self.storage.ls(CLAIMS):
                g = _claim_generation(name)
                if g is not None and g < generation - 2:
                    self.storage.rm(f"{CLAIMS}/{name}")

    def _write(self) -> None:
        with self._lock:
            self.storage.write_atomic("job.json", json.dumps(self.record, default=str).encode())

    def _newer_claim(self) -> dict[str, Any] | None:
        """The claim that took the job over from this run (one generation past its own),
        if there is one; remembered, and the heartbeat stopped, once seen."""
        if self.lost is None and self.record.get("generation"):
            rel = _claim_name(int(self.record["generation"]) + 1)
            if self.storage.exists(rel):
                self.lost = _read_json(self.storage, rel) or {"run_id": "(unknown)"}
                self._stop.set()
        return self.lost

    def check_claim(self) -> None:
        """Raise `ClaimLostError` when another run took the job over from this one."""
        with contextlib.suppress(StorageError):  # unreachable storage: the commit says so
            self._newer_claim()
        if self.lost is None:
            return
        other = self.lost
        msg = (f"run {self.record.get('run_id')} of job {self.job!r} lost its claim: run "
               f"{other.get('run_id')} (on {other.get('host', '?')}, pid "
               f"{other.get('pid', '?')}) took the job over, as this run's heartbeat was "
               f"over {self.heartbeat_timeout_s:g} s old (the process paused, or cut off from the "
               "storage); this run stops without committing, and the other carries on from "
               "the last checkpoint")
        raise ClaimLostError(msg)

    def update(self, **figures: Any) -> None:
        """Record figures (epoch, last checkpoint, records) and beat, unless another run
        took the job over (then `job.json` is its own)."""
        self.record.update(figures, heartbeat_at=time.time())
        with contextlib.suppress(StorageError):  # a missed beat does not fail the job
            if self._newer_claim() is None:
                self._write()

    def start_heartbeat(self) -> None:
        """Beat every HEARTBEAT_S seconds, or every third of the heartbeat timeout when that
        is sooner, from a daemon thread until `close` (or until another run took the job
        over)."""
        every = min(HEARTBEAT_S, self.heartbeat_timeout_s / 3)

        def beat() -> None:
            while not self._stop.wait(every):
                self.update()
        self._thread = threading.Thread(target=beat, name="streamer-heartbeat", daemon=True)
        self._thread.start()

    def close(self, status: str, reason: str = "", **figures: Any) -> None:
        """The run ended: stop beating, record how."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.record.update(figures, status=status, reason=reason, ended_at=time.time(),
                           heartbeat_at=time.time())
        if self.lost is not None:
            return  # `job.json` is the newer run's
        with contextlib.suppress(StorageError):
            self._write()


def list_jobs(storage_url: str) -> list[dict[str, Any]]:
    """Every job with a `job.json` under the storage, with its derived `state`."""
    root = Storage(storage_url)
    jobs = []
    now = time.time()
    for name in root.ls(""):
        record = _read_json(root, f"{name}/job.json")
        if record is not None:
            jobs.append({**record, "state": state_of(record, now)})
    return jobs


class ControlChannel:
    """Requests to a job and its responses, as files on the job's storage."""

    def __init__(self, storage_url: str, job: str) -> None:
        self.job = job
        self.storage_url = storage_url
        self.storage = job_storage(storage_url, job)

    def request(self, kind: str, **params: Any) -> str:
        """File a request; returns its id."""
        if kind not in KINDS:
            msg = f"unknown request {kind!r}; one of {', '.join(KINDS)}"
            raise JobControlError(msg)
        rid = f"{int(time.time() * 1000):013d}-{kind}-{uuid.uuid4().hex[:8]}"
        body = {"id": rid, "kind": kind, "created_at": time.time(), **params}
        self.storage.write_atomic(f"control/requests/{rid}.json", json.dumps(body).encode())
        return rid

    def pending(self) -> list[dict[str, Any]]:
        """Requests without a response, oldest first."""
        answered = {n.removesuffix(".json") for n in self.storage.ls("control/responses")}
        out = []
        for name in self.storage.ls("control/requests"):
            rid = name.removesuffix(".json")
            if name.endswith(".json") and rid not in answered:
                body = _read_json(self.storage, f"control/requests/{name}")
                if body is not None:
                    out.append(body)
        return out

    def respond(self, rid: str, status: str, **result: Any) -> None:
        """Answer request `rid` (status: completed | failed | accepted)."""
        body = {"id": rid, "status": status, "at": time.time(), **result}
        self.storage.write_atomic(f"control/responses/{rid}.json", json.dumps(body).encode())

    def response(self, rid: str) -> dict[str, Any] | None:
        """The answer to `rid`, if any."""
        return _read_json(self.storage, f"control/responses/{rid}.json")

    def find(self, rid: str) -> dict[str, Any] | None:
        """The request `rid`, if it exists."""
        return _read_json(self.storage, f"control/requests/{rid}.json")

    def wait(self, rid: str, timeout_s: float, poll_s: float = 0.3,
             progress: Callable[[str], None] | None = None) -> dict[str, Any] | None:
        """Wait for the final answer to `rid` (the last one seen, or None, on timeout),
        telling `progress` what the job is doing whenever that changes ("starting",
        "epoch 12", "restarting"). A job that ends or dies before answering raises
        `JobControlError` saying how it ended, rather than being waited for until the
        timeout."""
        registry = JobRegistry(self.storage_url, self.job)
        deadline = time.monotonic() + timeout_s
        shown = ""
        while True:
            found = self.response(rid)
            if found is not None and found.get("status") != "accepted":
                return found
            record = registry.read()
            if record is not None and state_of(record) != "running":
                found = self.response(rid)  # answered as it ended
                if found is not None and found.get("status") != "accepted":
                    return found
                raise JobControlError(self._unanswered(rid, record, found))
            doing = activity(record) if record is not None else ""
            if progress is not None and doing and doing != shown:
                progress(doing)
                shown = doing
            if time.monotonic() >= deadline:
                return found
            time.sleep(poll_s)

    def _unanswered(self, rid: str, record: dict[str, Any],
                    accepted: dict[str, Any] | None) -> str:
        """Why request `rid` will never be answered: how the job's run ended."""
        state = state_of(record)
        what = "completed" if accepted is not None else "taken"
        if state == "dead":
            age = time.time() - float(record.get("heartbeat_at", 0))
            how = (f"died (run {record.get('run_id')} on {record.get('host')}, pid "
                   f"{record.get('pid')}: its process is gone or its heartbeat is {age:.0f} s "
                   "old)")
        else:
            reason = record.get("reason") or ""
            how = f"ended ({state}{': ' + reason if reason else ''})"
        return (f"job {self.job!r} {how} before request {rid} was {what}; send it again once "
                f"the job runs (`streamer list` shows it)")


def activity(record: dict[str, Any]) -> str:
    """What a running job is doing, from its registry record: starting (claimed, no epoch
    boundary yet), restarting (under `job.restart`), or the epoch it is at."""
    phase = record.get("phase")
    if phase == "restarting":
        return f"restarting (restart {record.get('restarts', '?')})"
    if phase == "starting" or record.get("epoch") is None:
        return "starting"
    return f"epoch {record['epoch']}" if record["epoch"] else "started, no epoch yet"
