"""The PostgreSQL sink against a real server (tests/postgres_server.py) and real Spark:
exactly-once commits with the marker, upserts by key, at-least-once writes, and every mistake
in its settings as one clear message."""

from __future__ import annotations

import math
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from streamer.cli.main import app
from streamer.connectors.base import ConnectorContext
from streamer.connectors.exceptions import ConnectorError
from streamer.connectors.postgres.postgres_sink import PostgresSink
from streamer.pipeline.exceptions import PipelineError
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions


def table_name() -> str:
    return f"t_{uuid.uuid4().hex[:10]}"


def sink_of(spark: Any, postgres: Any, table: str, tmp_path: Path, *, exactly_once: bool = True,
            job: str = "t", open_it: bool = True, **options: Any) -> PostgresSink:
    doc = {"name": job, "sources": [{"id": "g", "type": "datagen", "limit": 1,
                                     "fields": {"x": "offset"}}],
           "sinks": [{"id": "out", "type": "postgres", "input": "g", "dsn": postgres.dsn,
                      "table": table, **options}]}
    spec = load_pipeline_text(yaml.safe_dump(doc, sort_keys=False), env={})
    ctx = ConnectorContext(spark, job, storage_url=str(tmp_path / "storage"),
                           exactly_once=exactly_once)
    sink = PostgresSink(spec.sinks[0], ctx)
    if open_it:
        sink.open()
    return sink


def frame(spark: Any, start: int, n: int) -> Any:
    return spark.sql(f"SELECT concat('u', id % 3) AS user, id AS n, "
                     f"timestamp_millis(1767225600000 + id * 500) AS ts "
                     f"FROM range({start}, {start + n})")


def ns(postgres: Any, table: str) -> list[int]:
    return [r[0] for r in postgres.query(f'SELECT n FROM "{table}" ORDER BY n')]


# -------------------------------------------------------------------------- settings
BAD = """\
name: p
sources:
  - id: src
    type: datagen
    fields: {user: "concat('u', offset)"}
sinks:
  - id: a
    type: postgres
    input: src
    dsn: host=127.0.0.1
    table: 9lives
    mode: upsert
  - id: b
    type: postgres
    input: src
    dsn: host=127.0.0.1
    table: public.t
    key: [user]
    create_tables: true
  - id: c
    type: postgres
    input: src
    table: t
    mode: merge
    password_env: my password
"""


def test_setting_mistakes_are_reported_at_their_lines() -> None:
    with pytest.raises(PipelineError) as info:
        load_pipeline_text(BAD, file="p.yaml", env={})
    assert [str(p) for p in info.value.problems] == [
        "p.yaml:11:12: 'table' '9lives' must be a table name, optionally schema-qualified, "
        "e.g. 'clicks' or 'analytics.clicks'",
        "p.yaml:12:5: sink 'a' has mode: upsert but no key; add key: [columns that identify "
        "a row]",
        "p.yaml:18:5: sink 'b' has a key, which only mode: upsert uses; add mode: upsert, or "
        "remove key",
        "p.yaml:19:5: unknown key 'create_tables' in sink 'b'; did you mean 'create_table'?",
        "p.yaml:20:5: sink 'c' is missing required key 'dsn'",
        "p.yaml:24:11: 'mode' must be one of append, upsert; got 'merge'",
        "p.yaml:25:19: 'password_env' 'my password' must be an environment variable's name",
    ]


@pytest.mark.spark
def test_a_key_column_not_in_the_input_is_one_line_at_the_key(spark: object,
                                                               tmp_path: Path) -> None:
    """Validation contacts no server: the input's columns are checked against the key."""
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent("""\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {user: "concat('u', offset)", gap: "make_interval(0, 0, 0, 1)"}
        operators:
          - id: sel
            input: src
            select: {user: user}
        sinks:
          - id: out
            type: postgres
            input: sel
            dsn: host=127.0.0.1 port=9
            table: t
            mode: upsert
            key: [user, usr]
          - id: raw
            type: postgres
            input: src
            dsn: host=127.0.0.1 port=9
            table: r
        """))
    result = CliRunner().invoke(app, ["validate", str(path)])
    output = " ".join(result.output.split())
    assert result.exit_code == 1, output
    assert (f"{path}:17:17: sink 'out' has key column 'usr', but its input has no such column "
            "(it has user); use one of them") in output
    assert (f"{path}:19:11: sink 'raw' cannot write column gap (interval) to PostgreSQL; "
            "cast it") in output
    assert "Traceback" not in result.output


