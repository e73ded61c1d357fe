"""One contract, every backend: the same tests run against `memory` and `rocksdb` (real
rocksdict on tmp_path), so the backends cannot drift apart.
"""

from __future__ import annotations

import multiprocessing
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamer.state import KeyedStateBackend, StateDescriptor, StateEntry, Timer
from streamer.state.codec import encode_key, encode_window
from streamer.state.exceptions import (
    CommitError,
    IncompatibleStateError,
    KeyGroupError,
    StateClosedError,
    StateError,
    StateLockedError,
    UnknownStateError,
)

K1, K2, K3 = encode_key(("alice",)), encode_key(("bob",)), encode_key(("carol", 7))
W1, W2 = encode_window(0, 60_000), encode_window(60_000, 120_000)
OTHER_KIND = {"memory": "rocksdb", "rocksdb": "memory"}


def canonical(backend: KeyedStateBackend, now_ms: int | None = None) -> list[Any]:
    """Every entry and timer of every owned key group, in a comparable, sorted form."""
    out: list[Any] = []
    for kg in backend.key_groups:
        for entry in backend.entries_of_key_group(kg, now_ms=now_ms):
            if isinstance(entry, Timer):
                out.append(("timer", entry.domain.value, entry.time_ms, entry.key_group,
                            entry.key, entry.namespace))
            else:
                out.append(("state", kg, entry.state, entry.key, entry.namespace,
                            entry.user_key or b"", repr(entry.value), entry.expires_at_ms))
    return sorted(out)


def fill(backend: KeyedStateBackend) -> None:
    """A bit of every kind of state, with namespaces, TTL and timers, over several key groups."""
    backend.put_many("value", [(0, K1, b"", "a"), (1, K2, W1, {"x": 1}), (7, K3, W2, 3.5)])
    backend.put_many("acc", [(2, K1, W1, (3, 10.0)), (2, K1, W2, (1, 2.0))],
                     expires_at_ms=[None, 5_000])
    backend.put("sum", 5, K2, b"", 42)
    backend.append_many("items", [(3, K1, W1, ["e1", "e2"]), (3, K2, W1, [{"n": 1}])])
    backend.map_put_many("attrs", [(4, K1, b"", b"color", "red"), (4, K1, b"", b"size", 9),
                                   (6, K3, W1, b"k", ["v"])], expires_at_ms=[None, 9_000, None])
    backend.add_timers("event", [(0, 60_000, K1, W1), (7, -5, K3, b""), (3, 60_000, K1, W2)])
    backend.add_timer("processing", 2, 1_000, K2)


