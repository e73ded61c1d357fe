"""Joins end to end on real Spark, RocksDB and files: the checks against the inputs' columns
(`streamer validate`), stop with savepoint -> restore at another parallelism and backend with
exactly the uninterrupted run's output, and the restore check that refuses a changed join."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from streamer_process import FilesOutput
from test_savepoints import JOB_HEAD

from streamer.pipeline.exceptions import PipelineError
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.checks import analyze_spec
from streamer.runtime.job.control import ControlChannel
from streamer.runtime.job.coordinator import JobRunner, RunOptions
from streamer.runtime.observe.metrics import JsonReporter
from streamer.savepoint.savepoint_metadata import SavepointError, plan_restore, read_metadata

pytestmark = pytest.mark.spark

BASE_MS = 1767225600000

#: 400 orders, one a second; payment i is for order i, 0, 15, 30 or 45 s after it (i % 4): a
#: left join within [0s, 30s] pairs three in four and emits the fourth unpaid.
PIPELINE = """\
name: join-sp
""" + JOB_HEAD + """sources:
  - id: orders
    type: datagen
    limit: 400
    max_records_per_epoch: 100
    fields:
      order_id: "offset"
      amount: "cast(offset % 7 as double)"
      ts: "timestamp_millis({base} + offset * 1000)"
    event_time: ts
    watermark: {{max_out_of_orderness: 1s}}
  - id: payments
    type: datagen
    limit: 400
    max_records_per_epoch: 100
    fields:
      order_id: "offset"
      paid: "cast(offset % 7 as double)"
      pts: "timestamp_millis({base} + offset * 1000 + (offset % 4) * 15000)"
    event_time: pts
    watermark: {{max_out_of_orderness: 1s}}
operators:
  - id: paid
    uid: paid-v1
    join: {{left: orders, right: payments, on: [order_id], type: left, between: [0s, 30s]}}
sinks:
  - id: out
    type: files
    input: paid
    path: {out}
    format: jsonl
