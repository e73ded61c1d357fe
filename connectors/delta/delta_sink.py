"""`type: delta` sink: a Delta Lake table committed from the driver with `deltalake` (delta-rs).

Why delta-rs and not Spark's Delta writer: the Delta (and Iceberg) Spark jars do not run on
this project's Spark 4.3, and delta-rs records the epoch in the same commit as the rows
(a per-app transaction version, Delta's `txn` action), does a true MERGE, and commits a small
epoch in milliseconds. The tables are plain Delta tables (Spark+Delta, Databricks, DuckDB,
polars, Trino read them).

**exactly_once** (the job checkpoints with `mode: exactly_once`): a two-phase commit, as the
Kafka sink's (`kafka_sink.py`), whose second phase is one Delta commit per epoch.
1. `write` collects the epoch's rows on the driver as one Arrow table (`TableSink`; a local
   epoch hands it over without a Spark job) and stages them as one Parquet file under the
   job's storage: `<storage>/<job>/sinks/<sink id>/epoch-<n>.parquet`. The handle names the
   file, the epoch and the sink's *lineage* (a token drawn when the sink opens or recovers).
2. `commit` (after the checkpoint's `_metadata` is written) reads the table's transaction
   version of the app id `streamer.<job>.<sink id>.<lineage>`. At or past the epoch, the
   epoch is already in the table and only the staged file is removed. Otherwise it appends
   the rows (`mode: append`) or MERGEs them by key (`mode: merge`) in one Delta commit that
   also sets the app id's version to the epoch: the rows and the marker are visible together
   or not at all.
3. A crash between `_metadata` and the commit is resolved on recovery: the coordinator commits
   the checkpoint's pending handles again, and the table says which of them it already has.
   `recover` then removes files staged for epochs that will be written again.

The lineage keeps the marker right when epoch numbers start over (`--fresh`, a savepoint): a
new lineage's epoch 3 is not "already committed" because an older lineage reached epoch 9.

**at_least_once** (or no checkpoints): `write` commits the epoch's rows at once; a restart
replays and may append them again (a MERGE writes the same values again).

A crash in the middle of a Delta commit may leave Parquet files in the table's directory that
no commit names: readers never see them, and Delta's `VACUUM` removes them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import ConnectorContext
from streamer.connectors.exceptions import ConnectorError
from streamer.connectors.staged_sink import StagedTableSink

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from streamer.pipeline.spec import SinkSpec

_ROW = "__streamer_row"


def columns_of(value: Any) -> tuple[str, ...]:
    """A `key:` or `partition_by:` value (one column or a list of them) as a tuple."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (str(value),)


def table_uri(path: str) -> str:
    """`path` as delta-rs opens it: a URL as it is, a local path made absolute."""
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def merge_predicate(keys: tuple[str, ...]) -> str:
    """The MERGE condition on `keys`: null-safe equality, so a null key matches itself."""
    return " AND ".join(f't."{k}" IS NOT DISTINCT FROM s."{k}"' for k in keys)


