"""The control plane between the continuous mode's coordinator (on the driver) and its
subtasks (in tasks, on any worker), over Arrow Flight: gRPC over TCP, so it works between
machines as the exchange does.

- Barriers go down: a source subtask opens a `DoGet` stream with the ticket
  `barriers/<task>` and reads one record batch `{checkpoint: int64}` per barrier the
  coordinator injects, in order. Barriers injected before the subtask subscribed wait for
  it, so a subtask that starts late misses none.
- Acknowledgements go up: a subtask calls `DoAction("ack")` with the JSON body
  `{"task", "checkpoint", "payload"}` (a keyed subtask's state handle, a source's
  position); the server hands it to the coordinator's callback and answers `ok` once the
  callback returned, so an acknowledged checkpoint is recorded on the driver.

The server knows tasks only by name (`source/<id>/<i>`, `keyed/<node>/<i>`: the
coordinator's `runtime.job.barrier_coordinator` names them); what the payloads mean is the
coordinator's business. A subtask that cannot reach the coordinator gets an `ExchangeError`.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from streamer.exchange.exceptions import ExchangeError

BARRIERS = pa.schema([("checkpoint", pa.int64())])
_TICKET = "barriers/"
#: How often a barrier stream with nothing to send checks that its subtask is still there.
_POLL_S = 0.5


class CoordinationServer(flight.FlightServerBase):
    """The driver's side: barrier streams to the source subtasks, acknowledgements to
    `on_ack(task, checkpoint, payload)` and a subtask's reason to fail to
    `on_fail(task, reason)` (called on a server thread)."""

    def __init__(self, host: str, on_ack: Callable[[str, int, dict[str, Any]], None],
                 port: int = 0, on_fail: Callable[[str, str], None] | None = None) -> None:
        super().__init__(f"grpc+tcp://{host}:{port}")
        self.host = host
        self._on_ack = on_ack
        self._on_fail = on_fail
        self._lock = threading.Lock()
        self._queues: dict[str, queue.Queue[int | None]] = {}
        self._closed = False

    @property
    def location(self) -> str:
        """The URI subtasks connect to."""
        return f"grpc+tcp://{self.host}:{self.port}"

    def _queue(self, task: str) -> queue.Queue[int | None]:
        with self._lock:
            return self._queues.setdefault(task, queue.Queue())

    def inject(self, task: str, checkpoint: int) -> None:
        """Send barrier `checkpoint` to subtask `task` (now, or when it subscribes)."""
        self._queue(task).put(checkpoint)

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        """A source subtask's stream of barriers."""
        name = ticket.ticket.decode()
        if not name.startswith(_TICKET):
            msg = f"no stream {name!r} here (only {_TICKET}<task>)"
            raise flight.FlightServerError(msg)
        return flight.GeneratorStream(BARRIERS, self._barriers(context, name[len(_TICKET):]))

    def _barriers(self, context: Any, task: str) -> Iterator[pa.RecordBatch]:
        pending = self._queue(task)
        while not context.is_cancelled():
            try:
                checkpoint = pending.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if checkpoint is None:  # the server closes
                return
            yield pa.record_batch([pa.array([checkpoint], pa.int64())], schema=BARRIERS)

    def do_action(self, context: Any, action: flight.Action) -> Iterator[flight.Result]:
        """An acknowledgement, or a subtask's reason to fail (`fail`)."""
        if action.type not in ("ack", "fail"):
            msg = f"unknown action {action.type!r} (only 'ack' and 'fail')"
            raise flight.FlightServerError(msg)
        try:
            body = json.loads(action.body.to_pybytes())
            if action.type == "fail":
                if self._on_fail is not None:
                    self._on_fail(str(body["task"]), str(body["reason"]))
                yield flight.Result(b"ok")
                return
            task, checkpoint, payload = str(body["task"]), int(body["checkpoint"]), \
                dict(body["payload"])
        except (ValueError, KeyError, TypeError) as exc:
            msg = f"a malformed acknowledgement: {exc}"
            raise flight.FlightServerError(msg) from exc
        self._on_ack(task, checkpoint, payload)
        yield flight.Result(b"ok")

    def close(self, timeout_s: float = 5.0) -> bool:
        """End every barrier stream and stop serving; whether it stopped in `timeout_s`."""
        with self._lock:
            self._closed = True
            for pending in self._queues.values():
                pending.put(None)
        stopper = threading.Thread(target=self.shutdown, daemon=True)
        stopper.start()
        stopper.join(timeout_s)
        return not stopper.is_alive()


class CoordinationClient:
    """A subtask's side: acknowledge checkpoints and, for a source, follow its barriers."""

    def __init__(self, location: str, task: str, *, timeout_s: float = 30.0) -> None:
        self.location = location
        self.task = task
        self.timeout_s = timeout_s
        self._client = flight.FlightClient(location)
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    def ack(self, checkpoint: int, payload: dict[str, Any]) -> None:
        """Acknowledge `checkpoint` with `payload` (JSON); returns once the coordinator has
        recorded it."""
        body = json.dumps({"task": self.task, "checkpoint": checkpoint,
                           "payload": payload}).encode()
        options = flight.FlightCallOptions(timeout=self.timeout_s)
        try:
            results = list(self._client.do_action(flight.Action("ack", body), options))
        except (pa.ArrowException, OSError) as exc:
            msg = (f"{self.task}: the coordinator at {self.location} did not take the "
                   f"acknowledgement of checkpoint {checkpoint}: {exc}")
            raise ExchangeError(msg) from exc
        if [r.body.to_pybytes() for r in results] != [b"ok"]:
            msg = f"{self.task}: the coordinator answered {results!r} to an acknowledgement"
            raise ExchangeError(msg)

    def fail(self, reason: str) -> None:
        """Tell the coordinator why this subtask fails, before it does: Spark reports the
        first task that failed, which may be another that lost this one's channel. Best
        effort: the subtask fails either way."""
        body = json.dumps({"task": self.task, "reason": reason}).encode()
        options = flight.FlightCallOptions(timeout=self.timeout_s)
        with contextlib.suppress(pa.ArrowException, OSError):
            list(self._client.do_action(flight.Action("fail", body), options))

    def follow_barriers(self, on_barrier: Callable[[int], None]) -> None:
        """Call `on_barrier(n)` for each barrier injected at this task, on a thread of its
        own, until the coordinator closes the stream (or it breaks: `error` says why)."""
        reader = self._client.do_get(flight.Ticket(f"{_TICKET}{self.task}".encode()))

        def read() -> None:
            try:
                for chunk in reader:
                    for checkpoint in chunk.data.column(0).to_pylist():
                        on_barrier(int(checkpoint))
            except (pa.ArrowException, OSError) as exc:
                self.error = f"{self.task}: the barrier stream from {self.location} broke: {exc}"

        self._thread = threading.Thread(target=read, daemon=True, name=f"barriers-{self.task}")
        self._thread.start()

    def following(self) -> bool:
        """Whether the barrier stream is still open (the coordinator has not ended it)."""
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Drop the connection."""
        self._client.close()
