"""Job control at epoch boundaries: the job registry claim and heartbeat, the control
channel's requests (savepoint, stop, stop with savepoint, cancel), Ctrl-C and SIGTERM (a
graceful stop bounded by `job.shutdown_timeout`), and the answers to whoever asked.
Requests are read from the job's storage, so they work for a job on a cluster as for a
local one."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from streamer.runtime.exceptions import JobTerminatedError
from streamer.runtime.job import JobState


class JobControl:
    """Stop, cancel and savepoint requests of one job, and its registry record."""

    def __init__(self, job: JobState) -> None:
        self.job = job
        self.registry: Any = None
        self.channel: Any = None
        self.stop = threading.Event()
        self.cancelled = False
        #: Why a SIGTERM stop is being cancelled (its deadline passed), else "".
        self.terminating = ""
        #: When (time.monotonic) a SIGTERM stop turns into a cancel.
        self.deadline: float | None = None
        #: The savepoint a stop-with-savepoint writes, and whether it drains first.
        self.stop_savepoint: str | None = None
        self.stop_drain = False
        self.seen: set[str] = set()
        #: savepoint url -> ids of the requests waiting for it
        self.waiters: dict[str, list[str]] = {}
        #: Savepoints written by this run.
        self.savepoints: list[str] = []

    def register(self) -> None:
        """Claim the job in its registry (refused if another run is alive) and start the
        heartbeat; open the control channel."""
        if not self.job.options.checkpoints:
            return
        from streamer.runtime.control import ControlChannel, JobRegistry

        job = self.job
        registry = JobRegistry(job.storage_url, job.spec.name)
        note = registry.claim(job.run_id, {"file": job.spec.file})
        self.registry = registry  # only now: a refused run must not touch the other's record
        if note:
            job.reporter.message(note)
        registry.start_heartbeat()
        self.channel = ControlChannel(job.storage_url, job.spec.name)

    def update(self, **fields: Any) -> None:
        """Update the registry record (when there is one)."""
        if self.registry is not None:
            self.registry.update(**fields)

    def close(self, status: str, reason: str, **fields: Any) -> None:
        """Record how the run ended."""
        if self.registry is not None:
            self.registry.close(status, reason, epoch=self.job.epoch, **fields)

    def install_signals(self) -> Callable[[], object]:
        """Ctrl-C and SIGTERM: the first stops at the next epoch boundary after a final
        checkpoint, a second cancels now. A SIGTERM stop that takes longer than
        `job.shutdown_timeout` cancels too. Returns what restores the previous handlers.
        Installed once the Spark session exists, as PySpark sets its own SIGINT handler."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        deadline: list[threading.Timer] = []

        def restore() -> None:
            for timer in deadline:
                timer.cancel()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        def on_sigint(signum: int, frame: Any) -> None:
            if self.stop.is_set():  # second Ctrl-C: cancel now
                restore()
                raise KeyboardInterrupt
            self.job.reporter.message("stopping at the next epoch boundary "
                                      "(press Ctrl-C again to cancel now)")
            self.stop.set()

        def on_sigterm(signum: int, frame: Any) -> None:
            if deadline:  # a second SIGTERM, or the first one's deadline passed
                restore()
                raise JobTerminatedError(self.terminating or "a second termination signal")
            timeout_s = self.job.spec.job.shutdown_timeout_ms / 1000
            self.job.reporter.message(
                f"terminated: stopping at the next epoch boundary; cancelling if that takes "
                f"over {timeout_s:g} s (job.shutdown_timeout) or on another SIGTERM")
            self.stop.set()
            self.deadline = time.monotonic() + timeout_s
            timer = threading.Timer(timeout_s, self._shutdown_expired, args=(timeout_s,))
            timer.daemon = True
            deadline.append(timer)
            timer.start()

        signal.signal(signal.SIGINT, on_sigint)
        signal.signal(signal.SIGTERM, on_sigterm)
        return restore

    def check_deadline(self) -> None:
        """Before the work of a SIGTERM stop: past `job.shutdown_timeout` already, cancel (the
        timer's own signal may not have reached the main thread yet)."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            timeout_s = self.job.spec.job.shutdown_timeout_ms / 1000
            raise JobTerminatedError(self.terminating or (
                f"the stop after SIGTERM took over {timeout_s:g} s (job.shutdown_timeout)"))

    def _shutdown_expired(self, timeout_s: float) -> None:
        """The graceful stop after SIGTERM took too long: signal the main thread again, whose
        handler cancels the run (a signal interrupts what the main thread waits on)."""
        self.terminating = (f"the stop after SIGTERM took over {timeout_s:g} s "
                            "(job.shutdown_timeout)")
        os.kill(os.getpid(), signal.SIGTERM)

    def poll(self) -> str | None:
        """At an epoch boundary: beat, and take the control channel's requests. Returns the
        savepoint URL the next epoch writes, if one was asked for."""
        if self.channel is None:
            return None
        from streamer.storage import StorageError

        job = self.job
        self.registry.update(epoch=job.epoch, records_in=job.totals["records_in"])
        try:
            requests = self.channel.pending()
        except StorageError as exc:
            job.reporter.message(f"cannot read the control channel: {exc}")
            return None
        url = None
        for req in requests:
            rid, kind = req["id"], req["kind"]
            if rid in self.seen:
                continue
            if kind == "savepoint":
                if url is not None:
                    continue  # one savepoint per boundary; the next boundary takes it
                url = self._savepoint_request(req)
            elif kind == "stop":
                self._stop_request(req)
            elif kind == "cancel":
                self.cancelled = True
                self.channel.respond(rid, "completed", status_after="cancelled")
                job.reporter.message("cancel requested: cancelling now (no final checkpoint)")
            self.seen.add(rid)
        return url

    def _savepoint_request(self, req: dict[str, Any]) -> str:
        from streamer.savepoint.metadata import new_savepoint_url

        url = new_savepoint_url(self.job.storage_url, self.job.spec.name, req.get("target"))
        self.waiters.setdefault(url, []).append(req["id"])
        self.channel.respond(req["id"], "accepted", path=url)
        self.job.reporter.message(f"savepoint requested: writing {url}")
        return url

    def _stop_request(self, req: dict[str, Any]) -> None:
        from streamer.savepoint.metadata import new_savepoint_url

        rid = req["id"]
        self.stop.set()
        if req.get("savepoint"):
            self.stop_savepoint = self.stop_savepoint or new_savepoint_url(
                self.job.storage_url, self.job.spec.name, req.get("target"))
            self.stop_drain = self.stop_drain or bool(req.get("drain"))
            self.waiters.setdefault(self.stop_savepoint, []).append(rid)
            self.channel.respond(rid, "accepted", path=self.stop_savepoint)
        else:
            self.channel.respond(rid, "completed", status_after="stopped")
        self.job.reporter.message("stop requested: stopping at this epoch boundary"
                                  + (" with a savepoint" if req.get("savepoint") else ""))

    def answer(self, url: str, status: str, **fields: Any) -> None:
        """Answer every request waiting for the savepoint `url`."""
        for rid in self.waiters.pop(url, []):
            self.channel.respond(rid, status, path=url, **fields)

    def stop_failed(self, reason: str) -> None:
        """A stop-with-savepoint whose savepoint failed: the job keeps running."""
        self.stop.clear()
        self.stop_savepoint = None
        self.job.reporter.message(f"stop with savepoint failed: {reason}; the job was not "
                                  "stopped")

    def ended(self, status: str) -> None:
        """Savepoints asked for too late to be taken fail with the reason."""
        for url in list(self.waiters):
            self.answer(url, "failed", reason=f"the job ended ({status}) before the savepoint")