def last_per_key(table: pa.Table, keys: tuple[str, ...]) -> pa.Table:
    """The last row of `table` per distinct key, in the order of those rows: one epoch may
    emit a key twice, and a MERGE takes at most one source row per target row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows < 2:
        return table
    numbered = table.select(list(keys)).append_column(
        _ROW, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    last = numbered.group_by(list(keys), use_threads=False).aggregate([(_ROW, "max")])
    if last.num_rows == table.num_rows:
        return table
    rows = last[f"{_ROW}_max"]
    return table.take(pc.take(rows, pc.sort_indices(rows)))


def utc_timestamps(table: pa.Table) -> pa.Table:
    """Timestamps with a time zone as UTC (Delta `timestamp`); the instants do not change.
    Timestamps without one (Spark's `timestamp_ntz`) stay so (Delta `timestamp_ntz`)."""
    import pyarrow as pa

    fields = list(table.schema)
    if not any(pa.types.is_timestamp(f.type) and f.type.tz for f in fields):
        return table
    target = pa.schema([f.with_type(pa.timestamp("us", tz="UTC"))
                        if pa.types.is_timestamp(f.type) and f.type.tz else f for f in fields])
    return table.cast(target)


class DeltaSink(StagedTableSink):
    """Appends or merges each epoch's rows into one Delta table."""

    destination = "the Delta table"

    def __init__(self, spec: SinkSpec, ctx: ConnectorContext) -> None:
        super().__init__(spec, ctx)
        self.path: str = spec.option("path")
        self.uri = table_uri(self.path)
        self.mode: str = spec.option("mode")
        self.keys = columns_of(spec.option("key"))
        self.partition_by = columns_of(spec.option("partition_by"))
        self.storage_options = {str(k): str(v) for k, v in
                                (spec.option("storage_options") or {}).items()}
        self.app_prefix = f"streamer.{ctx.job_name}.{spec.id}"
        self._table: Any = None

    # ---------------------------------------------------------------------------- setup
    def open(self) -> None:
        """Open the table if it exists (it is created by the first commit); in
        exactly_once mode, prepare the staging directory."""
        self._loaded()
        self.open_staging()

    def _loaded(self) -> Any:
        """The table at its newest version, or None while it does not exist yet."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            if self._table is None:
                self._table = DeltaTable(self.uri, storage_options=self.storage_options or None)
            else:
                self._table.update_incremental()
        except TableNotFoundError:
            self._table = None
        except Exception as exc:
            msg = (f"sink {self.spec.id!r} cannot open the Delta table at {self.path!r}: "
                   f"{exc}; check path and storage_options")
            raise ConnectorError(msg) from exc
        return self._table

    def table_of(self, df: DataFrame) -> DataFrame:
        """The rows as they are: timestamps stay timestamps in the table."""
        return df

    # ---------------------------------------------------------------------------- write
    def write_table(self, epoch: int, table: pa.Table) -> dict[str, Any]:
        """exactly_once: stage the epoch's rows; otherwise commit them now."""
        rows = self._prepared(table)
        if not self.transactional:
            if rows.num_rows:
                self._apply(epoch, rows, None)
            return {"epoch": epoch, "records": rows.num_rows}
        return self.stage(epoch, rows)

    def _prepared(self, table: pa.Table) -> pa.Table:
        """UTC timestamps; in merge mode, the last row per key."""
        rows = utc_timestamps(table)
        if self.mode == "merge":
            missing = [k for k in self.keys if k not in rows.column_names]
            if missing:
                msg = (f"sink {self.spec.id!r} merges by key {list(self.keys)}, but its input "
                       f"has no column {missing[0]!r} (it has {', '.join(rows.column_names)});"
                       " use its columns in key:")
                raise ConnectorError(msg)
            rows = last_per_key(rows, self.keys)
        return rows

    # --------------------------------------------------------------------------- commit
    def app_id(self, lineage: str) -> str:
        """The Delta app id whose transaction version is the last epoch `lineage` committed."""
        return f"{self.app_prefix}.{lineage}"

    def committed(self, epoch: int, lineage: str) -> bool:
        """Whether the table holds the rows of `epoch` written by `lineage`."""
        table = self._loaded()
        if table is None:
            return False
        done = table.transaction_version(self.app_id(lineage))
        return done is not None and done >= epoch

    def commit(self, epoch: int, handle: Any) -> None:
        """Append or merge the staged rows in one Delta commit that also sets this lineage's
        transaction version to `epoch`; nothing to do when the table already has the epoch.
        Idempotent."""
        if not self.transactional or not handle.get("file"):
            return
        path = handle["file"]
        if self.committed(epoch, handle["lineage"]):
            self.drop_staged(path)
            return
        rows = self.staged_rows(epoch, path)
        self._apply(epoch, rows, self.app_id(handle["lineage"]))
        self._fs.rm(path)

    def _apply(self, epoch: int, rows: pa.Table, app_id: str | None) -> None:
        """One Delta commit of `rows` (append, or merge by key), recording `app_id`'s
        transaction version `epoch` in it when given."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        props = (CommitProperties(app_transactions=[Transaction(app_id=app_id, version=epoch)])
                 if app_id is not None else None)
        table = self._loaded()
        try:
            if table is None or self.mode == "append":
                write_deltalake(table if table is not None else self.uri, rows, mode="append",
                                partition_by=list(self.partition_by) or None,
                                storage_options=(self.storage_options or None
                                                 if table is None else None),
                                commit_properties=props)
            else:
                (table.merge(rows, merge_predicate(self.keys), source_alias="s",
                             target_alias="t", commit_properties=props)
                 .when_matched_update_all().when_not_matched_insert_all().execute())
        except Exception as exc:
            raise ConnectorError(self._failure(epoch, rows, exc)) from exc
        self._loaded()

    def _failure(self, epoch: int, rows: pa.Table, exc: Exception) -> str:
        """The message of a failed commit, with the fix where the cause is known."""
        from deltalake.exceptions import SchemaMismatchError

        what = f"sink {self.spec.id!r} cannot commit epoch {epoch} to the Delta table at " \
               f"{self.path!r}: {exc}"
        if isinstance(exc, SchemaMismatchError) or "partitioning does not match" in str(exc):
            table = self._table
            has = (", ".join(f.name for f in table.schema().fields) if table is not None
                   else "?")
            return (f"{what}; the table's columns ({has}) or partitioning do not fit the "
                    f"sink's rows ({', '.join(rows.column_names)}); write to a new path, or "
                    "change the pipeline to match the table")
        return f"{what}; check path and storage_options"

    def close(self) -> None:
        """Drop the table handle."""
        self._table = None