"""


def committed(directory: Path) -> Counter[str]:
    return FilesOutput(directory).committed()


class Job:
    def __init__(self, tmp: Path) -> None:
        self.tmp, self.storage, self.out = tmp, tmp / "storage", tmp / "out"

    def text(self, *, parallelism: int = 2, backend: str = "rocksdb") -> str:
        return PIPELINE.format(storage=self.storage, parallelism=parallelism, backend=backend,
                               local=self.tmp / "local", base=BASE_MS, out=self.out)

    def run(self, spark: Any, text: str, *, stop_at: int | None = None,
            **options: Any) -> Any:
        """Run; with `stop_at`, stop with a savepoint once that epoch is done."""
        spec = load_pipeline_text(text)
        storage, filed = str(self.storage), []

        class Capture:
            def write(self, s: str) -> None:
                for line in s.splitlines():
                    event = json.loads(line) if line else {}
                    if (stop_at and not filed and event.get("event") == "epoch"
                            and event["epoch"] >= stop_at):
                        filed.append(ControlChannel(storage, "join-sp").request(
                            kind="stop", savepoint=True, drain=False))

            def flush(self) -> None:
                pass

        return JobRunner(spec, RunOptions(ui=False, checkpoints=True, **options), spark=spark,
                         reporter=JsonReporter(Capture())).run()  # type: ignore[arg-type]


@pytest.mark.slow
def test_savepoint_then_restore_at_another_parallelism_and_backend(
        spark: Any, tmp_path: Path) -> None:
    reference_job = Job(tmp_path / "reference")
    assert reference_job.run(spark, reference_job.text()).status == "finished"
    reference = committed(reference_job.out)
    rows = [json.loads(r) for r in reference.elements()]
    assert len(rows) == 400  # every order once: paid (300) or not (100)
    assert sum(r["paid"] is None for r in rows) == 100
    assert all(r["paid"] is None or r["paid"] == r["amount"] for r in rows)

    job = Job(tmp_path / "resumed")
    stopped = job.run(spark, job.text(parallelism=2, backend="rocksdb"), stop_at=2)
    assert stopped.status == "stopped" and len(stopped.savepoints) == 1
    meta = read_metadata(stopped.savepoints[0])
    saved = meta.operators["paid-v1"]
    assert set(saved["states"]) >= {"join.chunks"}  # (an interval join: chunks of records)
    assert sum(saved["keys"].values()) > 0  # records buffered across the savepoint
    assert saved["definition"]["join"] == {"type": "left", "left_key": ["order_id"],
                                           "right_key": ["order_id"], "between": [0, 30000],
                                           "window": None}
    assert sum(committed(job.out).values()) < 400
    # `savepoint export` shows the buffered records one a row, with their key and side.
    from streamer.savepoint.export import export_operator

    exported = tmp_path / "export.jsonl"
    export_operator(stopped.savepoints[0], saved["files"], str(exported), "jsonl")
    records = [json.loads(line) for line in exported.read_text().splitlines()]
    buffered = [r for r in records if r["state"] == "join.chunks"]
    assert buffered and all(r["kind"] != "timer" for r in buffered)
    for r in buffered:
        assert isinstance(r["key"][0], int) and r["value"]["side"] in ("left", "right")
        own = set(r["value"]) - {"side", "event_time_ms", "matched"}
        assert ("amount" in own) == (r["value"]["side"] == "left") != ("paid" in own)
        assert not any(name.startswith("__") for name in own)
    result = job.run(spark, job.text(parallelism=3, backend="memory"),
                     from_savepoint=stopped.savepoints[0])
    assert result.status == "finished"
    assert committed(job.out) == reference

    # A changed bound, type or key is refused before anything runs, naming the operator.
    for old, new in (("between: [0s, 30s]", "between: [0s, 1m]"), ("type: left", "type: full"),
                     ("on: [order_id]",
                      "left_key: [order_id], right_key: [paid], right_prefix: p_")):
        spec = load_pipeline_text(job.text().replace(old, new))
        decisions = plan_restore(meta, spec)
        assert [(d.operator, d.action) for d in decisions] == [("paid", "refuse")], old
        assert "the join changed" in decisions[0].reason
    with pytest.raises(SavepointError, match=r"operator 'paid' \(uid 'paid-v1'\): the join "
                                             r"changed"):
        job.run(spark, job.text().replace("type: left", "type: inner"),
                from_savepoint=stopped.savepoints[0])


COLUMNS = textwrap.dedent("""\
    name: join-check
    sources:
      - id: a
        type: datagen
        limit: 1
        fields: {k: "offset", x: "offset", ts: "timestamp_millis(offset)"}
        event_time: ts
      - id: b
        type: datagen
        limit: 1
        fields: {k: "offset", x: "offset", bts: "timestamp_millis(offset)"}
        event_time: bts
    operators:
      - id: j
        join: {left: a, right: b, on: [k], between: [0s, 1s]}
    sinks:
      - id: out
        type: console
        input: j
    """)


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("", "", "p.yaml:15:28: join 'j': column(s) 'x' would be on both sides of the output; set "
     "right_prefix: (e.g. 'b_') or rename them with a select before the join"),
    # (found without Spark, from the datagen fields, when the file is loaded)
    ("on: [k]", "left_key: [k], right_key: [kk]",
     "p.yaml:15:58: join 'j': right key column 'kk' is not in its input; did you mean 'k'?"),
    ('fields: {k: "offset", x: "offset", bts',
     'fields: {k: "cast(offset as string)", x: "offset", bts',
     "p.yaml:15:35: join 'j': key column 'k' is bigint on the left but 'k' is string on the "
     "right; cast one side (with_columns) so both have one type"),
    ("    event_time: bts\n", "",
     "p.yaml:14:28: the right input 'b' of join 'j' has no event time; a join matches "
     "records by event time: set event_time: (and a watermark) on its source"),
])
def test_validate_checks_the_join_against_its_inputs(spark: Any, old: str, new: str,
                                                     expected: str) -> None:
    text = COLUMNS
    if old:  # (every case but the clash sets right_prefix, so that only its problem shows)
        text = text.replace(old, new).replace("1s]}", "1s], right_prefix: r_}")
    with pytest.raises(PipelineError) as info:  # loading, or Spark's analyzer after it
        analyze_spec(load_pipeline_text(text, file="p.yaml", env={}), spark)
    assert [str(p) for p in info.value.problems] == [expected]


def test_a_window_joins_own_window_columns_clash_with_an_inputs(spark: Any) -> None:
    """A window join adds window_start and window_end (the window each pair met in): an
    input column of either name is refused where the window is set, with the fix."""
    text = COLUMNS.replace('{k: "offset", x: "offset", ts',
                           '{k: "offset", window_end: "offset", ts')
    text = text.replace("between: [0s, 1s]}", "window: {tumbling: 1s}, right_prefix: r_}")
    with pytest.raises(PipelineError) as info:
        analyze_spec(load_pipeline_text(text, file="p.yaml", env={}), spark)
    assert [str(p) for p in info.value.problems] == [
        "p.yaml:15:48: join 'j': column(s) 'window_end' of an input would clash with the "
        "window join's own window_start and window_end (the window each pair met in); drop "
        "or rename them with a select before the join, or set right_prefix: when they are "
        "the right input's"]
    fine = text.replace('window_end: "offset"', 'x: "offset"')
    analyze_spec(load_pipeline_text(fine, file="p.yaml", env={}), spark)  # (no clash: valid)


#: Page views (200, one a second, user i % 10) enriched with a users table read from a file:
#: users 0-7 (user 3 twice: the later event time wins, though it comes first in the file; as of
#: the views' times, in a temporal join, the earlier one).
TABLE = """\
name: join-sp
""" + JOB_HEAD + """sources:
  - id: views
    type: datagen
    limit: 200
    max_records_per_epoch: 50
    fields:
      user_id: "offset % 10"
      page: "concat('/p', cast(offset as string))"
      ts: "timestamp_millis({base} + offset * 1000)"
    event_time: ts
    watermark: {{max_out_of_orderness: 1s}}
  - id: users
    type: files
    path: {users}/*.jsonl
    format: jsonl
    schema: {{user_id: bigint, name: string, updated: timestamp}}
    event_time: updated
operators:
  - id: enriched
    uid: enriched-v1
    join: {{left: views, right: users, on: [user_id], type: left, table: {table}}}
sinks:
  - id: out
    type: files
    input: enriched
    path: {out}
    format: jsonl
"""


@pytest.mark.slow
@pytest.mark.parametrize("table", ["true", "{as_of: event_time}"])
def test_table_join_enriches_and_restores_at_another_parallelism_and_backend(
        spark: Any, tmp_path: Path, table: str) -> None:
    temporal = table != "true"
    users = tmp_path / "users"
    users.mkdir()
    lines = [{"user_id": 3, "name": "new", "updated": "2026-01-02T00:00:00Z"}]
    lines += [{"user_id": i, "name": f"u{i}", "updated": "2026-01-01T00:00:00Z"}
              for i in range(8)]
    (users / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))

    def text(job: Job, parallelism: int = 2, backend: str = "rocksdb") -> str:
        return TABLE.format(storage=job.storage, parallelism=parallelism, backend=backend,
                            local=job.tmp / "local", base=BASE_MS, out=job.out, users=users,
                            table=table)

    reference_job = Job(tmp_path / "reference")
    assert reference_job.run(spark, text(reference_job)).status == "finished"
    reference = committed(reference_job.out)
    rows = [json.loads(r) for r in reference.elements()]
    assert len(rows) == 200
    names = {(r["user_id"], r["name"]) for r in rows}
    assert names == {*((i, f"u{i}") for i in range(8) if i != 3),
                     (3, "u3" if temporal else "new"), (8, None), (9, None)}
    first = next(reference_job.out.glob("part-*.jsonl")).read_text().splitlines()[0]
    assert list(json.loads(first)) == ["user_id", "page", "ts", "name", "updated"]

    job = Job(tmp_path / "resumed")
    stopped = job.run(spark, text(job), stop_at=2)
    assert stopped.status == "stopped" and len(stopped.savepoints) == 1
    meta = read_metadata(stopped.savepoints[0])
    saved = meta.operators["enriched-v1"]
    # The table's rows; temporal: its versions (user 3's two) and the views that wait for the
    # watermark, in the keys of join.left (processing time: left records wait for nothing).
    assert saved["keys"]["join.right"] == 8
    assert (saved["keys"].get("join.left", 0) > 0) == temporal
    assert saved["definition"]["join"]["table"] == ("event_time" if temporal
                                                    else "processing_time")
    assert sum(committed(job.out).values()) < 200
    result = job.run(spark, text(job, 3, "memory"), from_savepoint=stopped.savepoints[0])
    assert result.status == "finished"
    assert committed(job.out) == reference

    other = "true" if temporal else "{as_of: event_time}"
    for old, new in ((f"table: {table}", f"table: {other}"), ("type: left", "type: inner"),
                     (f"table: {table}", "between: [0s, 1s]")):
        decisions = plan_restore(meta, load_pipeline_text(text(job).replace(old, new)))
        assert [(d.operator, d.action) for d in decisions] == [("enriched", "refuse")], old
        assert "the join changed" in decisions[0].reason


#: Views, one jsonl file an epoch (`{files}`: the files' directory), as the left input.
VIEWS = """  - id: views
    type: files
    path: {files}/views/*.jsonl
    format: jsonl
    schema: {{user_id: bigint, page: string, ts: timestamp}}
    event_time: ts
    max_files_per_epoch: 1
"""

#: Two jsonl files sources read one file an epoch (`{files}`: the files' directory), joined by
#: `{join}` into `out`; the watermark is each source's newest event time (no out-of-orderness).
FILES = """\
name: join-files
""" + JOB_HEAD + """sources:
""" + VIEWS + """  - id: users
    type: files
    path: {files}/users/*.jsonl
    format: jsonl
    schema: {{user_id: bigint, name: string, updated: timestamp}}
    event_time: updated{users_extra}
operators:
  - id: j
    join: {{left: views, right: users, on: [user_id], type: left, {join}}}
sinks:
  - id: out
    type: files
    input: j
    path: {out}
    format: jsonl
"""


def at(seconds: float) -> str:
    """An ISO timestamp `seconds` after 2026-01-01T00:00:00Z (`BASE_MS`)."""
    import datetime

    moment = datetime.datetime.fromtimestamp(BASE_MS / 1000 + seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def run_files(spark: Any, tmp: Path, join: str, *,
              users_extra: str = "\n    max_files_per_epoch: 1",
              backend: str = "memory", **options: Any) -> Any:
    text = FILES.format(storage=tmp / "storage", parallelism=2, backend=backend,
                        local=tmp / "local", files=tmp, out=tmp / "out", join=join,
                        users_extra=users_extra)
    return JobRunner(load_pipeline_text(text), RunOptions(ui=False, checkpoints=True,
                                                          **options), spark=spark).run()


def test_late_records_of_a_join_without_late_output_are_counted(spark: Any,
                                                                tmp_path: Path) -> None:
    """An interval join without `late:` drops its late records and counts them, as a window
    does: the epoch's `late`, the operator's `late`, the run's `late`."""
    write_jsonl(tmp_path / "views" / "a.jsonl",
                [{"user_id": i, "page": f"/{i}", "ts": at(100)} for i in range(3)])
    write_jsonl(tmp_path / "users" / "a.jsonl",
                [{"user_id": i, "name": f"u{i}", "updated": at(100)} for i in range(3)])
    # Behind the watermark (100 s) that the second epoch carries in: one late record a side.
    write_jsonl(tmp_path / "views" / "b.jsonl", [{"user_id": 5, "page": "/5", "ts": at(1)},
                                                 {"user_id": 6, "page": "/6", "ts": at(200)}])
    write_jsonl(tmp_path / "users" / "b.jsonl", [{"user_id": 5, "name": "u5",
                                                  "updated": at(2)}])
    result = run_files(spark, tmp_path, "between: [-10s, 10s]")
    assert result.status == "finished"
    assert result.late == 2
    assert [m.late for m in result.metrics][:2] == [0, 2]
    assert result.metrics[1].operators["j"]["late"] == 2
    rows = sorted((r["user_id"], r["name"]) for r in (
        json.loads(line) for line in committed(tmp_path / "out").elements()))
    assert rows == [(0, "u0"), (1, "u1"), (2, "u2"), (6, None)]


def test_temporal_join_with_a_bounded_table_is_not_held_back(spark: Any, tmp_path: Path) -> None:
    """A bounded table read whole no longer holds the watermark back from the epoch that
    read it on (its watermark, 100 s before the views, would hold every view back): each
    view is joined in the epoch after the one that read it, but the last epoch's: the end of
    input follows its records in that epoch, so they are joined there (no epoch of its own)."""
    write_jsonl(tmp_path / "users" / "a.jsonl",
                [{"user_id": i, "name": f"u{i}", "updated": at(-100)} for i in range(3)])
    for n in range(3):
        write_jsonl(tmp_path / "views" / f"{n}.jsonl",
                    [{"user_id": i, "page": f"/{n}", "ts": at(10 * n + i)} for i in range(3)])
    result = run_files(spark, tmp_path, "table: {as_of: event_time}")
    assert result.status == "finished"
    assert [m.records_out.get("out", 0) for m in result.metrics] == [0, 3, 6]
    assert [m.watermark for m in result.metrics][:3] == [BASE_MS + 2000, BASE_MS + 12000,
                                                         2**62]
    rows = {(r["user_id"], r["page"], r["name"]) for r in (
        json.loads(line) for line in committed(tmp_path / "out").elements())}
    assert rows == {(i, f"/{n}", f"u{i}") for i in range(3) for n in range(3)}


#: Views (files, one a epoch) enriched by two table joins of one users changelog (a Kafka
#: topic read with `key: user_id`, two records a epoch): `now` (processing time) and `asof`
#: (temporal), each into its own sink; undecodable users go to `dead`.
CHANGELOG = """\
name: join-changelog
""" + JOB_HEAD + """sources:
""" + VIEWS + """  - id: users
    type: kafka
    bootstrap_servers: {bootstrap}
    topic: {topic}
    bounded: true
    max_records_per_epoch: 2
    key: user_id
    schema: {{user_id: bigint, name: string, updated: timestamp}}
    event_time: updated
    on_error: dead
operators:
  - id: now
    join: {{left: views, right: users, on: [user_id], type: left, table: true}}
  - id: asof
    join: {{left: views, right: users, on: [user_id], type: left, table: {{as_of: event_time}}}}
sinks:
  - {{id: now_out, type: files, input: now, path: {files}/now, format: jsonl}}
  - {{id: asof_out, type: files, input: asof, path: {files}/asof, format: jsonl}}
  - {{id: dead, type: files, path: {files}/dead, format: jsonl}}
"""


@pytest.mark.kafka
def test_a_changelog_tombstone_deletes_the_table_row(spark: Any, kafka: Any,
                                                     tmp_path: Path) -> None:
    """Epoch 1 reads users 1 and 2 and the views at 1 s; epoch 2 the tombstone of user 1
    (Kafka timestamp 5 s), one of a key that is not a number, and the views at 3 s and 10 s.
    Processing time: the views after the tombstone's epoch find no row of user 1. Temporal:
    the deletion is a version at 5 s, so the view at 3 s still joins user 1's row."""
    from confluent_kafka import Producer

    topic = kafka.create_topic(f"users-{tmp_path.name}")
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for key, value, seconds in (
            (b"1", {"user_id": 1, "name": "a", "updated": at(0)}, 0),
            (b"2", {"user_id": 2, "name": "b", "updated": at(0)}, 0),
            (b"1", None, 5), (b"x", None, 5)):
        producer.produce(topic, key=key, value=None if value is None else json.dumps(value),
                         timestamp=BASE_MS + seconds * 1000)
    assert producer.flush(30) == 0
    write_jsonl(tmp_path / "views" / "a.jsonl",
                [{"user_id": u, "page": "/a", "ts": at(1)} for u in (1, 2)])
    write_jsonl(tmp_path / "views" / "b.jsonl", [
        {"user_id": 1, "page": "/b3", "ts": at(3)}, {"user_id": 1, "page": "/b10", "ts": at(10)},
        {"user_id": 2, "page": "/b10", "ts": at(10)}])
    text = CHANGELOG.format(storage=tmp_path / "storage", parallelism=2, backend="rocksdb",
                            local=tmp_path / "local", files=tmp_path, bootstrap=kafka.bootstrap,
                            topic=topic)
    result = JobRunner(load_pipeline_text(text), RunOptions(ui=False, checkpoints=True),
                       spark=spark).run()
    assert result.status == "finished", result.reason
    del producer

    def rows(name: str) -> set[tuple[Any, ...]]:
        return {(r["user_id"], r["page"], r["name"]) for r in (
            json.loads(line) for line in committed(tmp_path / name).elements())}

    assert rows("now") == {(1, "/a", "a"), (2, "/a", "b"), (1, "/b3", None),
                           (1, "/b10", None), (2, "/b10", "b")}
    assert rows("asof") == {(1, "/a", "a"), (2, "/a", "b"), (1, "/b3", "a"),
                            (1, "/b10", None), (2, "/b10", "b")}
    dead = [json.loads(line) for line in committed(tmp_path / "dead").elements()]
    assert [(d["source"], d["record"]) for d in dead] == [
        ("users", "a tombstone whose key is not a user_id: x")]


@pytest.mark.parametrize("backend", ["rocksdb", "memory"])
def test_a_reloaded_files_table_replaces_the_table(spark: Any, tmp_path: Path,
                                                   backend: str) -> None:
    """`reload: true`: three runs of one job, one epoch each, each resuming from the last's
    checkpoint. 1: the table (users 1-3) is loaded with the first views. 2: new views, the
    table unchanged: not read again (the checkpoint has its files' sizes and times). 3: the
    users file replaced (user 1 renamed with an older `updated`, user 3 gone): read whole
    again, it replaces the table, so user 3 has no row."""
    users = tmp_path / "users" / "a.jsonl"
    write_jsonl(users, [{"user_id": i, "name": f"u{i}", "updated": at(0)} for i in (1, 2, 3)])

    def run(n: int) -> int:
        """Run with views `n` (three); the users read."""
        write_jsonl(tmp_path / "views" / f"{n}.jsonl",
                    [{"user_id": i, "page": f"/{n}", "ts": at(n)} for i in (1, 2, 3)])
        result = run_files(spark, tmp_path, "table: true", backend=backend, max_epochs=1,
                           users_extra="\n    reload: true\n    watermark: {idle_timeout: 1ms}")
        assert result.status == "stopped", result.reason
        return int(result.records_in) - 3

    assert run(1) == 3
    assert run(2) == 0
    write_jsonl(users, [{"user_id": 1, "name": "v1", "updated": at(-10)},
                        {"user_id": 2, "name": "u2", "updated": at(0)}])
    assert run(3) == 2
    rows = {(r["user_id"], r["page"], r["name"]) for r in (
        json.loads(line) for line in committed(tmp_path / "out").elements())}
    assert rows == {*((i, f"/{n}", f"u{i}") for i in (1, 2, 3) for n in (1, 2)),
                    (1, "/3", "v1"), (2, "/3", "u2"), (3, "/3", None)}
