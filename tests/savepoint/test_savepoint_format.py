"""The savepoint state format: real backends (memory, rocksdb) on tmp_path, real Parquet files.

Round trips per backend and across backends, rescaling to another parallelism, relocation of the
savepoint directory, detection of damaged files, the export, and the value encoding.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import shutil
import uuid
import zlib
import zoneinfo
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.savepoint.exceptions import (
    CorruptSavepointError,
    IncompatibleSavepointError,
    SavepointError,
)
from streamer.savepoint.export import export_operator
from streamer.savepoint.format import (
    FORMAT,
    key_group_path,
    operator_metadata,
    restore_key_groups,
    state_schema,
    write_key_groups,
)
from streamer.savepoint.values import decode_value, decode_values, encode_value
from streamer.state import (
    BackendOptions,
    KeyedStateBackend,
    StateDescriptor,
    Timer,
    assign_subtask,
    key_group_range,
    open_backend,
)
from streamer.state.codec import encode_key, encode_window
from streamer.state.memory_files import drop_process_cache

MAX_P = 128
UID = "counts"
STATES = (
    StateDescriptor("value", "value"),
    StateDescriptor("acc", "aggregating"),
    StateDescriptor("sum", "reducing"),
    StateDescriptor("items", "list"),
    StateDescriptor("attrs", "map"),
    StateDescriptor("unused", "value"),
)
PARIS = zoneinfo.ZoneInfo("Europe/Paris")


class Point:
    """A user class a process function might keep in state: only pickle can carry it."""

    def __init__(self, x: int, y: int) -> None:
        self.x, self.y = x, y

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

    def __hash__(self) -> int:
        return hash((self.x, self.y))

    def __repr__(self) -> str:
        return f"Point({self.x}, {self.y})"


#: A value of every type the operators keep, plus a few process functions might.
VALUES: list[Any] = [
    [3, 10.5, None],
    (1_700_000_000_000, 4, "last"),
    [[(1, 0, "a"), (2, 1, "b")], frozenset({"x", "y", "z"}), (12.5, 3)],
    ("key", None, None, [(0, 60_000, [1, 2.0])]),
    [b"\x00\x01key", b"other"],
    {"nested": {"list": [1, 2], "none": None}, "$dollar": 1},
    {1: "int key", (2, 3): "tuple key"},
    Decimal("12345678901234567890.0100"),
    dt.datetime(2024, 5, 1, 12, 30, 0, 123456),
    dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC),
    dt.datetime(2024, 10, 27, 2, 30, tzinfo=PARIS, fold=1),
    dt.date(2024, 2, 29),
    dt.timedelta(days=-2, seconds=5, microseconds=7),
    [float("nan"), float("inf"), -0.0, 2**100],
    {1, 2, 3},
    "ünïcödé \ud83d\ude00",
    True,
    Point(1, 2),
]


# ------------------------------------------------------------------------------ helpers
class Backends:
    """Opens real backends under tmp_path, and closes every one at teardown."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.opened: list[KeyedStateBackend] = []

    def __call__(self, kind: str, subtask: int = 0, parallelism: int = 1, *,
                 name: str = "state", states: Any = STATES) -> KeyedStateBackend:
        backend = open_backend(kind, str(self.root / name), "job", UID, subtask,
                               key_group_range(subtask, parallelism, MAX_P), states=states,
                               options=BackendOptions(lock_timeout_s=0.05))
        self.opened.append(backend)
        return backend


@pytest.fixture
def backends(tmp_path: Path) -> Iterator[Backends]:
    opener = Backends(tmp_path)
    yield opener
    for backend in opener.opened:
        backend.close()
    drop_process_cache()


def kg_of(key: bytes) -> int:
    return zlib.crc32(key) % MAX_P


