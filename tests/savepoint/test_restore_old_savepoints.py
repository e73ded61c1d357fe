"""Savepoints written by the code of commit e06dd5a (main before the keyed-operator rework:
the operator contract, a watermark per operator) restore with today's code and finish the
output exactly (issue 40: "A savepoint of today's main, for windows, dedupe and an interval
join, restores after the port").

Each fixture under fixtures/e06dd5a/<name>/ (made by make_fixtures.py there, with e06dd5a's
streamer) holds a pipeline (datagen sources, so its offsets are relocatable too), the
savepoint of a run stopped with `stop --savepoint` part-way, the rows that run had committed
(`before_stop.json`) and the rows of an uninterrupted run (`expected.json`). Here each
savepoint is copied out of the repository and restored on real Spark, on rocksdb and on
memory, at the savepoint's parallelism (2) and at another (3): before_stop + what the restore
commits must be expected.json exactly. expected.json is also checked against a brute-force
oracle of the same pipeline in plain Python, so the fixtures do not just trust the old code.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from streamer.cli.main import app
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions
from streamer.savepoint.savepoint_metadata import read_metadata

pytestmark = pytest.mark.spark

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "e06dd5a"
NAMES = ("windows", "dedupe", "interval_join", "rolling")
BASE_MS = 1767225600000
#: The savepoints' uids and the columns whose values are timestamps.
UIDS = {"windows": ("sp-compat-tumbling-v1", "sp-compat-sessions-v1"),
        "dedupe": ("sp-compat-dedupe-v1",), "interval_join": ("sp-compat-interval-join-v1",),
        "rolling": ("sp-compat-rolling-v1",)}
TIMESTAMPS = {"ts", "window_start", "window_end", "payment_ts"}

Rows = dict[str, list[dict[str, Any]]]


def render(text: str, work: Path, parallelism: int, backend: str) -> str:
    for name, value in (("STORAGE", work / "storage"), ("OUT", work / "out"),
                        ("LOCAL", work / "local"), ("PARALLELISM", parallelism),
                        ("BACKEND", backend)):
        text = text.replace("${" + name + "}", str(value))
    assert "${" not in text
    return text


def committed(out: Path) -> Rows:
    """Every sink's committed rows (its part files)."""
    return {sink.name: [json.loads(line) for part in sorted(sink.glob("part-*.jsonl"))
                        for line in part.read_text().splitlines() if line.strip()]
            for sink in sorted(p for p in out.iterdir() if p.is_dir())}


def counted(*parts: Rows) -> dict[str, Counter[str]]:
    total: dict[str, Counter[str]] = defaultdict(Counter)
    for rows in parts:
        for sink, found in rows.items():
            total[sink].update(json.dumps(r, sort_keys=True) for r in found)
    return dict(total)


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def load(folder: Path, name: str) -> Rows:
    rows: Rows = json.loads((folder / name).read_text())
    return rows


@pytest.fixture(scope="module")
def digests() -> dict[str, dict[str, str]]:
    """The fixtures as they are before any test: no test may change them."""
    return {name: tree_digest(FIXTURES / name) for name in NAMES}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["rocksdb", "memory"])
@pytest.mark.parametrize("parallelism", [2, 3])
@pytest.mark.parametrize("name", NAMES)
def test_an_e06dd5a_savepoint_restores_and_finishes_the_output_exactly(
        spark: Any, tmp_path: Path, digests: dict[str, dict[str, str]], name: str,
        parallelism: int, backend: str) -> None:
    fixture = tmp_path / "fixture"
    shutil.copytree(FIXTURES / name, fixture)  # relocated, and the repository's copy untouched
    meta = read_metadata(str(fixture / "savepoint"))
    assert meta.max_parallelism == 128 and set(meta.operators) == set(UIDS[name])
    assert {op["parallelism"] for op in meta.operators.values()} == {2}
    text = render((fixture / "pipeline.yaml").read_text(), tmp_path, parallelism, backend)
    result = JobRunner(load_pipeline_text(text),
                       RunOptions(ui=False, checkpoints=True,
                                  from_savepoint=str(fixture / "savepoint")),
                       spark=spark).run()
    assert result.status == "finished", result
    before, after = load(fixture, "before_stop.json"), committed(tmp_path / "out")
    expected = load(fixture, "expected.json")
    assert sum(map(len, before.values())) > 0 and sum(map(len, after.values())) > 0
    assert counted(before, after) == counted(expected)
    assert tree_digest(FIXTURES / name) == digests[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["interval_join"])
