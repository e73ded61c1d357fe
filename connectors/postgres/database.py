"""PostgreSQL for the `type: postgres` sink (`postgres_sink.py`): the sink's settings, the
connection, Spark-to-PostgreSQL column types, the target table (created, or checked), the
commit marker table, and loading an Arrow table with COPY. psycopg 3 is imported here only,
inside functions, so pipelines without a PostgreSQL sink never load it.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamer.connectors.exceptions import ConnectorError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import DataType, StructType

    from streamer.pipeline.spec import SinkSpec

#: The marker table, in the target table's schema: one row per (job, sink), the last epoch
#: committed and its lineage, moved in the transaction that writes the epoch's rows.
MARKER_TABLE = "streamer_sink_commits"
#: Rows formatted as CSV per COPY write (the Arrow table goes batch by batch).
_COPY_BATCH_ROWS = 65_536
#: Spark type names (`DataType.typeName()`) -> PostgreSQL column types. Nested types are
#: written as JSON text (`jsonb`); decimals keep their precision and scale.
_TYPES = {
    "string": "text", "char": "text", "varchar": "text", "void": "text",
    "long": "bigint", "integer": "integer", "short": "smallint", "byte": "smallint",
    "double": "double precision", "float": "real", "boolean": "boolean", "date": "date",
    "timestamp": "timestamptz", "timestamp_ntz": "timestamp", "binary": "bytea",
    "array": "jsonb", "map": "jsonb", "struct": "jsonb",
}


def pg_type(dt: DataType) -> str | None:
    """The PostgreSQL type of a Spark column type; None when the sink cannot write it."""
    name = dt.typeName()
    if name == "decimal":
        return f"numeric({dt.precision},{dt.scale})"  # type: ignore[attr-defined]
    return _TYPES.get(name)


def unwritable(schema: StructType) -> list[str]:
    """`column (type)` for each column of `schema` that has no PostgreSQL type here."""
    return [f"{f.name} ({f.dataType.simpleString()})" for f in schema.fields
            if pg_type(f.dataType) is None]


@dataclass(frozen=True)
class Settings:
    """A `type: postgres` sink's keys, as the pipeline file gives them (validated there)."""

    sink_id: str
    dsn: str
    password_env: str | None
    schema: str | None
    table: str
    mode: str
    key: tuple[str, ...]
    create_table: bool

    @classmethod
    def of(cls, spec: SinkSpec) -> Settings:
        """The settings of `spec`; `table` may be `schema.table`."""
        schema, _, table = str(spec.option("table")).rpartition(".")
        key = spec.option("key") or ()
        return cls(sink_id=spec.id, dsn=str(spec.option("dsn")),
                   password_env=spec.option("password_env"), schema=schema or None,
                   table=table, mode=str(spec.option("mode")),
                   key=(key,) if isinstance(key, str) else tuple(key),
                   create_table=bool(spec.option("create_table")))

    @property
    def where(self) -> str:
        """host:port/dbname of the dsn (no password), for messages."""
        from psycopg.conninfo import conninfo_to_dict

        try:
            parts = conninfo_to_dict(self.dsn)
        except Exception:
            return "(an unparseable dsn)"
        host = parts.get("host") or os.environ.get("PGHOST") or "localhost"
        port = parts.get("port") or os.environ.get("PGPORT") or "5432"
        db = parts.get("dbname") or os.environ.get("PGDATABASE") or "(default database)"
        return f"{host}:{port}/{db}"


def connect(s: Settings) -> Any:
    """A psycopg connection in autocommit mode (every transaction is an explicit
    `conn.transaction()` block, so none stays open between epochs), or a ConnectorError."""
    import psycopg

    extra: dict[str, Any] = {"connect_timeout": 30, "application_name": "streamer"}
    if s.password_env:
        password = os.environ.get(s.password_env)
        if password is None:
            msg = (f"sink {s.sink_id!r} has password_env: {s.password_env}, but "
                   f"${s.password_env} is not set; export it before running the job")
            raise ConnectorError(msg)
        extra["password"] = password
    try:
        return psycopg.connect(s.dsn, autocommit=True, **extra)
    except psycopg.ProgrammingError as exc:  # a malformed dsn
        msg = f"sink {s.sink_id!r} has a dsn libpq cannot parse: {exc}; see the libpq docs"
        raise ConnectorError(msg) from exc
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())
        msg = (f"sink {s.sink_id!r} cannot connect to PostgreSQL at {s.where}: {reason}; check "
               "dsn (and password_env or the PG* variables) and that the server is running")
        raise ConnectorError(msg) from exc