@pytest.mark.parametrize("open_state", ["memory", "rocksdb"], indirect=True)
class TestBackendContract:
    # ------------------------------------------------------------------ values and accumulators
    def test_values_are_addressed_by_key_group_key_and_namespace(self, open_state: Any) -> None:
        b = open_state()
        b.put_many("value", [(1, K1, W1, "w1"), (1, K1, W2, "w2"), (1, K2, W1, "k2"),
                             (2, K1, W1, "kg2")])
        assert b.get_many("value", [(1, K1, W1), (1, K1, W2), (1, K2, W1), (2, K1, W1),
                                    (1, K1, b""), (3, K1, W1)]) == \
            ["w1", "w2", "k2", "kg2", None, None]
        b.put("value", 1, K1, W1, ("tuple", 1))
        b.delete("value", 1, K1, W2)
        b.put("value", 1, K2, W1, None)  # None deletes, as Flink's update(null)
        assert b.get_many("value", [(1, K1, W1), (1, K1, W2), (1, K2, W1)]) == \
            [("tuple", 1), None, None]

    def test_accumulators_are_merged_by_the_caller_across_epochs(self, open_state: Any) -> None:
        b = open_state()
        for epoch, batch in enumerate([[1, 2], [3], [4, 5, 6]], start=1):
            keys = [(0, K1, W1), (0, K2, W1)]
            current = b.get_many("acc", keys)
            merged = [((c or (0, 0))[0] + len(batch), (c or (0, 0))[1] + sum(batch))
                      for c in current]
            b.put_many("acc", [(kg, k, ns, m) for (kg, k, ns), m in zip(keys, merged,
                                                                          strict=True)])
            b.commit(epoch)
            b = open_state.reopen(b)
        assert b.get_many("acc", [(0, K1, W1), (0, K2, W1)]) == [(6, 21), (6, 21)]
        assert b.get("sum", 0, K1, W1) is None

    def test_shared_reads_see_every_write_commit_and_reopen(self, open_state: Any) -> None:
        """`get_many_shared` gives what `get_many` gives, buffered writes, TTL and deletes
        included, and one object to both of two readers of one stored value."""
        b = open_state()
        b.put_many("value", [(1, K1, b"", ["row", 1]), (2, K2, b"", ["row", 1])])
        keys = [(1, K1, b""), (2, K2, b""), (3, K3, b"")]
        first = b.get_many_shared("value", keys)
        assert first == [["row", 1], ["row", 1], None] == b.get_many("value", keys)
        b.commit(1)
        again = b.get_many_shared("value", keys)
        assert again[0] is first[0] or b.name == "memory"  # (rocksdb: decoded once)
        assert again[0] is again[1] or b.name == "memory"  # (equal bytes, one object)
        b.put("value", 1, K1, b"", ["row", 2])
        b.delete("value", 2, K2)
        b.put("value", 3, K3, b"", ["row", 3], expires_at_ms=5_000)
        assert b.get_many_shared("value", keys, now_ms=1_000) == [["row", 2], None, ["row", 3]]
        assert b.get_many_shared("value", keys, now_ms=5_000) == [["row", 2], None, None]
        b.commit(2)  # (the expired entry was read at its expiry: deleted with the commit)
        b = open_state.reopen(b)
        assert b.get_many_shared("value", keys) == b.get_many("value", keys) == [
            ["row", 2], None, None]

    def test_bulk_reads_and_writes_of_many_entries(self, open_state: Any) -> None:
        b = open_state(key_groups=range(16, 48))
        keys = [(16 + i % 32, encode_key((f"user-{i}", i)), encode_window(i, i + 10))
                for i in range(3000)]
        b.put_many("acc", [(kg, k, ns, (i, float(i))) for i, (kg, k, ns) in enumerate(keys)])
        expected = [(i, float(i)) for i in range(3000)]
        assert b.get_many("acc", keys) == expected
        b.commit(1)
        b = open_state.reopen(b)
        assert b.get_many("acc", keys) == expected
        b.delete_many("acc", keys[::2])
        assert b.get_many("acc", keys)[:4] == [None, (1, 1.0), None, (3, 3.0)]

    # ------------------------------------------------------------------ lists and maps
    def test_list_append_put_and_delete(self, open_state: Any) -> None:
        b = open_state()
        b.append("items", 1, K1, W1, "a")
        b.append_many("items", [(1, K1, W1, ["b", "c"]), (1, K2, W1, [1])])
        got = b.get("items", 1, K1, W1)
        assert got == ["a", "b", "c"]
        got.append("mutated")  # a returned list is the caller's copy
        b.commit(1)
        b = open_state.reopen(b)
        assert b.get_many("items", [(1, K1, W1), (1, K2, W1), (1, K3, W1)]) == \
            [["a", "b", "c"], [1], None]
        b.append("items", 1, K1, W1, "d")
        assert b.get("items", 1, K1, W1) == ["a", "b", "c", "d"]
        b.put("items", 1, K2, W1, ["x", "y"])
        b.put("items", 1, K1, W1, [])  # an empty list deletes
        assert b.get_many("items", [(1, K1, W1), (1, K2, W1)]) == [None, ["x", "y"]]

    def test_map_put_get_delete_and_items_sorted_by_user_key(self, open_state: Any) -> None:
        b = open_state()
        b.map_put_many("attrs", [(2, K1, W1, b"z", 1), (2, K1, W1, b"a", 2),
                                 (2, K1, W2, b"a", 3)])
        b.map_put("attrs", 2, K1, W1, b"m", [3])
        assert b.map_items("attrs", 2, K1, W1) == [(b"a", 2), (b"m", [3]), (b"z", 1)]
        b.commit(1)
        b = open_state.reopen(b)
        b.map_delete("attrs", 2, K1, W1, b"z")
        b.map_put("attrs", 2, K1, W1, b"b", "new")
        assert b.map_get_many("attrs", [(2, K1, W1, b"z"), (2, K1, W1, b"b"),
                                        (2, K1, W2, b"a")]) == [None, "new", 3]
        assert b.map_items("attrs", 2, K1, W1) == [(b"a", 2), (b"b", "new"), (b"m", [3])]
        assert b.get_many("attrs", [(2, K1, W2), (2, K2, W2)]) == [{b"a": 3}, None]
        b.put("attrs", 2, K1, W2, {b"q": 1, b"r": 2})  # replaces the whole map
        b.delete("attrs", 2, K1, W1)
        assert b.get_many("attrs", [(2, K1, W1), (2, K1, W2)]) == [None, {b"q": 1, b"r": 2}]
        b.commit(2)
        b = open_state.reopen(b)
        assert b.map_items("attrs", 2, K1, W1) == []
        assert b.map_items("attrs", 2, K1, W2) == [(b"q", 1), (b"r", 2)]

    def test_iterate_a_key_group(self, open_state: Any) -> None:
        b = open_state()
        fill(b)
        b.commit(1)
        b.put("value", 1, K1, b"", "pending")  # iteration sees buffered writes
        assert sorted(b.iterate("value", 1), key=repr) == \
            sorted([(K1, b"", "pending"), (K2, W1, {"x": 1})], key=repr)
        assert sorted(b.iterate("items", 3), key=repr) == \
            sorted([(K1, W1, ["e1", "e2"]), (K2, W1, [{"n": 1}])], key=repr)
        assert list(b.iterate("attrs", 4)) == [(K1, b"", {b"color": "red", b"size": 9})]
        assert list(b.iterate("acc", 4)) == []

    # ------------------------------------------------------------------ TTL
    def test_ttl_expired_entries_read_as_absent_and_are_dropped_on_commit(
            self, open_state: Any) -> None:
        b = open_state()
        b.put_many("value", [(1, K1, b"", "short"), (1, K2, b"", "long"), (1, K3, b"", "never")],
                   expires_at_ms=[1_000, 5_000, None])
        keys = [(1, K1, b""), (1, K2, b""), (1, K3, b"")]
        assert b.get_many("value", keys, now_ms=999) == ["short", "long", "never"]
        assert b.get_many("value", keys, now_ms=1_000) == [None, "long", "never"]
        b.commit(1)
        b = open_state.reopen(b)
        # the expired read scheduled a delete: gone even when read without a clock
        assert b.get_many("value", keys) == [None, "long", "never"]
        b.put("value", 1, K2, b"", "rewritten")  # a write sets the expiry anew (here: none)
        assert b.get("value", 1, K2, b"", now_ms=10**9) == "rewritten"

    def test_ttl_on_lists_and_map_entries(self, open_state: Any) -> None:
        b = open_state()
        b.append("items", 1, K1, W1, "old", expires_at_ms=100)
        b.map_put_many("attrs", [(1, K1, W1, b"a", 1), (1, K1, W1, b"b", 2)],
                       expires_at_ms=[100, 200])
        b.commit(1)
        assert b.get("items", 1, K1, W1, now_ms=99) == ["old"]
        b.append("items", 1, K1, W1, "new", now_ms=150)  # the expired list starts empty
        assert b.get("items", 1, K1, W1) == ["new"]
        assert b.map_items("attrs", 1, K1, W1, now_ms=150) == [(b"b", 2)]
        assert b.map_get("attrs", 1, K1, W1, b"b", now_ms=200) is None
        assert b.get("attrs", 1, K1, W1, now_ms=200) is None

    def test_purge_expired_drops_every_expired_entry(self, open_state: Any) -> None:
        b = open_state()
        fill(b)
        b.commit(1)
        before = canonical(b)
        assert b.purge_expired(now_ms=4_999) == 0
        assert b.purge_expired(now_ms=9_000) == 2  # acc (2, K1, W2) and attrs size
        b.commit(2)
        b = open_state.reopen(b)
        after = canonical(b)
        assert len(after) == len(before) - 2
        assert b.get("acc", 2, K1, W2) is None
        assert b.map_items("attrs", 4, K1) == [(b"color", "red")]

    # ------------------------------------------------------------------ timers
    def test_due_timers_are_sorted_and_inclusive(self, open_state: Any) -> None:
        b = open_state()
        b.add_timers("event", [(5, 200, K1, b""), (1, 200, K2, W1), (1, 200, K1, W2),
                               (0, -7, K3, b""), (7, 10**15, K1, b""), (1, 200, K1, W1)])
        b.add_timer("event", 5, 200, K1)  # the same timer twice is one timer
        b.add_timer("processing", 1, 50, K1)
        due = b.due_timers("event", 200)
        assert [(t.time_ms, t.key_group, t.key, t.namespace) for t in due] == [
            (-7, 0, K3, b""), (200, 1, K2, W1), (200, 1, K1, W1), (200, 1, K1, W2),
            (200, 5, K1, b"")]  # K2 (b"...bob") sorts before K1 (b"...alice"): shorter
        assert due == sorted(due)
        assert all(t.domain == "event" for t in due)
        assert b.due_timers("event", -8) == []
        assert [t.time_ms for t in b.due_timers("processing", 10**18)] == [50]
        assert b.next_timer("event") == -7
        assert b.next_timer("processing") == 50

    def test_timers_survive_commit_and_can_be_removed(self, open_state: Any) -> None:
        b = open_state()
        b.add_timers("event", [(2, 100, K1, W1), (3, 50, K2, W1), (4, 300, K3, b"")])
        b.commit(1)
        b = open_state.reopen(b)
        assert b.next_timer("event") == 50
        fired = b.due_timers("event", 100, remove=True)
        assert [t.time_ms for t in fired] == [50, 100]
        assert b.due_timers("event", 100) == []
        assert b.next_timer("event") == 300
        b.add_timer("event", 2, 20, K1, W2)  # registered while firing
        assert b.next_timer("event") == 20
        b.delete_timer("event", 2, 20, K1, W2)
        b.delete_timer("event", 6, 1, K1)  # absent: no-op
        b.commit(2)
        b = open_state.reopen(b)
        assert [t.time_ms for t in b.due_timers("event", 10**6)] == [300]
        assert b.next_timer("processing") is None
        b.abort()
        b.delete_timer("event", 4, 300, K3)
        assert b.next_timer("event") is None

    # ------------------------------------------------------------------ epochs and commits
    def test_reads_see_buffered_writes_and_abort_drops_them(self, open_state: Any) -> None:
        b = open_state()
        b.put("value", 1, K1, b"", "committed")
        b.commit(1)
        b.put("value", 1, K1, b"", "buffered")
        b.add_timer("event", 1, 5, K1)
        assert b.get("value", 1, K1) == "buffered"
        b.abort()
        assert b.get("value", 1, K1) == "committed"
        assert b.next_timer("event") is None
        assert b.version() == 1

    def test_uncommitted_writes_are_invisible_after_reopen(self, open_state: Any) -> None:
        b = open_state()
        fill(b)
        b.commit(1)
        committed = canonical(b)
        b.put("value", 0, K1, b"", "lost")
        b.append("items", 3, K1, W1, "lost")
        b.map_delete("attrs", 4, K1, b"", b"color")
        b.add_timer("event", 5, 1, K2)
        b.delete_timer("event", 0, 60_000, K1, W1)
        b = open_state.reopen(b)  # close without commit
        assert b.version() == 1
        assert canonical(b) == committed

    def test_commit_stores_version_and_outputs_atomically(self, open_state: Any) -> None:
        b = open_state(keep_outputs=2)
        assert b.version() is None
        b.put("value", 1, K1, b"", "e1")
        b.commit(1, b"out-1")
        b.commit(2)  # an epoch without outputs
        b.put("value", 1, K1, b"", "e3")
        b.commit(3, b"out-3")
        b.commit(5, b"out-5")
        assert (b.outputs(5), b.outputs(3), b.outputs(1), b.outputs(2)) == \
            (b"out-5", b"out-3", None, None)
        with pytest.raises(CommitError, match="already committed"):
            b.commit(5, b"again")
        with pytest.raises(CommitError):
            b.commit(4)
        b = open_state.reopen(b)
        assert b.version() == 5
        assert b.outputs(5) == b"out-5"
        assert b.get("value", 1, K1) == "e3"

    def test_a_retried_task_replays_outputs_instead_of_applying_twice(
            self, open_state: Any) -> None:
        def run_epoch(epoch: int, rows: int) -> bytes:
            backend = open_state()
            try:
                if backend.version() == epoch:  # already committed by an earlier attempt
                    replay = backend.outputs(epoch)
                    assert replay is not None
                    return replay
                count = (backend.get("sum", 0, K1) or 0) + rows
                backend.put("sum", 0, K1, b"", count)
                out = f"count={count}".encode()
                backend.commit(epoch, out)
                return out
            finally:
                backend.close()

        assert run_epoch(1, 5) == b"count=5"
        assert run_epoch(1, 5) == b"count=5"  # the retry
        assert run_epoch(2, 1) == b"count=6"

    # ------------------------------------------------------------------ enumerate and rebuild
    @pytest.mark.parametrize("target", ["same", "other"])
    def test_enumerate_per_key_group_and_ingest_rebuilds_identical_state(
            self, open_state: Any, tmp_path: Path, target: str) -> None:
        source = open_state()
        fill(source)
        source.commit(1)
        kind = source.name if target == "same" else OTHER_KIND[source.name]
        rebuilt = open_state(root=tmp_path / "rebuilt", kind=kind)
        for kg in source.key_groups:
            rebuilt.ingest(kg, source.entries_of_key_group(kg))
        rebuilt.commit(1)
        rebuilt = open_state.reopen(rebuilt)
        assert canonical(rebuilt) == canonical(source)
        assert canonical(rebuilt, now_ms=6_000) == canonical(source, now_ms=6_000)
        assert rebuilt.due_timers("event", 10**6) == source.due_timers("event", 10**6)

    def test_rescale_by_key_group_to_two_subtasks(self, open_state: Any, tmp_path: Path) -> None:
        source = open_state()
        fill(source)
        source.commit(1)
        halves = [open_state(subtask=i, key_groups=range(4 * i, 4 * i + 4),
                             root=tmp_path / "rescaled") for i in range(2)]
        for half in halves:
            for kg in half.key_groups:
                half.ingest(kg, source.entries_of_key_group(kg))
            half.commit(1)
        with pytest.raises(KeyGroupError):
            halves[0].ingest(5, source.entries_of_key_group(5))
        assert sorted(canonical(halves[0]) + canonical(halves[1])) == canonical(source)

    def test_entries_of_key_group_are_backend_independent_records(self, open_state: Any) -> None:
        b = open_state()
        fill(b)
        entries = list(b.entries_of_key_group(4))
        assert entries == [StateEntry("attrs", K1, b"", "red", b"color", None),
                           StateEntry("attrs", K1, b"", 9, b"size", 9_000)]
        assert list(b.entries_of_key_group(7)) == [
            StateEntry("value", K3, W2, 3.5), Timer(-5, 7, K3, b"", "event")]

    # ------------------------------------------------------------------ declarations, errors
    def test_states_are_declared_with_a_kind_that_sticks(self, open_state: Any) -> None:
        b = open_state(states=[StateDescriptor("seen", "value")])
        with pytest.raises(UnknownStateError, match=r"'nope' .* not declared"):
            b.get("nope", 0, K1)
        b.declare(StateDescriptor("buffer", "list"))
        with pytest.raises(IncompatibleStateError, match="is a list state"):
            b.map_put("buffer", 0, K1, b"", b"k", 1)
        with pytest.raises(IncompatibleStateError):
            b.append("seen", 0, K1, b"", 1)
        b.commit(1)
        b = open_state.reopen(b, states=[])
        assert {n: d.kind.value for n, d in b.states().items()} == \
            {"seen": "value", "buffer": "list"}
        with pytest.raises(IncompatibleStateError, match="re-declared as map"):
            b.declare(StateDescriptor("buffer", "map"))
        b.declare(StateDescriptor("buffer", "list"))  # idempotent
        with pytest.raises(StateError, match="not valid"):
            StateDescriptor("bad/name", "value")
        with pytest.raises(StateError, match="unknown kind"):
            StateDescriptor("ok", "set")

    def test_key_groups_outside_the_subtask_are_refused(self, open_state: Any) -> None:
        b = open_state(subtask=1, key_groups=range(4, 8))
        with pytest.raises(KeyGroupError, match="routed to the wrong subtask"):
            b.put("value", 3, K1, b"", 1)
        with pytest.raises(KeyGroupError):
            b.get_many("value", [(4, K1, b""), (8, K1, b"")])
        with pytest.raises(KeyGroupError):
            b.add_timer("event", 9, 1, K1)

    def test_a_closed_backend_refuses_use(self, open_state: Any) -> None:
        b = open_state()
        b.close()
        b.close()  # idempotent
        with pytest.raises(StateClosedError):
            b.get("value", 0, K1)
        with pytest.raises(StateClosedError):
            b.commit(1)

    # ------------------------------------------------------------------ processes and locking
    def test_a_second_opener_of_an_open_subtask_gets_a_clear_error(self, open_state: Any) -> None:
        first = open_state()
        with pytest.raises(StateLockedError, match="open in another task or process"):
            open_state()
        first.close()
        second = open_state()
        assert second.version() is None

    def test_an_abandoned_iteration_does_not_keep_the_subtask_locked(
            self, open_state: Any) -> None:
        b = open_state()
        b.put_many("value", [(1, encode_key((i,)), b"", i) for i in range(10_000)])
        b.commit(1)
        values = b.iterate("value", 1)
        entries = b.entries_of_key_group(1)
        assert next(values)[2] in range(10_000)
        assert isinstance(next(entries), StateEntry)
        b.close()
        again = open_state()
        assert again.version() == 1
        del values, entries

    def test_another_process_sees_committed_state_and_the_lock(self, open_state: Any) -> None:
        b = open_state()
        b.put("value", 3, K1, b"", "from-parent")
        b.append_many("items", [(3, K1, b"", [1, 2])])
        b.map_put("attrs", 3, K1, b"", b"k", "v")
        b.add_timer("event", 3, 123, K1)
        b.commit(1, b"parent-out")
        b.put("value", 3, K1, b"", "uncommitted")
        states = list(b.states().values())
        root = str(open_state.root)
        import state_child  # tests/state is on sys.path under pytest's default import mode

        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(1, mp_context=context) as pool:
            locked = pool.submit(state_child.try_open, b.name, root, states).result()
            assert locked.startswith("locked: ")
            assert "open in another task or process" in locked
            b.close()
            seen = pool.submit(state_child.read_and_advance, b.name, root, states, K1).result()
        assert seen == {"version": 1, "outputs": b"parent-out", "value": "from-parent",
                        "items": [1, 2], "attrs": {b"k": "v"}, "timers": [123]}
        b = open_state()  # this process may hold an older copy: it must see version 2
        assert b.version() == 2
        assert b.outputs(2) == b"child-out"
        assert b.get("value", 3, K1) == "from-child"
        assert b.next_timer("processing") == 77

    def test_a_parked_subtask_serves_the_next_task_here_and_another_process(
            self, open_state: Any) -> None:
        """`park` ends a task like `close` as far as anyone can tell: this process gets the
        committed state back (rocksdb: the same open handle, no reopen), another process
        gets it too (a release request makes this process's watcher close the parked DB),
        and after that this process sees what the other one committed."""
        b = open_state()
        b.put("value", 3, K1, b"", "from-parent")
        b.commit(1, b"parent-out")
        b.put("value", 3, K1, b"", "uncommitted")
        b.park()
        again = open_state()
        assert again.version() == 1 and again.get("value", 3, K1) == "from-parent"
        assert (again is b) == (b.name == "rocksdb")
        states = list(again.states().values())
        again.park()
        import state_child

        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(1, mp_context=context) as pool:
            seen = pool.submit(state_child.read_and_advance, b.name, str(open_state.root),
                               states, K1).result()
        assert seen["version"] == 1 and seen["value"] == "from-parent"
        latest = open_state()
        assert latest is not b
        assert latest.version() == 2 and latest.get("value", 3, K1) == "from-child"
        assert not (open_state.root / "job" / "op" / "subtask-0" / "RELEASE-REQUEST").exists()
        # Nothing is parked here now (the watcher sleeps); parking again must wake it for
        # the next request.
        latest.park()
        with ProcessPoolExecutor(1, mp_context=context) as pool:
            opened = pool.submit(state_child.try_open, b.name, str(open_state.root),
                                 states).result()
        assert opened == "opened"  # released within the child's 0.1 s lock wait
        assert open_state().version() == 2

    # ------------------------------------------------------------------ random histories
    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.one_of(
        st.tuples(st.just("put"), st.integers(0, 3), st.sampled_from([K1, K2]),
                  st.sampled_from([b"", W1]), st.integers(-3, 3)),
        st.tuples(st.just("append"), st.integers(0, 3), st.sampled_from([K1, K2]),
                  st.sampled_from([b"", W1]), st.integers(-3, 3)),
        st.tuples(st.just("mput"), st.integers(0, 3), st.sampled_from([K1, K2]),
                  st.sampled_from([b"a", b"b"]), st.integers(-3, 3)),
        st.tuples(st.just("mdelete"), st.integers(0, 3), st.sampled_from([K1, K2]),
                  st.sampled_from([b"a", b"b"]), st.none()),
        st.tuples(st.just("delete"), st.integers(0, 3), st.sampled_from([K1, K2]),
                  st.sampled_from([b"", W1]), st.none()),
        st.tuples(st.just("timer"), st.integers(0, 3), st.sampled_from([K1, K2]),
                  st.sampled_from([b"", W1]), st.integers(-2, 2)),
        st.tuples(st.sampled_from(["commit", "abort", "reopen", "fire"]), st.none(), st.none(),
                  st.none(), st.none()),
    ), max_size=30))
    def test_random_histories_match_a_dict_model(self, open_state: Any,
                                                 ops: list[tuple[Any, ...]]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            b = open_state(key_groups=range(4), root=Path(tmp))
            committed: dict[Any, Any] = {}
            working: dict[Any, Any] = {}
            version = 0
            for op, kg, key, ns, value in ops:
                if op == "put":
                    b.put("value", kg, key, ns, value)
                    working[("value", kg, key, ns)] = value
                elif op == "append":
                    b.append("items", kg, key, ns, value)
                    working[("items", kg, key, ns)] = [
                        *working.get(("items", kg, key, ns), []), value]
                elif op == "mput":
                    b.map_put("attrs", kg, key, b"", ns, value)
                    working[("attrs", kg, key, ns)] = value
                elif op == "mdelete":
                    b.map_delete("attrs", kg, key, b"", ns)
                    working.pop(("attrs", kg, key, ns), None)
                elif op == "delete":
                    b.delete_many("value", [(kg, key, ns)])
                    b.delete("items", kg, key, ns)
                    working.pop(("value", kg, key, ns), None)
                    working.pop(("items", kg, key, ns), None)
                elif op == "timer":
                    b.add_timer("event", kg, value, key, ns)
                    working[("timer", kg, key, ns, value)] = True
                elif op == "fire":
                    fired = b.due_timers("event", 0, remove=True)
                    expected = sorted((t, g, k, n) for (kind, g, k, n, t) in
                                      [w for w in working if w[0] == "timer"] if t <= 0)
                    assert [(t.time_ms, t.key_group, t.key, t.namespace) for t in fired] == \
                        expected
                    for t, g, k, n in expected:
                        del working[("timer", g, k, n, t)]
                elif op == "commit":
                    version += 1
                    b.commit(version)
                    committed = dict(working)
                elif op == "abort":
                    b.abort()
                    working = dict(committed)
                else:
                    b = open_state.reopen(b)
                    working = dict(committed)
            model = []
            for entry, value in working.items():
                if entry[0] == "timer":
                    _, kg, key, ns, time_ms = entry
                    model.append(("timer", "event", time_ms, kg, key, ns))
                elif entry[0] == "attrs":
                    _, kg, key, user_key = entry
                    model.append(("state", kg, "attrs", key, b"", user_key, repr(value), None))
                else:
                    state, kg, key, ns = entry
                    model.append(("state", kg, state, key, ns, b"", repr(value), None))
            assert canonical(b) == sorted(model)
            b.close()


def test_open_backend_refuses_unknown_kinds_and_unsafe_names(tmp_path: Path) -> None:
    from streamer.state import open_backend

    with pytest.raises(StateError, match="unknown state backend 'redis'"):
        open_backend("redis", str(tmp_path), "job", "op", 0, range(4))
    with pytest.raises(StateError, match="cannot name a state directory"):
        open_backend("memory", str(tmp_path), "../job", "op", 0, range(4))
    with pytest.raises(KeyGroupError, match="non-empty contiguous range"):
        open_backend("rocksdb", str(tmp_path), "job", "op", 0, range(0))
