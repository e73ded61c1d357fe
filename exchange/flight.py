"""The exchange between continuous subtasks, over Arrow Flight (gRPC over TCP): it works
between machines, as tasks on a cluster run on different workers.

A receiving subtask serves its input channels (`ExchangeServer`, on a port it picks, bound
to the host its caller passes). Each upstream subtask opens one `DoPut` stream per channel
(`ExchangeSender`; the channel id is the stream's descriptor) and writes, in order, Arrow
record batches and control messages: barriers, watermarks, idleness and end of input ride
in the stream's `app_metadata`, so they stay in order with the data.

Backpressure is credit-based, as in Flink's network stack: a channel holds at most
`capacity_bytes` on the receiver, and the receiver grants its sender that many bytes of
credit when the stream opens, then returns credit as the subtask takes messages (on the
same stream's metadata, back to the sender). A sender writes a message only with credit for
all of it, and waits otherwise; a batch larger than the bound goes in slices of rows. So a
slow subtask slows its senders, its buffers never exceed the bound (measured on what it
received: `Arrow` buffer bytes plus the metadata), and a channel its aligner blocked
(`exchange.gate`) stops its sender once its buffer is full. gRPC's own flow control window
(tens of KiB per stream) comes on top of the bound.

Failures are errors, never hangs: a receiver that went away breaks its senders' streams
(`ExchangeError` at their next send), one that gives no credit for `timeout_s` raises
`ExchangeTimeoutError`, and a sender that goes away without its end of input fails the
receiving subtask's next `wait_ready`. The continuous mode fails the gang on either.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from streamer.exchange.alignment import Barrier, EndOfInput, Idle, Message, Records, Watermark
from streamer.exchange.exceptions import ExchangeError, ExchangeTimeoutError

#: A credit grant on the back channel: a signed 64-bit count of bytes; -1 closes the channel.
_CREDIT = struct.Struct("<q")
_CLOSE = -1
#: A receiver returns credit once this share of its bound is free again, or its buffer is
#: empty: fewer grant messages, and a sender never waits on a grant that is not coming.
GRANT_SHARE = 4
DEFAULT_TIMEOUT_S = 30.0


def encode(message: Message) -> bytes:
    """The `app_metadata` of a channel message: a kind letter and, for some, a number."""
    if isinstance(message, Records):
        return b"R"
    if isinstance(message, Barrier):
        return b"B%d" % message.checkpoint
    if isinstance(message, Watermark):
        return b"W%d" % message.ms
    if isinstance(message, Idle):
        return b"I"
    if isinstance(message, EndOfInput):
        return b"E"
    msg = f"{message!r} is no channel message"
    raise TypeError(msg)


def decode(metadata: bytes, batch: pa.RecordBatch | None) -> Message:
    """The channel message of a received chunk (`encode`'s inverse)."""
    kind, rest = metadata[:1], metadata[1:]
    if (kind == b"R") != (batch is not None):
        msg = f"a chunk with metadata {metadata!r} {'has' if batch is not None else 'lacks'} data"
        raise ExchangeError(msg)
    if kind == b"R":
        assert batch is not None
        return Records(aligned(batch))
    if kind == b"B":
        return Barrier(int(rest))
    if kind == b"W":
        return Watermark(int(rest))
    if kind == b"I":
        return Idle()
    if kind == b"E":
        return EndOfInput()
    msg = f"unknown channel message {metadata!r}"
    raise ExchangeError(msg)


def aligned(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch`, copied when gRPC handed over a buffer off its 8-byte alignment (it does
    between executors): Acero, which the keyed kernels group with, warns on every such batch
    and may read it slowly; an aligned batch is returned as it is, without a copy."""
    for column in batch.columns:
        for buffer in column.buffers():
            if buffer is not None and buffer.address % 8:
                return batch.copy_to(pa.default_cpu_memory_manager())
    return batch


def message_bytes(batch: pa.RecordBatch | None, metadata: bytes) -> int:
    """What a message weighs against a channel's bound: its Arrow buffers and metadata."""
    return (batch.nbytes if batch is not None else 0) + len(metadata)


# ---------------------------------------------------------------------- the receiver
@dataclass
class _Inbox:
    """One input channel on the receiver."""

    messages: deque[tuple[Message, int]] = field(default_factory=deque)
    buffered: int = 0
    #: The most bytes it held at once.
    peak: int = 0
    #: Bytes taken by the subtask that are not granted back to the sender yet.
    ungranted: int = 0
    writer: Any = None
    connected: bool = False
    ended: bool = False
    error: str | None = None


class ExchangeServer(flight.FlightServerBase):
    """A subtask's input channels 0..channels-1, served on `host` at a port it picks
    (`location` is what senders connect to). Each channel holds at most `capacity_bytes`."""

    def __init__(self, host: str, channels: int, capacity_bytes: int, port: int = 0) -> None:
        if capacity_bytes < 64:
            msg = f"a channel's bound of {capacity_bytes} bytes is too small (at least 64)"
            raise ValueError(msg)
        super().__init__(f"grpc+tcp://{host}:{port}")
        self.host = host
        self.capacity_bytes = capacity_bytes
        self._inboxes = [_Inbox() for _ in range(channels)]
        self._cond = threading.Condition()
        self._next = 0  # where the round robin over ready channels starts

    @property
    def channels(self) -> int:
        """How many input channels it serves."""
        return len(self._inboxes)

    @property
    def location(self) -> str:
        """The URI senders connect to."""
        return f"grpc+tcp://{self.host}:{self.port}"

    # ------------------------------------------------------------------ the streams
    def do_put(self, context: Any, descriptor: flight.FlightDescriptor,
               reader: flight.MetadataRecordBatchReader,
               writer: flight.FlightMetadataWriter) -> None:
        """One sender's stream of one channel: buffer what it sends within its credit."""
        channel = self._accept(descriptor, writer)
        inbox = self._inboxes[channel]
        try:
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    break
                metadata = chunk.app_metadata.to_pybytes() if chunk.app_metadata else b""
                self._buffer(channel, decode(metadata, chunk.data),
                             message_bytes(chunk.data, metadata))
        except ExchangeError as exc:
            self._fail(inbox, str(exc))
            raise flight.FlightServerError(str(exc)) from exc
        except (pa.ArrowException, OSError) as exc:
            self._fail(inbox, f"channel {channel}'s sender went away: {exc}")
        finally:
            with self._cond:
                inbox.writer = None
                if not inbox.ended and inbox.error is None:
                    inbox.error = f"channel {channel}'s sender closed it without end of input"
                self._cond.notify_all()

    def _accept(self, descriptor: flight.FlightDescriptor, writer: Any) -> int:
        path = [p.decode() for p in descriptor.path or []]
        if len(path) != 2 or path[0] != "channel" or not path[1].isdigit() \
                or int(path[1]) >= len(self._inboxes):
            msg = f"no input channel {'/'.join(path)!r} here ({len(self._inboxes)} channels)"
            raise flight.FlightServerError(msg)
        channel = int(path[1])
        with self._cond:
            inbox = self._inboxes[channel]
            if inbox.connected:
                msg = f"channel {channel} already has a sender"
                raise flight.FlightServerError(msg)
            inbox.connected = True
            inbox.writer = writer
            writer.write(_CREDIT.pack(self.capacity_bytes))
        return channel

    def _buffer(self, channel: int, message: Message, size: int) -> None:
        with self._cond:
            inbox = self._inboxes[channel]
            if inbox.ended:
                msg = f"channel {channel} sent {message!r} after its end of input"
                raise ExchangeError(msg)
            if inbox.buffered + size > self.capacity_bytes:
                msg = (f"channel {channel}'s sender sent {size} bytes with "
                       f"{self.capacity_bytes - inbox.buffered} bytes of credit")
                raise ExchangeError(msg)
            inbox.messages.append((message, size))
            inbox.buffered += size
            inbox.peak = max(inbox.peak, inbox.buffered)
            inbox.ended = isinstance(message, EndOfInput)
            self._cond.notify_all()

    def _fail(self, inbox: _Inbox, error: str) -> None:
        with self._cond:
            inbox.error = inbox.error or error
            self._cond.notify_all()

    # ------------------------------------------------------------------ the subtask's side
    def wait_ready(self, exclude: frozenset[int] | set[int] = frozenset(),
                   timeout_s: float | None = None) -> int | None:
        """A channel, not in `exclude`, with a message to take (round robin over them), or
        None after `timeout_s`. A channel whose sender broke raises `ExchangeError` here at
        once, blocked or not: the subtask fails rather than wait for it."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        n = len(self._inboxes)
        with self._cond:
            while True:
                for inbox in self._inboxes:
                    if inbox.error is not None:
                        raise ExchangeError(inbox.error)
                for k in range(n):
                    channel = (self._next + k) % n
                    if channel not in exclude and self._inboxes[channel].messages:
                        self._next = (channel + 1) % n
                        return channel
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)

    def take(self, channel: int) -> Message:
        """The next message of `channel` (`wait_ready` said it has one); its bytes go back to
        the sender as credit."""
        with self._cond:
            inbox = self._inboxes[channel]
            if not inbox.messages:
                msg = f"channel {channel} has no message to take"
                raise ExchangeError(msg)
            message, size = inbox.messages.popleft()
            inbox.buffered -= size
            inbox.ungranted += size
            if inbox.writer is not None and (
                    not inbox.messages
                    or inbox.ungranted * GRANT_SHARE >= self.capacity_bytes):
                grant, inbox.ungranted = inbox.ungranted, 0
                try:
                    inbox.writer.write(_CREDIT.pack(grant))
                except (pa.ArrowException, OSError) as exc:
                    inbox.error = inbox.error or f"channel {channel}'s sender went away: {exc}"
            return message

    def buffered_bytes(self, channel: int) -> int:
        """What `channel` holds now."""
        with self._cond:
            return self._inboxes[channel].buffered

    def peak_bytes(self, channel: int) -> int:
        """The most `channel` held at once since the server started."""
        with self._cond:
            return self._inboxes[channel].peak

    def close(self, timeout_s: float = 5.0) -> bool:
        """Tell every connected sender whose channel has not ended that it is closed, and
        stop serving. Returns whether the server stopped within `timeout_s` (a sender that
        does not end its stream holds gRPC's shutdown; the process exiting ends it anyway).
        A channel that sent its end of input is complete, though gRPC may not have read the
        end of its stream yet: its sender is finishing, and closing it is no error for it."""
        with self._cond:
            for inbox in self._inboxes:
                if inbox.writer is not None and not inbox.ended:
                    with contextlib.suppress(pa.ArrowException, OSError):
                        inbox.writer.write(_CREDIT.pack(_CLOSE))
        stopper = threading.Thread(target=self.shutdown, daemon=True)
        stopper.start()
        stopper.join(timeout_s)
        return not stopper.is_alive()


# ---------------------------------------------------------------------- the sender
class ExchangeSender:
    """One channel's sending side: batches of `schema` and control messages to the subtask
    at `location`, within the credit it grants. `timeout_s` bounds each wait for credit
    (and for the stream to open and to close)."""

    def __init__(self, location: str, channel: int, schema: pa.Schema, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.location = location
        self.channel = channel
        self.schema = schema
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._credit = 0
        self._capacity: int | None = None
        self._error: str | None = None
        self._done = False
        self._closed = False
        self._client = flight.FlightClient(location)
        descriptor = flight.FlightDescriptor.for_path("channel", str(channel))
        try:
            self._writer, self._reader = self._client.do_put(descriptor, schema)
        except (pa.ArrowException, OSError) as exc:
            msg = f"cannot open channel {channel} at {location}: {exc}"
            raise ExchangeError(msg) from exc
        self._thread = threading.Thread(target=self._read_credits, daemon=True,
                                        name=f"exchange-credit-{channel}")
        self._thread.start()
        try:
            self._wait(lambda: self._capacity is not None, "open the channel")
        except ExchangeError:
            self.close()
            raise

    def __enter__(self) -> ExchangeSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def capacity_bytes(self) -> int:
        """The receiver's bound for this channel (its first grant)."""
        assert self._capacity is not None
        return self._capacity

    def _read_credits(self) -> None:
        """The back channel: credit grants until the receiver closes the stream."""
        try:
            while True:
                buf = self._reader.read()
                if buf is None:
                    break
                (grant,) = _CREDIT.unpack(buf.to_pybytes())
                with self._cond:
                    if grant == _CLOSE:
                        self._error = self._error or (
                            f"the receiver at {self.location} closed channel {self.channel}")
                    else:
                        self._credit += grant
                        if self._capacity is None:
                            self._capacity = grant
                    self._cond.notify_all()
        except (pa.ArrowException, OSError) as exc:
            with self._cond:
                self._error = self._error or (
                    f"channel {self.channel}'s receiver at {self.location} went away: {exc}")
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while not ready():
                if self._error is not None:
                    raise ExchangeError(self._error)
                if self._done:
                    msg = (f"channel {self.channel}'s receiver at {self.location} ended the "
                           f"stream: {self._final_status()}")
                    raise ExchangeError(msg)
                left = deadline - time.monotonic()
                if left <= 0:
                    msg = (f"channel {self.channel}: the receiver at {self.location} did not "
                           f"let it {what} within {self.timeout_s:g} s")
                    raise ExchangeTimeoutError(msg)
                self._cond.wait(left)
            if self._error is not None:
                raise ExchangeError(self._error)

    def _final_status(self) -> str:
        """Why the receiver ended the stream (its error, which closing the stream raises)."""
        try:
            self._writer.close()
        except (pa.ArrowException, OSError) as exc:
            return str(exc)
        finally:
            self._closed = True
            self._client.close()
        return "it went away"

    def _reserve(self, size: int) -> None:
        self._wait(lambda: self._credit >= size, f"send {size} bytes")
        with self._cond:
            self._credit -= size

    def send(self, batch: pa.RecordBatch) -> None:
        """Send `batch` (in slices of rows if it is larger than the receiver's bound),
        waiting for credit as needed."""
        if not batch.schema.equals(self.schema):
            msg = f"channel {self.channel} carries {self.schema}, not {batch.schema}"
            raise ValueError(msg)
        metadata = encode(Records(None))
        for part in self._parts(batch, metadata):
            self._reserve(message_bytes(part, metadata))
            self._write(lambda p=part: self._writer.write_with_metadata(p, metadata))

    def _parts(self, batch: pa.RecordBatch, metadata: bytes) -> Iterator[pa.RecordBatch]:
        if message_bytes(batch, metadata) <= self.capacity_bytes:
            yield batch
            return
        if batch.num_rows <= 1:
            msg = (f"a record of {message_bytes(batch, metadata)} bytes is larger than "
                   f"channel {self.channel}'s bound of {self.capacity_bytes} bytes; raise it")
            raise ExchangeError(msg)
        half = batch.num_rows // 2
        yield from self._parts(batch.slice(0, half), metadata)
        yield from self._parts(batch.slice(half), metadata)

    def barrier(self, checkpoint: int) -> None:
        """Barrier `checkpoint`, after everything sent so far."""
        self._control(Barrier(checkpoint))

    def watermark(self, ms: int) -> None:
        """The channel's watermark."""
        self._control(Watermark(ms))

    def idle(self) -> None:
        """The channel's source has nothing to read for now."""
        self._control(Idle())

    def end(self) -> None:
        """End of input, then close the stream once the receiver has it."""
        self._control(EndOfInput())
        self._write(self._writer.done_writing)
        self._wait(lambda: self._done, "close the stream")
        self.close()

    def _control(self, message: Message) -> None:
        metadata = encode(message)
        self._reserve(message_bytes(None, metadata))
        self._write(lambda: self._writer.write_metadata(metadata))

    def _write(self, write: Any) -> None:
        try:
            write()
        except (pa.ArrowException, OSError) as exc:
            with self._cond:
                error = self._error
            msg = error or f"channel {self.channel}'s receiver at {self.location} failed: {exc}"
            raise ExchangeError(msg) from exc

    def close(self) -> None:
        """Drop the stream (after `end`, or to abandon it: the receiver then fails)."""
        if self._closed:
            return
        self._closed = True
        if not self._done:  # abandoned: end the writes, so the receiver ends the call, and
            # wait for that: closing the writer while the credit thread reads would block
            # (gRPC finishes a call only once its reads are done)
            with contextlib.suppress(pa.ArrowException, OSError):
                self._writer.done_writing()
            with self._cond:
                self._cond.wait_for(lambda: self._done, self.timeout_s)
        for close in (self._writer.close, self._client.close):
            # A broken stream fails to close; what broke it was reported already.
            with contextlib.suppress(pa.ArrowException, OSError):
                close()