class Tables:
    """The target table and the marker table of one sink, on one connection."""

    def __init__(self, s: Settings, conn: Any) -> None:
        from psycopg import sql

        self.s = s
        self.conn = conn
        with conn.cursor() as cur:
            cur.execute("SELECT current_schema()")
            found = cur.fetchone()
        self.schema = s.schema or (found[0] if found and found[0] else "public")
        self.target = sql.Identifier(self.schema, s.table)
        self.marker = sql.Identifier(self.schema, MARKER_TABLE)
        self.name = f"{self.schema}.{s.table}"

    def columns(self, cur: Any) -> dict[str, str] | None:
        """The target table's columns and types, or None when it does not exist."""
        cur.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                    "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON "
                    "n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s AND "
                    "a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                    (self.schema, self.s.table))
        rows = cur.fetchall()
        if rows:
            return {str(name): str(kind) for name, kind in rows}
        cur.execute("SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relname = %s", (self.schema, self.s.table))
        return {} if cur.fetchone() else None

    def has_unique_key(self, cur: Any) -> bool:
        """Whether a unique index (or primary key) covers exactly the key columns, as
        `ON CONFLICT (key)` needs."""
        cur.execute("SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i "
                    "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                    "WHERE i.indrelid = %s::regclass AND i.indisunique AND i.indpred IS NULL "
                    "GROUP BY i.indexrelid", (self.target.as_string(cur),))
        return sorted(self.s.key) in [sorted(r[0]) for r in cur.fetchall()]

    def lock(self, cur: Any, what: str) -> None:
        """A transaction-scoped advisory lock on `what`: committers of one job and sink (or
        creators of one table) take turns, and a dead run's open transaction ends first."""
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (what,))

    def create_marker(self) -> None:
        """The marker table, if it is not there yet (its own transaction; a user without
        CREATE on the schema can use one created for it)."""
        from psycopg import sql

        with self.conn.transaction(), self.conn.cursor() as cur:
            self.lock(cur, f"streamer-create:{self.schema}.{MARKER_TABLE}")
            cur.execute("SELECT to_regclass(%s)", (self.marker.as_string(cur),))
            found = cur.fetchone()
            if found and found[0] is not None:
                return
            cur.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (job text NOT NULL, sink text NOT NULL, "
                "lineage text NOT NULL, epoch bigint NOT NULL, committed_at timestamptz NOT "
                "NULL DEFAULT now(), PRIMARY KEY (job, sink))").format(self.marker))

    def check_open(self) -> None:
        """At start: the table exists (or may be created) and, in upsert mode, has a unique
        index on the key."""
        s = self.s
        with self.conn.transaction(), self.conn.cursor() as cur:
            found = self.columns(cur)
            if found is None and not s.create_table:
                msg = (f"sink {s.sink_id!r}: table {self.name} does not exist in {s.where}; "
                       "create it, or set create_table: true")
                raise ConnectorError(msg)
            if found is not None and s.mode == "upsert" and not self.has_unique_key(cur):
                msg = (f"sink {s.sink_id!r} upserts by key ({', '.join(s.key)}), but table "
                       f"{self.name} has no unique index or primary key on exactly those "
                       "columns; add one (ALTER TABLE ... ADD PRIMARY KEY (...)) or change key")
                raise ConnectorError(msg)

    def ensure(self, columns: list[tuple[str, str]]) -> None:
        """Create the table from the input's columns when it is missing (`create_table`);
        check that an existing one has every input column."""
        from psycopg import sql

        s = self.s
        with self.conn.transaction(), self.conn.cursor() as cur:
            self.lock(cur, f"streamer-create:{self.name}")
            found = self.columns(cur)
            if found is None:
                if not s.create_table:
                    msg = (f"sink {s.sink_id!r}: table {self.name} does not exist; create "
                           "it, or set create_table: true")
                    raise ConnectorError(msg)
                defs = [sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t))
                        for n, t in columns]
                if s.mode == "upsert":
                    # NULLS NOT DISTINCT (PostgreSQL 15+): a null key is a key, as in streamer.
                    nulls = sql.SQL(" NULLS NOT DISTINCT" if self.conn.info.server_version
                                    >= 150000 else "")
                    defs.append(sql.SQL("UNIQUE{} ({})").format(
                        nulls, sql.SQL(", ").join(map(sql.Identifier, s.key))))
                cur.execute(sql.SQL("CREATE TABLE {} ({})").format(
                    self.target, sql.SQL(", ").join(defs)))
                return
            missing = [n for n, _ in columns if n not in found]
            if missing:
                msg = (f"sink {s.sink_id!r}: table {self.name} has no column "
                       f"{', '.join(map(repr, missing))}, which the sink's input has; add "
                       f"{'it' if len(missing) == 1 else 'them'} (ALTER TABLE ... ADD COLUMN) "
                       "or select only the table's columns before the sink")
                raise ConnectorError(msg)

    # ------------------------------------------------------------------------ marker
    def marker_of(self, cur: Any, job: str) -> tuple[int, str]:
        """(last committed epoch, its lineage) of this job and sink; (-1, '') if none."""
        from psycopg import sql

        cur.execute(sql.SQL("SELECT epoch, lineage FROM {} WHERE job = %s AND sink = %s")
                    .format(self.marker), (job, self.s.sink_id))
        row = cur.fetchone()
        return (int(row[0]), str(row[1])) if row else (-1, "")

    def move_marker(self, cur: Any, job: str, epoch: int, lineage: str) -> None:
        """Set the marker of this job and sink to (epoch, lineage)."""
        from psycopg import sql

        cur.execute(sql.SQL(
            "INSERT INTO {} (job, sink, lineage, epoch) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (job, sink) DO UPDATE SET lineage = EXCLUDED.lineage, "
            "epoch = EXCLUDED.epoch, committed_at = now()").format(self.marker),
            (job, self.s.sink_id, lineage, epoch))

    # ------------------------------------------------------------------------ rows
    def load(self, cur: Any, table: pa.Table) -> None:
        """Write `table`'s rows in the current transaction: append = COPY into the table;
        upsert = COPY into a temporary table, then one INSERT ... ON CONFLICT (key) DO UPDATE
        from it, keeping the last row of each key."""
        from psycopg import sql

        cur.execute("SET LOCAL TimeZone = 'UTC'")  # timestamps come as UTC wall times
        cols = sql.SQL(", ").join(map(sql.Identifier, table.column_names))
        if self.s.mode != "upsert":
            _copy(cur, sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(self.target,
                                                                              cols), table)
            return
        stage = sql.Identifier(f"streamer_stage_{self.s.sink_id}")
        cur.execute(sql.SQL("CREATE TEMPORARY TABLE {} ON COMMIT DROP AS SELECT {} FROM {} "
                            "WITH NO DATA").format(stage, cols, self.target))
        cur.execute(sql.SQL("ALTER TABLE {} ADD COLUMN streamer_seq bigint GENERATED ALWAYS "
                            "AS IDENTITY").format(stage))
        _copy(cur, sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(stage, cols), table)
        keys = sql.SQL(", ").join(map(sql.Identifier, self.s.key))
        others = [c for c in table.column_names if c not in self.s.key]
        action = (sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
            sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
            for c in others)) if others else sql.SQL("DO NOTHING"))
        cur.execute(sql.SQL("INSERT INTO {} ({}) SELECT DISTINCT ON ({}) {} FROM {} ORDER BY "
                            "{}, streamer_seq DESC ON CONFLICT ({}) {}").format(
            self.target, cols, keys, cols, stage, keys, keys, action))


def _copy(cur: Any, statement: Any, table: pa.Table) -> None:
    """COPY `table` through `statement` as CSV (formatted by Arrow, batch by batch)."""
    with cur.copy(statement) as copy:
        for chunk in csv_chunks(table):
            copy.write(chunk)


def csv_chunks(table: pa.Table) -> Iterator[bytes]:
    """`table` as CSV without a header, in pieces: nulls unquoted and empty, strings quoted,
    timestamps ISO-8601, which COPY ... (FORMAT csv) reads into the columns' types. Timestamps
    with a time zone are written as their UTC wall time, without the zone (Arrow formats
    those 15-20x faster), for a transaction whose `TimeZone` is UTC (`Tables.load`)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    for i, f in enumerate(table.schema):
        if pa.types.is_timestamp(f.type) and f.type.tz is not None:
            table = table.set_column(i, f.name, table.column(i).cast(pa.timestamp(f.type.unit)))
    options = pacsv.WriteOptions(include_header=False)
    for batch in table.to_batches(max_chunksize=_COPY_BATCH_ROWS):
        out = io.BytesIO()
        pacsv.write_csv(batch, out, options)
        yield out.getvalue()
