"""Job control at epoch boundaries: the job registry claim and heartbeat, the control
channel's requests (savepoint, stop, stop with savepoint, cancel), Ctrl-C and SIGTERM (a
graceful stop bounded by `job.shutdown_timeout`), and the answers to whoever asked.
Requests are read from the job's storage, so they work for a job on a cluster as for a
local one.

Every request this run takes gets an answer: a savepoint it accepted stays owed (`owed`)
until an epoch writes it or it is refused with a reason, whatever happens in between (a
boundary where no epoch runs, a restart under `job.restart`, a stop); a request still
unanswered when the run ends is answered with how and why it ended (`close`)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from streamer.runtime.exceptions import JobTerminatedError
from streamer.runtime.job.job_state import JobState


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
        #: savepoint url -> ids of the requests waiting for it, in the order they were
        #: accepted; a url stays here until its savepoint is written or refused
        self.waiters: dict[str, list[str]] = {}
        #: Savepoints written by this run.
        self.savepoints: list[str] = []
        #: The Spark session exists (a SIGTERM before it stops the job once it started).
        self.started = False
        self._previous: dict[int, Any] = {}
        self._timers: list[threading.Timer] = []

    def register(self) -> None:
        """Claim the job in its registry (refused if another run is alive) and start the
        heartbeat; open the control channel."""
        if not self.job.options.checkpoints:
            return
        from streamer.runtime.job.control import ControlChannel, JobRegistry

        job = self.job
        registry = JobRegistry(job.storage_url, job.spec.name,
                               job.spec.job.heartbeat_timeout_ms / 1000)
        note = registry.claim(job.run_id, {"file": job.spec.file, "phase": "starting"})
        self.registry = registry  # only now: a refused run must not touch the other's record
        if note:
            job.reporter.message(note)
        registry.start_heartbeat()
        self.channel = ControlChannel(job.storage_url, job.spec.name)

    def update(self, **fields: Any) -> None:
        """Update the registry record (when there is one)."""
        if self.registry is not None:
            self.registry.update(**fields)

    def check_claim(self) -> None:
        """Before a commit and at every boundary: `ClaimLostError` if another run took
        the job over."""
        if self.registry is not None:
            self.registry.check_claim()

    def close(self, status: str, reason: str, **fields: Any) -> None:
        """Record how the run ended, after answering every request still waiting (an owed
        savepoint, or one filed after the last boundary) with why it was not honoured."""
        self.ended(status, reason)
        if self.registry is not None:
            self.registry.close(status, reason, epoch=self.job.epoch, **fields)

    def install_signals(self) -> Callable[[], object]:
        """SIGTERM, from before Spark starts: the first stops at the next epoch boundary
        after a final checkpoint (during start-up: as soon as the job has started, before
        any epoch), a second cancels now, and so does a stop that takes longer than
        `job.shutdown_timeout`; a cancel that itself takes over `job.cancel_timeout` ends the
        process at once (exit 143). Ctrl-C is `install_sigint`'s. Returns what restores the
        previous handlers and disarms the timers."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        self._previous[signal.SIGTERM] = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._on_sigterm)

        def restore() -> None:
            for timer in self._timers:
                timer.cancel()
            self._restore_handlers()
        return restore

    def install_sigint(self) -> None:
        """Ctrl-C: the first stops at the next epoch boundary, a second cancels now.
        Installed once the Spark session exists, as PySpark sets its own SIGINT handler."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous[signal.SIGINT] = signal.getsignal(signal.SIGINT)

        def on_sigint(signum: int, frame: Any) -> None:
            if self.stop.is_set():  # second Ctrl-C: cancel now
                self._restore_handlers()
                raise KeyboardInterrupt
            self.job.reporter.message("stopping at the next epoch boundary "
                                      "(press Ctrl-C again to cancel now)")
            self.stop.set()

        signal.signal(signal.SIGINT, on_sigint)

    def _restore_handlers(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.deadline is not None:  # a second SIGTERM, or the first one's deadline passed
            self._arm(self._cancel_timeout_s, self._hard_exit)
            self._restore_handlers()
            raise JobTerminatedError(self.terminating or "a second termination signal")
        timeout_s = self.job.spec.job.shutdown_timeout_ms / 1000
        when = ("at the next epoch boundary" if self.started else
                "as soon as the job has started (during start-up: no epoch runs)")
        self.job.reporter.message(
            f"terminated: stopping {when}; cancelling if that takes over {timeout_s:g} s "
            "(job.shutdown_timeout) or on another SIGTERM")
        self.stop.set()
        self.deadline = time.monotonic() + timeout_s
        self._arm(timeout_s, self._shutdown_expired, timeout_s)

    @property
    def _cancel_timeout_s(self) -> float:
        """How long a cancel may take before the process exits at once (143)."""
        return self.job.spec.job.cancel_timeout_ms / 1000

    def _arm(self, seconds: float, action: Callable[..., None], *args: Any) -> None:
        timer = threading.Timer(seconds, action, args=args)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _hard_exit(self) -> None:
        """The cancel after SIGTERM did not end within `job.cancel_timeout` (stuck in a call
        that does not return): record it if the storage answers at once, then exit 143 at
        once (`os._exit`). The JVM ends too: its stdin, a pipe from this process, closes."""
        reason = (f"cancelled: {self.terminating or 'terminated'}; the cancel did not end "
                  f"within {self._cancel_timeout_s:g} s (job.cancel_timeout), so the process "
                  "exited at once")
        recorder = threading.Thread(target=self.close, args=("cancelled", reason), daemon=True)
        recorder.start()
        recorder.join(timeout=2)
        with contextlib.suppress(OSError):
            os.write(2, f"cancelled ({reason})\n".encode())
        os._exit(143)

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
        self._arm(self._cancel_timeout_s, self._hard_exit)  # (also if no handler gets to run)
        os.kill(os.getpid(), signal.SIGTERM)

    def poll(self) -> str | None:
        """At an epoch boundary: beat, and take the control channel's new requests. Returns
        the savepoint the next epoch writes: the oldest accepted one not written yet (it
        stays owed across boundaries where no epoch runs, and across restarts)."""
        if self.channel is None:
            return None
        from streamer.storage import StorageError

        job = self.job
        self.registry.check_claim()
        self.registry.update(epoch=job.epoch, records_in=job.totals["records_in"],
                             phase="running")
        try:
            requests = self.channel.pending()
        except StorageError as exc:
            job.reporter.message(f"cannot read the control channel: {exc}")
            return self.owed()
        for req in requests:
            rid, kind = req["id"], req["kind"]
            if rid in self.seen or self._for_a_later_run(req):
                continue
            self.seen.add(rid)
            refusal = self._addressed_elsewhere(req)
            if refusal:
                self.channel.respond(rid, "failed", reason=refusal)
                job.reporter.message(f"{kind} request {rid} refused: {refusal}")
            elif kind == "savepoint":
                self._savepoint_request(req)
            elif kind == "stop":
                self._stop_request(req)
            elif kind == "cancel":
                self.cancelled = True
                self.channel.respond(rid, "completed", status_after="cancelled")
                job.reporter.message("cancel requested: cancelling now (no final checkpoint)")
        return self.owed()

    def owed(self) -> str | None:
        """The oldest savepoint accepted and neither written nor refused yet (a
        stop-with-savepoint's own is the stop's to write)."""
        return next((url for url in self.waiters if url != self.stop_savepoint), None)

    def _for_a_later_run(self, req: dict[str, Any]) -> bool:
        """Whether `req` was sent to a run that took the job over from this one (which has
        not seen its newer claim yet): that run answers it."""
        sent_to = req.get("generation")
        mine = self.registry.record.get("generation") if self.registry is not None else None
        return sent_to is not None and mine is not None and int(sent_to) > int(mine)

    def _addressed_elsewhere(self, req: dict[str, Any]) -> str:
        """Why a request sent to an earlier run of the job (one that ended, or died, before
        taking it) is not this run's to honour; "" when it is this run's. A request names
        the run the CLI saw running; requests filed through the Python API name none."""
        sent_to = req.get("generation")
        mine = self.registry.record.get("generation")
        if sent_to is None or mine is None or int(sent_to) >= int(mine):
            return ""
        return (f"it was sent to run {req.get('run_id')} of job {self.job.spec.name!r}, "
                f"which ended before taking it; this run ({self.registry.record.get('run_id')})"
                " took the job over since: send the request again if it still applies")

    def _savepoint_request(self, req: dict[str, Any]) -> None:
        """Accept a savepoint request: it is owed until an epoch writes it."""
        from streamer.savepoint.savepoint_metadata import new_savepoint_url

        url = new_savepoint_url(self.job.storage_url, self.job.spec.name, req.get("target"))
        self.waiters[url] = [req["id"]]
        self.channel.respond(req["id"], "accepted", path=url)
        self.job.reporter.message(f"savepoint requested: writing {url}")

    def _stop_request(self, req: dict[str, Any]) -> None:
        from streamer.savepoint.savepoint_metadata import new_savepoint_url

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

    def ended(self, status: str, reason: str) -> None:
        """The run ends: every savepoint still owed, and every request filed since the last
        boundary, is answered as failed, saying how the run ended and why."""
        if self.channel is None:
            return
        from streamer.storage import StorageError

        why = f"{status}: {reason}" if reason else status
        with contextlib.suppress(StorageError):  # the storage is gone: the client sees the end
            for url in list(self.waiters):
                self.answer(url, "failed", reason=f"the job ended ({why}) before the "
                            "savepoint was written")
            if self.registry is not None and self.registry.lost is not None:
                return  # the requests not taken yet are the run's that took the job over
            for req in self.channel.pending():
                if req["id"] not in self.seen and not self._for_a_later_run(req):
                    self.seen.add(req["id"])
                    self.channel.respond(req["id"], "failed", reason=(
                        f"the job ended ({why}) before its next epoch boundary, where it "
                        f"would have taken the {req['kind']} request"))
