"""The exchange between subtasks (`exchange.flight`, `exchange.gate`) with real Arrow Flight
servers and clients, each in a process of its own, on 127.0.0.1: order and barriers, the
bound under a slow consumer, backpressure that releases, and failures that are errors."""

from __future__ import annotations

import multiprocessing
import socket
import time
from collections.abc import Iterator
from typing import Any

import exchange_peers  # tests/exchange is on sys.path under pytest's default import mode
import pytest

from streamer.exchange.alignment import MAX_WATERMARK
from streamer.exchange.exceptions import ExchangeError
from streamer.exchange.flight import ExchangeSender, ExchangeServer

pytestmark = pytest.mark.slow  # processes of their own

CTX = multiprocessing.get_context("spawn")
WAIT_S = 60


class Peers:
    """A receiving subtask and its senders, in processes this test started."""

    def __init__(self) -> None:
        self.processes: list[Any] = []
        self.kept: list[Any] = []
        self.results = CTX.Queue()
        self.sent = CTX.Queue()

    def receiver(self, channels: int, capacity: int, **kwargs: Any) -> tuple[Any, str]:
        ports = CTX.Queue()
        process = CTX.Process(target=exchange_peers.receive,
                              args=(channels, capacity, ports, self.results), kwargs=kwargs)
        process.start()
        self.processes.append(process)
        return process, f"grpc+tcp://127.0.0.1:{ports.get(timeout=WAIT_S)}"

    def sender(self, location: str, channel: int, plan: list[tuple[Any, ...]],
               timeout_s: float = 30.0) -> tuple[Any, Any]:
        progress = CTX.Value("i", 0)
        self.kept.append(progress)  # alive until the child has it (spawn pickles a name)
        process = CTX.Process(target=exchange_peers.send,
                              args=(location, channel, plan, progress, self.sent, timeout_s))
        process.start()
        self.processes.append(process)
        return process, progress

    def received(self) -> dict[str, Any]:
        seen = self.results.get(timeout=WAIT_S)
        assert "error" not in seen, seen["error"]
        return seen

    def sent_by(self, n: int) -> dict[int, dict[str, Any]]:
        return {r["channel"]: r for r in (self.sent.get(timeout=WAIT_S) for _ in range(n))}


@pytest.fixture
def peers() -> Iterator[Peers]:
    made = Peers()
    yield made
    for process in made.processes:
        if process.is_alive():
            process.kill()
        process.join(10)


def batches(count: int, rows: int, checkpoint: int, start: int, pad: int = 0
            ) -> list[tuple[Any, ...]]:
    return [("rows", start + i * rows, rows, checkpoint, pad) for i in range(count)]


def stalled(progress: Any, below: int) -> int:
    """Wait until `progress` started and stopped moving (the sender is blocked), below
    `below`."""
    last = 0
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if progress.value == last > 0:
            assert last < below
            return last
        last = progress.value
    raise AssertionError("the sender never stalled")


def test_channels_keep_their_order_and_barriers_stay_with_the_data(peers: Peers) -> None:
    capacity = 32 * 1024
    _, location = peers.receiver(3, capacity)
    totals = {}
    for channel in range(3):
        plan: list[tuple[Any, ...]] = []
        seq = 0
        for checkpoint in range(1, 5):
            count = 5 + 2 * channel
            plan += batches(count, 20, checkpoint, seq)
            seq += count * 20
            plan.append(("watermark", checkpoint * 1000 + channel))
            if checkpoint < 4:
                plan.append(("barrier", checkpoint))
        plan.append(("end",))
        totals[channel] = seq
        peers.sender(location, channel, plan)
    seen = peers.received()
    sent = peers.sent_by(3)
    assert all(r.get("ok") for r in sent.values()), sent
    assert seen["snapshots"] == [1, 2, 3]
    assert seen["misplaced"] == 0  # no record crossed its barrier
    for channel, total in totals.items():
        assert seen["seqs"][channel] == list(range(total))
    assert seen["watermarks"] == sorted(set(seen["watermarks"]))
    assert seen["watermarks"][-1] == MAX_WATERMARK
    assert 1000 in seen["watermarks"] and 3000 in seen["watermarks"]
    assert max(seen["peaks"]) <= capacity


