"""`type: postgres` sink: rows into a PostgreSQL table, appended or upserted by key, exactly
once when the job checkpoints in `exactly_once` mode.

**exactly_once**: a two-phase commit whose second phase is one database transaction per epoch,
modelled on the Kafka sink (`kafka_sink.py`):
1. `write` collects the epoch's rows (one Spark action, through Arrow) and stages them as one
   Parquet file under the job's storage, `<storage>/<job>/sinks/<sink id>/epoch-<n>.parquet`.
   The handle names the file, the epoch, the sink's *lineage* (a token drawn when the sink is
   built or recovers) and the columns' PostgreSQL types.
2. `commit` (after the checkpoint's `_metadata` is written) opens one transaction, takes an
   advisory lock on (job, sink) (so a dead run's transaction has ended, committed or rolled
   back, before it goes on) and reads the *marker*: the row of (job, sink) in the table
   `streamer_sink_commits` of the target's schema, holding the last committed epoch and its
   lineage. If the marker shows this epoch (same lineage, epoch at or past it), the rows are
   in the table already and only the staged file is removed. Otherwise it loads the rows
   (append: COPY into the table; upsert: COPY into a temporary table, then INSERT ... ON
   CONFLICT (key) DO UPDATE), moves the marker to this epoch, and commits: rows and marker
   become visible together, or not at all.
3. A crash between `_metadata` and the commit is resolved on recovery: the coordinator commits
   the checkpoint's pending handles again, and the marker tells which of them are in already.
   `recover` then removes files staged for epochs that will be written again.

The lineage makes the marker safe when epoch numbers start over (`--fresh`, a savepoint): a new
lineage's epoch 3 is not "already committed" because an older lineage reached epoch 9.

**at_least_once** (or no checkpoints): `write` loads the rows at once, one transaction per
epoch and no marker; a restart replays, which may append rows twice (an upsert is
idempotent).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import ConnectorContext
from streamer.connectors.exceptions import ConnectorError
from streamer.connectors.postgres.database import Settings, Tables, connect, pg_type, unwritable
from streamer.connectors.staged_sink import StagedTableSink

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from streamer.pipeline.spec import SinkSpec


class PostgresSink(StagedTableSink):
    """Writes rows to one PostgreSQL table."""

    destination = "the table"

    def __init__(self, spec: SinkSpec, ctx: ConnectorContext) -> None:
        super().__init__(spec, ctx)
        self.settings = Settings.of(spec)
        self._conn: Any = None
        self._tables: Tables | None = None
        #: The PostgreSQL types of the input's columns (`table_of`), and the column lists
        #: already checked against the table in this run.
        self._columns: list[tuple[str, str]] = []
        self._ensured: set[tuple[tuple[str, str], ...]] = set()

    # ---------------------------------------------------------------------------- setup
    def open(self) -> None:
        """Connect; check the table (or that it may be created); in exactly_once mode, create
        the marker table and prepare the staging directory."""
        tables = self._connected()
        with self._errors("cannot prepare"):
            tables.check_open()
            if self.transactional:
                tables.create_marker()
        self.open_staging()

    def _connected(self) -> Tables:
        """The tables on a live connection (a broken one is replaced)."""
        if self._conn is not None and (self._conn.closed or self._conn.broken):
            self._conn = self._tables = None
        if self._conn is None:
            self._conn = connect(self.settings)
            with self._errors("cannot use"):
                self._tables = Tables(self.settings, self._conn)
        assert self._tables is not None
        return self._tables

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Turn a database error into a ConnectorError naming the sink, what it was doing
        (`what` the table), the table and the server, with the server's message."""
        try:
            yield
        except ConnectorError:
            raise
        except Exception as exc:
            s = self.settings
            name = self._tables.name if self._tables is not None else s.table
            text = " ".join(str(exc).split())
            msg = f"sink {s.sink_id!r} {what} table {name} at {s.where}: {text}"
            raise ConnectorError(msg) from exc

    # ---------------------------------------------------------------------------- write
    def table_of(self, df: DataFrame) -> DataFrame:
        """The rows with nested columns as JSON text and binary ones as bytea hex text; notes
        each column's PostgreSQL type."""
        from pyspark.sql import functions as F

        bad = unwritable(df.schema)
        if bad:
            msg = (f"sink {self.spec.id!r} cannot write column {', '.join(bad)} to PostgreSQL; "
                   "cast it to a supported type before the sink")
            raise ConnectorError(msg)
        self._columns = [(f.name, pg_type(f.dataType) or "text") for f in df.schema.fields]
        out = []
        for f in df.schema.fields:
            col, kind = F.col(f"`{f.name}`"), pg_type(f.dataType)
            if kind == "jsonb":
                col = F.to_json(col)
            elif kind == "bytea":
                col = F.concat(F.lit("\\x"), F.lower(F.hex(col)))
            out.append(col.alias(f.name))
        return df.select(*out)

    def write_table(self, epoch: int, table: pa.Table) -> dict[str, Any]:
        """exactly_once: stage the rows; otherwise load them now, in one transaction."""
        columns = list(self._columns) or [(n, "text") for n in table.column_names]
        self._ensure(columns)
        fields = {"columns": [list(c) for c in columns]}
        if self.transactional:
            return self.stage(epoch, table, **fields)
        if table.num_rows:
            tables = self._connected()
            with (self._errors(f"cannot write epoch {epoch} to"), self._conn.transaction(),
                  self._conn.cursor() as cur):
                tables.load(cur, table)
        return {"epoch": epoch, "lineage": self.lineage, "records": table.num_rows,
                "file": None, **fields}

    def _ensure(self, columns: list[tuple[str, str]]) -> None:
        """The table exists with these columns (created when missing), checked once a run."""
        key = tuple(columns)
        if key in self._ensured:
            return
        tables = self._connected()
        with self._errors("cannot create or check"):
            tables.ensure(columns)
        self._ensured.add(key)

    # --------------------------------------------------------------------------- commit
    def committed(self, epoch: int, lineage: str) -> bool:
        """Whether the table holds the rows of `epoch` written by `lineage`."""
        tables = self._connected()
        with self._conn.transaction(), self._conn.cursor() as cur:
            marked, marked_lineage = tables.marker_of(cur, self.ctx.job_name)
        return marked_lineage == lineage and marked >= epoch

    def commit(self, epoch: int, handle: Any) -> None:
        """Load the staged rows and move the marker to `epoch`, in one transaction; nothing
        to do when the marker shows the epoch committed. Idempotent."""
        if not self.transactional or not handle.get("file"):
            return
        path, lineage = handle["file"], handle["lineage"]
        tables = self._connected()
        self._ensure([(str(n), str(t)) for n, t in handle.get("columns", [])])
        job = self.ctx.job_name
        with (self._errors(f"cannot commit epoch {epoch} to"), self._conn.transaction(),
              self._conn.cursor() as cur):
            # 1. wait for any other committer of this job and sink (a dead run's transaction)
            tables.lock(cur, f"streamer-commit:{job}/{self.spec.id}")
            # 2. the marker: is this epoch of this lineage in already?
            marked, marked_lineage = tables.marker_of(cur, job)
            if not (marked_lineage == lineage and marked >= epoch):
                # 3. the rows and the marker, committed together when the block ends
                tables.load(cur, self.staged_rows(epoch, path))
                tables.move_marker(cur, job, epoch, lineage)
        self.drop_staged(path)

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
        self._conn = self._tables = None