def fill(backend: KeyedStateBackend, keys: int = 200) -> None:
    """State of every kind over many key groups: values of every type, namespaces, TTL, map
    entries with their own expiry, timers in both domains (only the owned key groups).
    """
    owned = backend.key_groups
    values, accs, sums, lists, maps, timers = [], [], [], [], [], []
    for i in range(keys):
        key = encode_key((f"user-{i}", i % 7))
        kg = kg_of(key)
        if kg not in owned:
            continue
        ns = encode_window(i * 1000, i * 1000 + 60_000) if i % 3 else b""
        values.append((kg, key, ns, VALUES[i % len(VALUES)]))
        accs.append((kg, key, (i * 60_000).to_bytes(8, "big"), [i, i * 1.5, None]))
        if i % 2:
            sums.append((kg, key, b"", i))
        if i % 5 == 0:
            lists.append((kg, key, ns, [f"e{i}", (i, "t"), {"n": i}]))
        if i % 4 == 0:
            maps += [(kg, key, b"", b"color", "red"), (kg, key, b"", b"\xffbin", [i])]
        timers.append((kg, i * 10 - 500, key, ns))
    backend.put_many("value", values)
    backend.put_many("acc", accs, expires_at_ms=[None if i % 2 else 10_000 + i
                                                 for i in range(len(accs))])
    backend.put_many("sum", sums, expires_at_ms=5)  # already expired at most clocks: kept
    backend.append_many("items", lists)
    backend.map_put_many("attrs", maps, expires_at_ms=[None, 99] * (len(maps) // 2))
    backend.add_timers("event", timers)
    backend.add_timers("processing", timers[::3])
    backend.commit(1)


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types all the way down (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and str(a) == str(b))
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, dt.datetime) and isinstance(a.tzinfo, zoneinfo.ZoneInfo):
        return a == b and a.tzinfo == b.tzinfo and a.fold == b.fold
    if isinstance(a, dt.datetime):
        return a == b and a.utcoffset() == b.utcoffset()
    return bool(a == b)


def content(backend: KeyedStateBackend) -> list[Any]:
    """Every entry and timer of every owned key group, comparable and sorted; values as their
    canonical encoding (which tells types apart and compares NaN equal)."""
    out: list[Any] = []
    for kg in backend.key_groups:
        for entry in backend.entries_of_key_group(kg):
            if isinstance(entry, Timer):
                out.append(("timer", kg, entry.domain.value, entry.time_ms, entry.key,
                            entry.namespace))
            else:
                out.append(("entry", kg, entry.state, entry.key, entry.namespace,
                            entry.user_key or b"", encode_value(entry.value),
                            entry.expires_at_ms))
    return sorted(out)


def write_all(sources: list[KeyedStateBackend], url: str) -> dict[str, Any]:
    handles = [write_key_groups(b, url, UID, b.location.subtask) for b in sources]
    return operator_metadata(handles)


def restore_into(backends: Backends, kind: str, url: str, meta: dict[str, Any],
                 parallelism: int, name: str) -> list[KeyedStateBackend]:
    restored = []
    for subtask in range(parallelism):
        target = backends(kind, subtask, parallelism, name=name, states=())
        result = restore_key_groups(url, meta["files"], target, target.key_groups,
                                    states=meta["states"])
        assert result["files"] == sum(1 for f in meta["files"]
                                      if f["key_group"] in target.key_groups)
        target.commit(1)
        restored.append(target)
    return restored


# ------------------------------------------------------------------------------ round trips
@pytest.mark.parametrize("source", ["memory", "rocksdb"])
@pytest.mark.parametrize("target", ["memory", "rocksdb"])
def test_round_trip_keeps_every_entry_timer_value_and_expiry(
        backends: Backends, tmp_path: Path, source: str, target: str) -> None:
    original = backends(source)
    fill(original)
    url = str(tmp_path / "sp-1")
    meta = write_all([original], url)

    (restored,) = restore_into(backends, target, url, meta, 1, f"restored-{target}")
    assert content(restored) == content(original)
    assert state_schema(restored) == state_schema(original)  # "unused" is declared too
    # The values are the very types the operators stored, not a JSON approximation.
    for kg in original.key_groups:
        theirs = {(e.state, e.key, e.namespace, e.user_key): e.value
                  for e in restored.entries_of_key_group(kg) if not isinstance(e, Timer)}
        for e in original.entries_of_key_group(kg):
            if not isinstance(e, Timer):
                assert same(theirs[(e.state, e.key, e.namespace, e.user_key)], e.value)


def test_rocksdb_memory_rocksdb_gives_byte_identical_savepoints(
        backends: Backends, tmp_path: Path) -> None:
    """The format is canonical: the same state gives the same files, whichever backend held
    it (and a retried write gives the same bytes again)."""
    first = backends("rocksdb", name="first")
    fill(first, keys=120)
    meta1 = write_all([first], str(tmp_path / "sp-1"))
    (memory,) = restore_into(backends, "memory", str(tmp_path / "sp-1"), meta1, 1, "mem")
    meta2 = write_all([memory], str(tmp_path / "sp-2"))
    (again,) = restore_into(backends, "rocksdb", str(tmp_path / "sp-2"), meta2, 1, "again")
    meta3 = write_all([again], str(tmp_path / "sp-3"))
    retry = write_all([again], str(tmp_path / "sp-3"))

    assert content(again) == content(first)
    for meta in (meta2, meta3, retry):
        assert meta["files"] == meta1["files"]
    assert meta1["entries"] > 200 and meta1["timers"] > 100


def test_handle_describes_the_files_written(backends: Backends, tmp_path: Path) -> None:
    b = backends("rocksdb", subtask=1, parallelism=2)
    fill(b)
    url = str(tmp_path / "sp")
    handle = write_key_groups(b, url, UID, 1)

    assert handle["format"] == FORMAT
    assert (handle["uid"], handle["subtask"], handle["key_groups"]) == (UID, 1, [64, 128])
    assert handle["states"] == {"acc": "aggregating", "attrs": "map", "items": "list",
                                "sum": "reducing", "unused": "value", "value": "value"}
    assert handle["keys"]["unused"] == 0
    assert sum(handle["keys"].values()) == handle["entries"]
    assert handle["pickled_values"] == sum(1 for v in content(b)
                                           if v[0] == "entry" and b'"$pickle"' in v[6])
    assert handle["pickled_values"] > 0
    written = sorted(p.relative_to(url).as_posix() for p in Path(url).rglob("*")
                     if p.is_file())
    assert written == [f["path"] for f in handle["files"]]  # no temporary files left
    assert handle["bytes"] == sum(f["size"] for f in handle["files"])
    for f in handle["files"]:
        assert f["path"] == key_group_path(UID, f["key_group"]) == \
            f"{UID}/kg-{f['key_group']:05d}.parquet"
        assert 64 <= f["key_group"] < 128
        table = pq.read_table(Path(url) / f["path"])
        assert table.num_rows == f["entries"] + f["timers"]
        meta = json.loads(table.schema.metadata[b"streamer.savepoint"])
        assert meta == {"format": 1, "key_group": f["key_group"], "uid": UID,
                        "value_encoding": "tagged-json-1"}
    empty = set(range(64, 128)) - {f["key_group"] for f in handle["files"]}
    assert all(not list(b.entries_of_key_group(kg)) for kg in empty)


# ------------------------------------------------------------------------------ rescaling
@pytest.mark.slow
@pytest.mark.parametrize("new_parallelism", [4, 1])
@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_restore_at_another_parallelism_redistributes_key_groups(
        backends: Backends, tmp_path: Path, new_parallelism: int, kind: str) -> None:
    old = [backends("rocksdb", s, 2, name="old") for s in range(2)]
    for b in old:
        fill(b, keys=400)
    url = str(tmp_path / "sp")
    meta = write_all(old, url)
    assert [f["key_group"] for f in meta["files"]] == sorted({kg_of(
        encode_key((f"user-{i}", i % 7))) for i in range(400)})

    new = restore_into(backends, kind, url, meta, new_parallelism, f"new-{new_parallelism}")
    everything = []
    for subtask, b in enumerate(new):
        rows = content(b)
        assert all(assign_subtask(row[1], new_parallelism, MAX_P) == subtask for row in rows)
        everything += rows
    assert sorted(everything) == sorted(content(old[0]) + content(old[1]))


# ------------------------------------------------------------------------------ broadcast
@pytest.mark.parametrize(("kind", "new_kind", "new_parallelism"),
                         [("rocksdb", "memory", 3), ("memory", "rocksdb", 1)])
def test_broadcast_state_is_saved_once_and_every_new_subtask_gets_it(
        backends: Backends, tmp_path: Path, kind: str, new_kind: str,
        new_parallelism: int) -> None:
    """Each old subtask holds the same copy in its first key group; the savepoint has one
    (subtask 0's, in key group 0), and every subtask of the new job, at any parallelism and
    backend, finds it in its own first key group, next to its keyed state."""
    name, rules = "broadcast.rules", [(b"gold", 500.0), (b"silver", [1, "x"])]
    states = (StateDescriptor(name, "map"), StateDescriptor("user.seen", "value"))
    old = [backends(kind, s, 2, name="old", states=states) for s in range(2)]
    for b in old:
        for user_key, value in rules:
            b.map_put(name, b.key_groups.start, b"", b"", user_key, value)
        b.put("user.seen", b.key_groups.stop - 1, b"k", b"", 1)
        b.commit(1)
    url = str(tmp_path / "sp")
    meta = operator_metadata([write_key_groups(b, url, UID, s) for s, b in enumerate(old)])
    assert meta["keys"] == {name: 2, "user.seen": 2}
    new = [backends(new_kind, s, new_parallelism, name="new", states=())
           for s in range(new_parallelism)]
    for b in new:
        restore_key_groups(url, meta["files"], b, b.key_groups, states=meta["states"])
        b.commit(1)
        assert b.map_items(name, b.key_groups.start, b"", b"") == rules
    seen = [(kg, b.get("user.seen", kg, b"k")) for b in new for kg in (63, 127)
            if kg in b.key_groups]
    assert seen == [(63, 1), (127, 1)]


# ------------------------------------------------------------------------------ relocation
def test_a_copied_savepoint_restores_without_the_original(backends: Backends,
                                                          tmp_path: Path) -> None:
    b = backends("memory")
    fill(b)
    original = tmp_path / "storage" / "job" / "savepoints" / "sp-1"
    meta = write_all([b], str(original))
    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(original, moved)
    shutil.rmtree(tmp_path / "storage")

    (restored,) = restore_into(backends, "rocksdb", f"file://{moved}", meta, 1, "restored")
    assert content(restored) == content(b)


def test_a_savepoint_on_an_object_store_url(backends: Backends) -> None:
    b = backends("rocksdb")
    fill(b, keys=60)
    url = f"memory://savepoints-{uuid.uuid4().hex}/sp-1"
    meta = write_all([b], url)
    (restored,) = restore_into(backends, "memory", url, meta, 1, "restored")
    assert content(restored) == content(b)


# ------------------------------------------------------------------------------ damage
@pytest.fixture
def savepoint(backends: Backends, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    b = backends("rocksdb")
    fill(b, keys=80)
    url = str(tmp_path / "sp-damaged")
    return url, write_all([b], url)


def test_a_corrupted_file_is_detected_with_a_clear_error(
        backends: Backends, savepoint: tuple[str, dict[str, Any]]) -> None:
    url, meta = savepoint
    victim = meta["files"][3]
    path = Path(url) / victim["path"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    target = backends("memory", name="new", states=())
    with pytest.raises(CorruptSavepointError) as err:
        restore_key_groups(url, meta["files"], target, target.key_groups)
    message = str(err.value)
    for part in (url, repr(UID), f"key group {victim['key_group']}", victim["path"], "sha256"):
        assert part in message


def test_a_missing_or_truncated_file_is_detected(
        backends: Backends, savepoint: tuple[str, dict[str, Any]]) -> None:
    url, meta = savepoint
    first, second = meta["files"][0], meta["files"][1]
    (Path(url) / first["path"]).unlink()
    target = backends("memory", name="new", states=())
    with pytest.raises(CorruptSavepointError, match="is missing"):
        restore_key_groups(url, meta["files"], target, target.key_groups)

    path = Path(url) / second["path"]
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CorruptSavepointError, match="size 100 instead of"):
        restore_key_groups(url, meta["files"][1:], target, target.key_groups)
    with pytest.raises(CorruptSavepointError, match="not a readable Parquet file"):
        restore_key_groups(url, meta["files"][1:], target, target.key_groups, verify=False)


def test_a_file_of_another_format_version_is_refused(
        backends: Backends, savepoint: tuple[str, dict[str, Any]]) -> None:
    url, meta = savepoint
    entry = meta["files"][0]
    path = Path(url) / entry["path"]
    table = pq.read_table(path)
    future = {b"streamer.savepoint": json.dumps({"format": 2, "key_group": entry["key_group"],
                                                 "value_encoding": "other"}).encode()}
    pq.write_table(table.replace_schema_metadata(future), path)
    target = backends("rocksdb", name="new", states=())
    with pytest.raises(IncompatibleSavepointError, match="format 2"):
        restore_key_groups(url, meta["files"], target, target.key_groups, verify=False)


def test_restore_refuses_key_groups_the_backend_does_not_own_and_clashing_kinds(
        backends: Backends, savepoint: tuple[str, dict[str, Any]]) -> None:
    url, meta = savepoint
    half = backends("memory", 0, 2, name="half", states=())
    with pytest.raises(SavepointError, match="not owned by the backend"):
        restore_key_groups(url, meta["files"], half, range(MAX_P))
    clash = backends("rocksdb", name="clash", states=[StateDescriptor("acc", "list")])
    with pytest.raises(SavepointError, match=r"'acc'.*does not fit"):
        restore_key_groups(url, meta["files"], clash, clash.key_groups)


def test_operator_metadata_refuses_overlapping_or_inconsistent_handles(
        backends: Backends, tmp_path: Path) -> None:
    b = backends("memory")
    fill(b, keys=40)
    handle = write_key_groups(b, str(tmp_path / "sp"), UID, 0)
    with pytest.raises(SavepointError, match="written by two subtasks"):
        operator_metadata([handle, handle])
    other = {**handle, "files": [], "states": {"acc": "list"}}
    with pytest.raises(SavepointError, match="'acc' is of kind aggregating in one"):
        operator_metadata([handle, other])
    with pytest.raises(SavepointError, match="cannot name a savepoint directory"):
        write_key_groups(b, str(tmp_path / "sp"), "../escape", 0)


# ------------------------------------------------------------------------------ export
def _exported_rows(out: Path, fmt: str) -> list[dict[str, Any]]:
    if fmt == "jsonl":
        return [json.loads(line) for line in out.read_text().splitlines()]
    rows = pq.read_table(out).to_pylist()
    for row in rows:  # Parquet keeps key and value as JSON text
        row["key"] = json.loads(row["key"])
        row["value"] = None if row["value"] is None else json.loads(row["value"])
    return rows


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_export_writes_one_decoded_row_per_entry_and_timer(
        backends: Backends, tmp_path: Path, fmt: str) -> None:
    b = backends("rocksdb")
    k1, k2 = encode_key(("alice", 7)), encode_key((dt.date(2024, 1, 2), Decimal("1.5")))
    g1, g2 = kg_of(k1), kg_of(k2)
    b.put_many("acc", [(g1, k1, (60_000).to_bytes(8, "big", signed=True), [3, 10.5, None])],
               expires_at_ms=99_000)
    b.put_many("value", [(g2, k2, b"", (1, frozenset({"b", "a"}), b"\x01\xff")),
                         (g1, k1, b"\x01\x02", Point(1, 2))])
    b.map_put_many("attrs", [(g1, k1, b"", b"color", {"x": float("nan")})])
    b.add_timer("event", g1, 119_999, k1, (60_000).to_bytes(8, "big"))
    b.commit(1)
    url = str(tmp_path / "sp")
    meta = write_all([b], url)
    out = tmp_path / f"export.{fmt}"

    summary = export_operator(url, meta["files"], str(out), fmt)
    assert summary == {"path": str(out), "format": fmt, "rows": 5, "entries": 4, "timers": 1,
                       "key_groups": len({g1, g2})}
    rows = _exported_rows(out, fmt)
    by = {(r["state"], r["kind"]): r for r in rows}
    acc = by[("acc", "aggregating")]
    assert acc["key"] == ["alice", 7] and acc["key_group"] == g1
    assert acc["window_start_ms"] == 60_000 and acc["namespace"] == "000000000000ea60"
    assert acc["value"] == [3, 10.5, None] and acc["expires_at_ms"] == 99_000
    tup = next(r for r in rows if r["state"] == "value" and r["key"] == ["2024-01-02", "1.5"])
    assert tup["value"] == [1, ["a", "b"], "01ff"] and tup["window_start_ms"] is None
    assert tup["namespace"] == "" and tup["user_key"] is None and tup["expires_at_ms"] is None
    obj = next(r for r in rows if r["state"] == "value" and r["key"] == ["alice", 7])
    assert obj["value"] == "Point(1, 2)" and obj["namespace"] == "0102"
    attr = by[("attrs", "map")]
    assert attr["user_key"] == "color" and attr["value"] == {"x": "NaN"}
    timer = by[(None, "timer")]
    assert (timer["domain"], timer["time_ms"], timer["key"], timer["window_start_ms"]) == \
        ("event", 119_999, ["alice", 7], 60_000)
    assert timer["value"] is None
    assert [r["key_group"] for r in rows] == sorted(r["key_group"] for r in rows)
    if fmt == "parquet":
        assert pq.read_schema(out).field("window_start_ms").type == pa.int64()


def test_export_refuses_an_unknown_format(savepoint: tuple[str, dict[str, Any]],
                                          tmp_path: Path) -> None:
    url, meta = savepoint
    with pytest.raises(SavepointError, match="unknown export format 'csv'"):
        export_operator(url, meta["files"], str(tmp_path / "x.csv"), "csv")


# ------------------------------------------------------------------------------ values
def test_value_encoding_is_readable_json_with_documented_tags() -> None:
    assert encode_value([3, 10.5, None]) == b"[3,10.5,null]"
    assert encode_value((1, "a")) == b'{"$tuple":[1,"a"]}'
    assert encode_value(frozenset({"b", "a"})) == b'{"$frozenset":["a","b"]}'
    assert encode_value({"a": b"\x00"}) == b'{"a":{"$bytes":"AA=="}}'
    assert encode_value({"$a": 1}) == b'{"$dict":[["$a",1]]}'
    assert encode_value([1.0, float("nan")]) == b'[1.0,{"$float":"nan"}]'
    assert encode_value(Decimal("1.50")) == b'{"$decimal":"1.50"}'
    assert encode_value(dt.datetime(2024, 1, 1, tzinfo=PARIS)) == \
        b'{"$datetime":["2024-01-01T00:00:00+01:00","Europe/Paris"]}'
    assert encode_value(Point(1, 2)).startswith(b'{"$pickle":"')
    for value in VALUES:
        assert same(decode_value(encode_value(value)), value), value
    assert [same(a, b) for a, b in zip(decode_values([encode_value(v) for v in VALUES]),
                                       VALUES, strict=True)] == [True] * len(VALUES)
    with pytest.raises(ValueError, match="unknown value tag"):
        decode_value(b'{"$nope":1}')


_scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text()
            | st.binary(max_size=8) | st.decimals(allow_nan=False)
            | st.dates() | st.datetimes() | st.datetimes(timezones=st.just(dt.UTC))
            | st.timedeltas())
_hashable = st.recursive(_scalars.filter(lambda v: not isinstance(v, float) or v == v),
                         lambda inner: st.tuples(inner, inner) | st.frozensets(inner,
                                                                              max_size=3),
                         max_leaves=6)
_values = st.recursive(
    _scalars,
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner)
                   | st.dictionaries(st.text(max_size=4), inner, max_size=3)
                   | st.dictionaries(_hashable, inner, max_size=3)
                   | st.frozensets(_hashable, max_size=3)),
    max_leaves=12)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(_values)
def test_every_encoded_value_decodes_to_the_same_value_of_the_same_type(value: Any) -> None:
    data = encode_value(value)
    json.loads(data)  # always valid JSON
    back = decode_value(data)
    assert same(back, value)
    assert encode_value(back) == data  # canonical: no drift over a second round trip