def test_the_bound_holds_under_a_slow_consumer(peers: Peers) -> None:
    """A consumer taking 10 ms a batch: the sender is held to the channel's bound, which
    fills (the sender waits on credit, not the other way round), and never overflows; a
    batch larger than the bound goes in slices."""
    capacity = 16 * 1024
    _, location = peers.receiver(1, capacity, delay_s=0.01)
    plan = batches(120, 10, 1, 0, pad=200)  # ~2.3 KB each
    plan += batches(2, 100, 1, 1200, pad=1000)  # ~100 KB each: over the bound
    plan.append(("end",))
    peers.sender(location, 0, plan)
    seen = peers.received()
    sent = peers.sent_by(1)
    assert sent[0].get("ok"), sent
    assert seen["seqs"][0] == list(range(1400))
    peak = seen["peaks"][0]
    assert capacity // 2 <= peak <= capacity, peak


def test_a_sender_blocked_by_a_full_receiver_resumes(peers: Peers) -> None:
    go = CTX.Event()
    _, location = peers.receiver(1, 8 * 1024, go=go)
    plan = [*batches(60, 10, 1, 0, pad=100), ("end",)]
    _, progress = peers.sender(location, 0, plan)
    blocked_at = stalled(progress, below=len(plan))
    assert blocked_at <= 8  # ~1.2 KB a batch within 8 KiB of credit
    go.set()
    sent = peers.sent_by(1)
    assert sent[0].get("ok"), sent
    assert progress.value == len(plan)
    assert peers.received()["seqs"][0] == list(range(600))


def test_a_killed_receiver_is_an_error_for_its_sender(peers: Peers) -> None:
    go = CTX.Event()
    receiver, location = peers.receiver(1, 8 * 1024, go=go)
    plan = [*batches(60, 10, 1, 0, pad=100), ("end",)]
    _, progress = peers.sender(location, 0, plan, timeout_s=120)
    stalled(progress, below=len(plan))
    receiver.kill()
    outcome = peers.sent_by(1)[0]
    assert outcome["error"] == "ExchangeError", outcome
    assert "channel 0's receiver at" in outcome["message"]  # the stream broke (gRPC's reason)
    assert outcome["elapsed"] < 60  # the broken stream, not the two-minute credit timeout


def test_a_receiver_that_gives_no_credit_times_out(peers: Peers) -> None:
    go = CTX.Event()
    _, location = peers.receiver(1, 8 * 1024, go=go)
    _, progress = peers.sender(location, 0, batches(60, 10, 1, 0, pad=100), timeout_s=1.0)
    outcome = peers.sent_by(1)[0]
    assert outcome["error"] == "ExchangeTimeoutError", outcome
    assert "did not let it send" in outcome["message"]
    assert 0 < progress.value < 60


def test_a_sender_that_dies_fails_its_receiver(peers: Peers) -> None:
    go = CTX.Event()
    _, location = peers.receiver(2, 8 * 1024, go=go)
    peers.sender(location, 0, [*batches(5, 10, 1, 0), ("end",)])
    sender, progress = peers.sender(location, 1, batches(60, 10, 1, 0, pad=100))
    stalled(progress, below=60)
    sender.kill()
    go.set()
    seen = peers.results.get(timeout=WAIT_S)
    assert "channel 1" in seen.get("error", ""), seen


def test_no_receiver_is_an_error_at_once() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(ExchangeError, match="channel 0"):
        ExchangeSender(f"grpc+tcp://127.0.0.1:{port}", 0, exchange_peers.SCHEMA, timeout_s=5)
    assert time.monotonic() - start < 5