def test_streamer_restore_in_a_process_of_its_own(tmp_path: Path, name: str) -> None:
    """`streamer restore SAVEPOINT FILE --parallelism 1` on the fixture's own pipeline file,
    its placeholders read from the environment (`${VAR}`)."""
    fixture = tmp_path / "fixture"
    shutil.copytree(FIXTURES / name, fixture)
    env = {**os.environ, "STORAGE": str(tmp_path / "storage"), "OUT": str(tmp_path / "out"),
           "LOCAL": str(tmp_path / "local"), "PARALLELISM": "2", "BACKEND": "rocksdb"}
    done = subprocess.run([sys.executable, "-m", "streamer.cli.main", "restore",
                           str(fixture / "savepoint"), str(fixture / "pipeline.yaml"),
                           "--parallelism", "1", "--no-ui", "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finished = json.loads(done.stdout.strip().splitlines()[-1])
    assert finished["status"] == "finished", finished
    before, after = load(fixture, "before_stop.json"), committed(tmp_path / "out")
    assert counted(before, after) == counted(load(fixture, "expected.json"))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_without_the_savepoints_state_the_output_differs(
        spark: Any, tmp_path: Path, name: str) -> None:
    """The control: the same savepoint with every operator under a new uid (its sources'
    offsets restored, its state dropped) does not finish the output, so the restores above
    did read the old state."""
    fixture = tmp_path / "fixture"
    shutil.copytree(FIXTURES / name, fixture)
    text = (fixture / "pipeline.yaml").read_text()
    for uid in UIDS[name]:
        text = text.replace(f"uid: {uid}", f"uid: {uid}-new")
    result = JobRunner(load_pipeline_text(render(text, tmp_path, 2, "memory")),
                       RunOptions(ui=False, checkpoints=True, allow_non_restored_state=True,
                                  from_savepoint=str(fixture / "savepoint")),
                       spark=spark).run()
    assert result.status == "finished", result
    before, after = load(fixture, "before_stop.json"), committed(tmp_path / "out")
    assert counted(before, after) != counted(load(fixture, "expected.json"))


@pytest.mark.parametrize("name", NAMES)
def test_the_expected_output_is_the_oracles(name: str) -> None:
    expected = load(FIXTURES / name, "expected.json")
    assert counted({sink: [normalized(r) for r in rows] for sink, rows in expected.items()}) \
        == counted(ORACLES[name]())


@pytest.mark.parametrize("name", NAMES)
def test_the_savepoint_is_relocatable_and_the_cli_reads_it(tmp_path: Path, name: str) -> None:
    """Nothing in `_metadata` points outside the savepoint; today's `restore --dry-run`
    restores every operator, and `savepoint export` decodes each operator's old state."""
    fixture = tmp_path / "fixture"
    shutil.copytree(FIXTURES / name, fixture)
    raw = (fixture / "savepoint" / "_metadata").read_text()
    assert "/tmp" not in raw and "/work" not in raw and "file:" not in raw
    for op in read_metadata(str(fixture / "savepoint")).operators.values():
        for entry in op["files"]:
            assert not Path(entry["path"]).is_absolute()
            assert (fixture / "savepoint" / entry["path"]).is_file()
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(render((fixture / "pipeline.yaml").read_text(), tmp_path, 3,
                               "memory"))
    runner = CliRunner()
    dry = runner.invoke(app, ["restore", "--dry-run", str(fixture / "savepoint"),
                              str(pipeline)])
    assert dry.exit_code == 0, dry.output
    for uid in UIDS[name]:
        assert uid in dry.output, dry.output
        out = tmp_path / f"{uid}.jsonl"
        export = runner.invoke(app, ["savepoint", "export", str(fixture / "savepoint"),
                                     "--operator", uid, "-o", str(out)])
        assert export.exit_code == 0, export.output
        assert [json.loads(x) for x in out.read_text().splitlines()], uid


# The oracles: each pipeline's datagen rows and operator in plain Python.

def ms(iso: str) -> int:
    return int(dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def normalized(row: dict[str, Any]) -> dict[str, Any]:
    return {k: ms(v) if k in TIMESTAMPS and isinstance(v, str) else v for k, v in row.items()}


def datagen(limit: int, row: Any) -> list[dict[str, Any]]:
    return [row(offset, split) for split in (0, 1) for offset in range(limit)]


def windows() -> Rows:
    clicks = datagen(150, lambda o, s: {
        "user": f"u{(o * 7 + s) % 3}", "amount": float(o % 10),
        "ts": BASE_MS + o * 1000 + (o // 25) * 9000 + s * 10})
    by_window: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    by_user: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(clicks, key=lambda r: r["ts"]):
        by_window[r["user"], r["ts"] // 10000 * 10000].append(r)
        by_user[r["user"]].append(r)
    tumbling = [{"user": user, "window_start": start, "window_end": start + 10000,
                 "n": len(rs), "spent": sum(r["amount"] for r in rs),
                 "first_amount": rs[0]["amount"]} for (user, start), rs in by_window.items()]
    sessions = []
    for user, rs in by_user.items():
        for session in split_where(rs, lambda a, b: b["ts"] - a["ts"] >= 4000):
            sessions.append({"user": user, "window_start": session[0]["ts"],
                             "window_end": session[-1]["ts"] + 4000, "n": len(session),
                             "spent": sum(r["amount"] for r in session),
                             "last_amount": session[-1]["amount"]})
    return {"tumbling": tumbling, "sessions": sessions}


def split_where(rows: list[dict[str, Any]], cut: Any) -> Iterable[list[dict[str, Any]]]:
    run = [rows[0]]
    for a, b in pairwise(rows):
        if cut(a, b):
            yield run
            run = []
        run.append(b)
    yield run


def dedupe() -> Rows:
    events = datagen(150, lambda o, s: {
        "k": f"k{(o // 6) % 7}", "v": o * 10 + s, "ts": BASE_MS + o * 1000 + s * 10})
    first: dict[str, int] = {}
    out = []
    for r in sorted(events, key=lambda r: r["ts"]):
        if r["k"] not in first or r["ts"] > first[r["k"]] + 8000:
            first[r["k"]] = r["ts"]
            out.append(r)
    return {"out": out}


def interval_join() -> Rows:
    orders = datagen(100, lambda o, s: {
        "order_id": o * 2 + s, "amount": float(o % 13), "ts": BASE_MS + o * 1000 + s * 10})
    payments = datagen(100, lambda o, s: {
        "order_id": -1 - (o * 2 + s) if o % 5 == 3 else o * 2 + s,
        "paid": float(o % 13) + 0.5, "ts": BASE_MS + o * 1000 + s * 10 + (o % 7) * 1000})
    out = []
    for order in orders:
        matched = [p for p in payments if p["order_id"] == order["order_id"]
                   and 0 <= p["ts"] - order["ts"] <= 5000]
        out += [{**order, "payment_paid": p["paid"], "payment_ts": p["ts"]} for p in matched]
        if not matched:
            out.append({**order, "payment_paid": None, "payment_ts": None})
    return {"out": out}


def rolling() -> Rows:
    """An update per key and epoch: each epoch reads 20 offsets of each split (40 records
    per epoch over 2 splits), and a key's row carries its totals after that epoch."""
    clicks = datagen(120, lambda o, s: {
        "user": f"u{(o * 3 + s) % 9}", "amount": float(o % 10), "epoch": o // 20})
    totals: dict[str, dict[str, Any]] = {}
    out = []
    for epoch in sorted({r["epoch"] for r in clicks}):
        touched = []
        for r in (r for r in clicks if r["epoch"] == epoch):
            t = totals.setdefault(r["user"], {"user": r["user"], "n": 0, "spent": 0.0,
                                              "top": r["amount"]})
            t["n"] += 1
            t["spent"] += r["amount"]
            t["top"] = max(t["top"], r["amount"])
            touched.append(r["user"])
        out += [dict(totals[user]) for user in dict.fromkeys(touched)]
    return {"out": out}


ORACLES = {"windows": windows, "dedupe": dedupe, "interval_join": interval_join,
           "rolling": rolling}