@pytest.mark.spark
def test_an_unreachable_server_is_a_clear_error(spark: Any, tmp_path: Path) -> None:
    class Nowhere:
        dsn = "host=127.0.0.1 port=9 user=streamer dbname=postgres connect_timeout=5"

    with pytest.raises(ConnectorError, match=r"sink 'out' cannot connect to PostgreSQL at "
                       r"127\.0\.0\.1:9/postgres: .*check dsn"):
        sink_of(spark, Nowhere(), "t", tmp_path)


@pytest.mark.postgres
@pytest.mark.spark
def test_table_mistakes_found_at_start_are_clear_errors(spark: Any, postgres: Any,
                                                        tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    missing = table_name()
    with pytest.raises(ConnectorError, match=rf"table public\.{missing} does not exist in "
                       r"127\.0\.0\.1:\d+/postgres; create it, or set create_table: true"):
        sink_of(spark, postgres, missing, tmp_path, create_table=False)
    plain = table_name()
    postgres.query(f'CREATE TABLE "{plain}" ("user" text, n bigint)')
    with pytest.raises(ConnectorError, match=r"upserts by key \(user\), but table "
                       rf"public\.{plain} has no unique index or primary key"):
        sink_of(spark, postgres, plain, tmp_path, mode="upsert", key=["user"])
    sink = sink_of(spark, postgres, plain, tmp_path)
    with pytest.raises(ConnectorError, match=rf"table public\.{plain} has no column 'ts', "
                       "which the sink's input has; add it"):
        sink.write(1, frame(spark, 0, 3))
    sink.close()
    monkeypatch.delenv("STREAMER_TEST_PG_PASSWORD", raising=False)
    with pytest.raises(ConnectorError, match=r"password_env: STREAMER_TEST_PG_PASSWORD, but "
                       r"\$STREAMER_TEST_PG_PASSWORD is not set"):
        sink_of(spark, postgres, plain, tmp_path, password_env="STREAMER_TEST_PG_PASSWORD")


# -------------------------------------------------------------------------- exactly once
@pytest.mark.postgres
@pytest.mark.spark
def test_exactly_once_rows_appear_at_commit_once_even_when_committed_again(
        spark: Any, postgres: Any, tmp_path: Path) -> None:
    table = table_name()
    sink = sink_of(spark, postgres, table, tmp_path)
    first = sink.write(1, frame(spark, 0, 50))
    second = sink.write(2, frame(spark, 50, 30))
    assert ns(postgres, table) == []  # staged, not in the table (which now exists, empty)
    sink.commit(1, first)
    assert ns(postgres, table) == list(range(50))
    sink.commit(1, first)  # again: a no-op
    sink.close()
    # A new process (a new sink object) commits the checkpoint's handles again after a crash.
    again = sink_of(spark, postgres, table, tmp_path)
    again.commit(1, first)
    again.commit(2, second)
    again.commit(2, second)
    assert ns(postgres, table) == list(range(80))
    row = postgres.query(f'SELECT "user", n, ts::text FROM "{table}" WHERE n = 1')
    assert row == [("u1", 1, "2026-01-01 00:00:00.5+00")]
    assert postgres.query("SELECT job, sink, lineage, epoch FROM streamer_sink_commits "
                          "WHERE job = 't'") == [("t", "out", first["lineage"], 2)]
    assert list((tmp_path / "storage" / "t" / "sinks" / "out").iterdir()) == []
    again.close()


@pytest.mark.postgres
@pytest.mark.spark
def test_a_new_lineage_commits_epochs_the_old_one_already_had(
        spark: Any, postgres: Any, tmp_path: Path) -> None:
    table = table_name()
    sink = sink_of(spark, postgres, table, tmp_path, job="lineage")
    for epoch in (1, 2, 3):
        sink.commit(epoch, sink.write(epoch, frame(spark, epoch * 10, 10)))
    sink.recover(0)  # e.g. restored from a savepoint: epoch numbers start over
    sink.commit(2, sink.write(2, frame(spark, 100, 5)))
    assert len(ns(postgres, table)) == 35
    sink.close()


@pytest.mark.postgres
@pytest.mark.spark
def test_a_failed_commit_leaves_neither_rows_nor_marker(spark: Any, postgres: Any,
                                                       tmp_path: Path) -> None:
    """Rows and marker go in one transaction: a row the table refuses undoes the marker."""
    table = table_name()
    sink = sink_of(spark, postgres, table, tmp_path, job="atomic")
    handle = sink.write(1, frame(spark, 0, 20))
    postgres.query(f'ALTER TABLE "{table}" ADD CONSTRAINT small CHECK (n < 15)')
    with pytest.raises(ConnectorError, match=rf"sink 'out' cannot commit epoch 1 to table "
                       rf"public\.{table} at .*violates check constraint"):
        sink.commit(1, handle)
    assert ns(postgres, table) == []
    assert postgres.query("SELECT epoch FROM streamer_sink_commits WHERE job = 'atomic'") == []
    postgres.query(f'ALTER TABLE "{table}" DROP CONSTRAINT small')
    sink.commit(1, handle)  # the staged file is still there: the commit can be done again
    assert ns(postgres, table) == list(range(20))
    sink.close()


@pytest.mark.postgres
@pytest.mark.spark
def test_types_round_trip(spark: Any, postgres: Any, tmp_path: Path) -> None:
    table = table_name()
    sink = sink_of(spark, postgres, table, tmp_path, exactly_once=False)
    df = spark.sql("""
        SELECT * FROM VALUES
          (1, 'a', 1.5D, true, DATE'2026-01-02', TIMESTAMP_NTZ'2026-01-02 03:04:05.5',
           CAST(1.25 AS DECIMAL(10,2)), X'00FF', array(1, 2), named_struct('k', 'v'),
           map('m', 1)),
          (2, '', CAST('NaN' AS DOUBLE), false, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
          (3, NULL, CAST('Infinity' AS DOUBLE), NULL, NULL, NULL, NULL, X'', array(), NULL,
           NULL),
          (4, 'x,"y"\n', CAST('-Infinity' AS DOUBLE), NULL, NULL, NULL, NULL, NULL, NULL,
           NULL, NULL)
        AS t(id, s, d, b, day, ntz, dec, bin, arr, st, mp)""")
    handle = sink.write(1, df)
    assert handle["records"] == 4
    got = postgres.query(f'SELECT * FROM "{table}" ORDER BY id')
    import datetime as dt
    from decimal import Decimal

    assert got[0] == (1, "a", 1.5, True, dt.date(2026, 1, 2),
                      dt.datetime(2026, 1, 2, 3, 4, 5, 500000), Decimal("1.25"), b"\x00\xff",
                      [1, 2], {"k": "v"}, {"m": 1})
    assert got[1][:2] == (2, "") and math.isnan(got[1][2])  # '' stays '', not null
    assert got[2][:3] == (3, None, math.inf) and got[2][7:9] == (b"", [])
    assert got[3][1:3] == ('x,"y"\n', -math.inf)
    types = dict(postgres.query("SELECT column_name, data_type FROM information_schema.columns "
                                f"WHERE table_name = '{table}'"))
    assert types == {"id": "integer", "s": "text", "d": "double precision", "b": "boolean",
                     "day": "date", "ntz": "timestamp without time zone", "dec": "numeric",
                     "bin": "bytea", "arr": "jsonb", "st": "jsonb", "mp": "jsonb"}
    sink.close()


@pytest.mark.postgres
@pytest.mark.spark
def test_at_least_once_writes_at_write_and_appends_a_replay_again(
        spark: Any, postgres: Any, tmp_path: Path) -> None:
    table = table_name()
    sink = sink_of(spark, postgres, table, tmp_path, exactly_once=False)
    handle = sink.write(1, frame(spark, 0, 40).repartition(3))
    assert handle["records"] == 40 and handle["file"] is None
    assert len(ns(postgres, table)) == 40
    sink.commit(1, handle)  # nothing left to do
    sink.write(1, frame(spark, 0, 40))  # a replay after a restart: at least once
    assert len(ns(postgres, table)) == 80
    sink.close()


# -------------------------------------------------------------------------- upserts
@pytest.mark.postgres
@pytest.mark.spark
def test_upsert_keeps_one_row_per_key_with_the_last_value(spark: Any, postgres: Any,
                                                          tmp_path: Path) -> None:
    table = table_name()
    sink = sink_of(spark, postgres, table, tmp_path, mode="upsert", key="user",
                   job="upsert")
    first = sink.write(1, frame(spark, 0, 9))  # u0: 0, 3, 6 -> the last one, 6, stays
    sink.commit(1, first)
    assert postgres.query(f'SELECT "user", n FROM "{table}" ORDER BY 1') == [
        ("u0", 6), ("u1", 7), ("u2", 8)]
    second = sink.write(2, spark.sql("SELECT 'u1' AS user, 100L AS n, NULL AS ts UNION ALL "
                                     "SELECT NULL, 200L, NULL"))
    sink.commit(2, second)
    sink.commit(1, first)  # an old epoch again: the marker keeps it from undoing epoch 2
    assert postgres.query(f'SELECT "user", n FROM "{table}" ORDER BY 1') == [
        ("u0", 6), ("u1", 100), ("u2", 8), (None, 200)]  # a null key is a key
    sink.close()


ROLLING = """\
name: {job}
storage: {root}/storage
job: {{parallelism: 2, checkpoint: {{interval: 1ms}}}}
sources:
  - id: clicks
    type: datagen
    splits: 2
    limit: 300
    max_records_per_epoch: 200
    fields:
      user: "concat('u', cast(offset % 7 as string))"
      amount: "cast(offset % 10 as double)"
      ts: "timestamp_millis(1767225600000 + offset * 100)"
    event_time: ts
operators:
  - id: totals
    input: clicks
    key_by: [user]
    aggregate: {{n: count(), spent: sum(amount)}}
  - id: per_10s
    input: clicks
    key_by: [user]
    window: {{tumbling: 10s, emit: updates}}
    aggregate: {{n: count()}}
sinks:
  - id: totals_out
    type: postgres
    input: totals
    dsn: {dsn}
    table: {totals}
    mode: upsert
    key: user
  - id: windows_out
    type: postgres
    input: per_10s
    dsn: {dsn}
    table: {windows}
    mode: upsert
    key: [user, window_start]
"""


@pytest.mark.postgres
@pytest.mark.spark
def test_rolling_aggregate_and_window_updates_upserted_through_a_job(
        spark: Any, postgres: Any, tmp_path: Path) -> None:
    totals, windows = table_name(), table_name()
    spec = load_pipeline_text(ROLLING.format(job="rolling", root=tmp_path, dsn=postgres.dsn,
                                             totals=totals, windows=windows), env={})
    result = JobRunner(spec, RunOptions(ui=False, checkpoints=True), spark=spark).run()
    # Every epoch ends a checkpoint, but the first only if 1 ms passed since the run began
    # (the interval counts from there; a warm process may plan its first epoch sooner).
    assert result.status == "finished" and result.epochs == 3
    assert len(result.checkpoints) >= result.epochs - 1
    got = postgres.query(f'SELECT "user", n, spent FROM "{totals}" ORDER BY 1')
    # 600 rows over 2 splits; offset o of either split goes to u(o % 7)
    want = [(f"u{u}", 2 * len(range(u, 300, 7)), 2 * float(sum(o % 10 for o in range(u, 300, 7))))
            for u in range(7)]
    assert got == want
    per_window = postgres.query(f'SELECT count(*), sum(n), count(DISTINCT (window_start, '
                                f'"user")) FROM "{windows}"')
    assert per_window == [(7 * 3, 600, 7 * 3)]  # 30 s of event time: 3 windows per user


@pytest.mark.postgres
@pytest.mark.spark
def test_a_user_without_create_writes_into_tables_made_for_it(spark: Any, postgres: Any,
                                                              tmp_path: Path) -> None:
    """The privileges the docs list are enough: SELECT, INSERT on the table and SELECT, INSERT,
    UPDATE on the marker table, no CREATE on the schema (PostgreSQL 15's default for public)."""
    table, role = table_name(), f"writer_{uuid.uuid4().hex[:6]}"
    postgres.query(f"CREATE ROLE {role} LOGIN")
    postgres.query(f'CREATE TABLE "{table}" ("user" text, n bigint, ts timestamptz)')
    postgres.query("CREATE TABLE IF NOT EXISTS streamer_sink_commits (job text NOT NULL, sink "
                   "text NOT NULL, lineage text NOT NULL, epoch bigint NOT NULL, committed_at "
                   "timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job, sink))")
    postgres.query(f'GRANT SELECT, INSERT ON "{table}" TO {role}')
    postgres.query(f"GRANT SELECT, INSERT, UPDATE ON streamer_sink_commits TO {role}")

    class AsRole:
        dsn = postgres.dsn.replace("user=streamer", f"user={role}")

    sink = sink_of(spark, AsRole(), table, tmp_path, job="grants")
    sink.commit(1, sink.write(1, frame(spark, 0, 5)))
    assert ns(postgres, table) == list(range(5))
    sink.close()
