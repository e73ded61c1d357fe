"""What is particular to the rocksdb backend: its on-disk layout and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from streamer.state import BackendOptions, StateDescriptor, open_backend
from streamer.state.codec import encode_key, encode_window, split_state_key, split_timer_key
from streamer.state.exceptions import CorruptStateError
from streamer.state.rocksdb_parking import _is_lock_error

STATES = [StateDescriptor("counts", "aggregating"), StateDescriptor("buffer", "list"),
          StateDescriptor("attrs", "map")]


def raw_db(path: Path) -> Rdict:
    options = Options(raw_mode=True)
    names = Rdict.list_cf(str(path), options)
    return Rdict(str(path), options, column_families={n: Options(raw_mode=True) for n in names
                                                      if n != "default"})


def test_one_db_per_subtask_with_a_column_family_per_state_and_key_group_prefixes(
        tmp_path: Path) -> None:
    owned = range(32, 64)
    with open_backend("rocksdb", str(tmp_path), "job", "op", 1, owned, states=STATES) as b:
        for i in range(200):
            kg, key = 32 + i % 32, encode_key((f"u{i}",))
            b.put("counts", kg, key, encode_window(0, 10), i)
            b.append("buffer", kg, key, b"", i)
            b.map_put("attrs", kg, key, b"", b"n", i)
            b.add_timer("event" if i % 2 else "processing", kg, i, key)
        b.commit(1, b"out")
    path = tmp_path / "job" / "op" / "subtask-1"
    assert set(Rdict.list_cf(str(path), Options(raw_mode=True))) == {
        "default", "_meta", "_timers", "state:counts", "state:buffer", "state:attrs"}
    db = raw_db(path)
    try:
        for name in ("state:counts", "state:buffer", "state:attrs"):
            cf = db.get_column_family(name)
            keys = list(cf.keys(from_key=None))  # iter(Rdict) is unusable in raw mode
            assert len(keys) == 200
            assert all(split_state_key(k)[0] in owned and k[:2] == split_state_key(k)[0]
                       .to_bytes(2, "big") for k in keys)
            del cf
        timers = db.get_column_family("_timers")
        assert {split_timer_key(k)[0] for k in timers.keys(from_key=None)} == set(owned)
        del timers
        meta = db.get_column_family("_meta")
        assert meta.get(b"version") == (1).to_bytes(8, "big")
        del meta
    finally:
        db.close()


def test_a_foreign_format_is_refused(tmp_path: Path) -> None:
    open_backend("rocksdb", str(tmp_path), "job", "op", 0, range(4), states=STATES).close()
    path = tmp_path / "job" / "op" / "subtask-0"
    db = raw_db(path)
    meta = db.get_column_family("_meta")
    meta[b"format"] = b"something-else/9"
    del meta
    db.close()
    with pytest.raises(CorruptStateError, match="holds state format"):
        open_backend("rocksdb", str(tmp_path), "job", "op", 0, range(4))
    # the failed open closed the DB again: a raw open works
    raw_db(path).close()


def test_a_damaged_db_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "job" / "op" / "subtask-0"
    path.mkdir(parents=True)
    (path / "CURRENT").write_text("MANIFEST-999999\n")
    with pytest.raises(CorruptStateError, match="cannot open the RocksDB state"):
        open_backend("rocksdb", str(tmp_path), "job", "op", 0, range(4),
                     options=BackendOptions(lock_timeout_s=0.0))


def test_lock_errors_are_recognized() -> None:
    same_process = Exception("IO error: lock hold by current process, acquire time 1 acquiring "
                             "thread 2: /x/LOCK: No locks available")
    other_process = Exception("IO error: While lock file: /x/LOCK: Resource temporarily "
                              "unavailable")
    assert _is_lock_error(same_process)
    assert _is_lock_error(other_process)
    assert not _is_lock_error(Exception("Corruption: bad block"))