def test_the_receiver_refuses_unknown_and_second_senders() -> None:
    server = ExchangeServer("127.0.0.1", 1, 4096)
    try:
        with pytest.raises(ExchangeError, match="no input channel"):
            ExchangeSender(server.location, 3, exchange_peers.SCHEMA, timeout_s=5)
        first = ExchangeSender(server.location, 0, exchange_peers.SCHEMA, timeout_s=5)
        assert first.capacity_bytes == 4096
        with pytest.raises(ExchangeError, match="already has a sender"):
            ExchangeSender(server.location, 0, exchange_peers.SCHEMA, timeout_s=5)
        first.send(exchange_peers.rows(0, 3, 1))
        first.barrier(1)
        channel = server.wait_ready(timeout_s=5)
        assert channel == 0
        assert server.take(0).payload.column("seq").to_pylist() == [0, 1, 2]
        first.end()
    finally:
        assert server.close()


def test_a_sender_abandoned_without_end_of_input_closes_at_once_and_fails_its_channel(
        ) -> None:
    """Closing a stream that never sent its end (a failing subtask) neither hangs the sender
    nor passes for a finished channel: the receiver's subtask gets the error."""
    server = ExchangeServer("127.0.0.1", 1, 4096)
    try:
        sender = ExchangeSender(server.location, 0, exchange_peers.SCHEMA, timeout_s=30)
        sender.send(exchange_peers.rows(0, 3, 1))
        start = time.monotonic()
        sender.close()
        assert time.monotonic() - start < 5
        with pytest.raises(ExchangeError, match="closed it without end of input"):
            server.wait_ready(timeout_s=5)
    finally:
        assert server.close()


def test_a_batch_off_its_alignment_is_copied_and_an_aligned_one_is_not() -> None:
    """gRPC hands a receiver buffers at any address between executors; Acero (the keyed
    kernels' group_by) warns on each such batch, so the receiver realigns them."""
    import pyarrow as pa

    from streamer.exchange.flight import aligned

    batch = pa.record_batch({"k": pa.array(["a", None, "ccc"]),
                             "v": pa.array([1, 2, 3], pa.int64()),
                             "xs": pa.array([[1.5], [], None], pa.list_(pa.float64()))})
    shifted = pa.py_buffer(b"\0" + batch.serialize().to_pybytes()).slice(1)
    off = pa.ipc.read_record_batch(shifted, batch.schema)
    assert any(b is not None and b.address % 8 for c in off.columns for b in c.buffers())
    fixed = aligned(off)
    assert fixed.equals(batch)
    assert all(b is None or b.address % 8 == 0 for c in fixed.columns for b in c.buffers())
    assert aligned(batch) is batch


def test_closing_the_receiver_after_a_channel_ended_is_not_an_error_for_its_sender() -> None:
    """The receiver may finish (every channel's end of input taken) and close before gRPC
    has read the end of a sender's stream. A channel that sent its end is complete: closing
    it is not news for its sender, which must not fail (this raced under load in CI)."""
    import struct
    import threading

    import pyarrow.flight as flight

    from streamer.exchange.alignment import EndOfInput
    from streamer.exchange.flight import encode

    server = ExchangeServer("127.0.0.1", 1, 4096)
    client = flight.FlightClient(server.location)
    writer, reader = client.do_put(flight.FlightDescriptor.for_path("channel", "0"),
                                   exchange_peers.SCHEMA)
    closer = threading.Thread(target=server.close, daemon=True)
    try:
        writer.write_metadata(encode(EndOfInput()))
        assert server.wait_ready(timeout_s=10) == 0
        assert isinstance(server.take(0), EndOfInput)
        closer.start()  # the subtask is done: it closes while the stream is still open
        time.sleep(0.5)
        writer.done_writing()
        grants = []
        while (buf := reader.read()) is not None:
            grants.append(struct.unpack("<q", buf.to_pybytes())[0])
        assert grants and all(g > 0 for g in grants), grants
    finally:
        writer.close()
        client.close()
        closer.join(10)
        assert not closer.is_alive()
