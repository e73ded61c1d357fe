"""`type: files`: jsonl, csv or parquet files under an fsspec URL, read in name order.

The source has one logical split, "files", whose offset is the sorted list of files already
read: `{"files": [...]}`. Each epoch takes the next new files in name order (at most
`max_files_per_epoch`). Without `watch` the source is bounded by the files present when it
looks; with `watch: true` files that appear later are read by later epochs.

With `reload: true` (a table join's table) the offset is `{"load": n, "files": {name:
"size:mtime"}}` instead: when any file changed, appeared or went away since load n, the next
epoch reads every file present as load n + 1, which replaces the table (`operators.join`).

Local files are read by Spark in place. Files on other file systems (`memory://`, object
stores) are copied to a local temporary directory first, since Spark in local mode has no
Hadoop connector for them; this is meant for tests and small inputs.

A dead letter's `split` is the file and its `offset` the line (1-based, as editors count; a
header counts): Spark 4.3 gives a text or CSV line no position, so the extra pass over a file
is made only for files with dead letters (`connectors.dead_letters`). A parquet record's
offset is its row index in the file.
"""

from __future__ import annotations

import glob as globlib
import hashlib
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import (
    DEAD_LETTER_DDL,
    ConnectorContext,
    Offsets,
    Source,
    SourceRead,
    SourceSlice,
)
from streamer.connectors.exceptions import ConnectorError, DecodeError
from streamer.connectors.files.parquet_footers import parquet_footer_schema
from streamer.connectors.files.s3a import is_s3, spark_url
from streamer.connectors.formats import CORRUPT_COLUMN, column, decode_json_lines, guard_or_split

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

    from streamer.pipeline.spec import SourceSpec

#: At most this many files are read to infer a schema the pipeline does not declare.
INFER_MAX_FILES = 10
SPLIT = "files"
_SPLIT_COLUMN = "__streamer_file"
#: A parquet record's row index in its file (`SourceRead.position`).
_ROW_COLUMN = "__streamer_row"
#: A text record's file block and line (`SourceRead.position`, `SourceRead.raw_record`).
_BLOCK_COLUMN, _RAW_COLUMN = "__streamer_block", "__streamer_line"


def spark_path(local_path: str, *, for_read: bool = True) -> str:
    """A local path as a Spark `file://` URL (an `s3a://` URL as is).

    Hadoop glob characters are escaped when Spark will read the path (read paths are globs;
    write paths are taken literally).
    """
    scheme = "" if "://" in local_path else "file://"  # an s3a:// URL stays one
    if not for_read:
        return scheme + local_path
    return scheme + re.sub(r"([\\{}\[\]*?])", r"\\\1", local_path)


def _hadoop_quoted(url: str) -> str:
    """`url` as Hadoop's `Path.toUri()` (java.net.URI) gives it: ASCII characters a URI path
    may not hold percent-encoded (a space as %20), other characters as they are."""
    return re.sub(r"[^A-Za-z0-9\-_.!~*'(),;:$&+=/@\u0080-\U0010ffff]",
                  lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), url)


def is_local(fs: AbstractFileSystem) -> bool:
    """Whether `fs` is the local file system, which Spark can read and write directly."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "file" in protocols or "local" in protocols


def parse_schema(spec: SourceSpec) -> StructType | None:
    """The declared `schema:` as a StructType, or None when the pipeline declares none."""
    if spec.schema is None:
        return None
    from pyspark.sql.types import DataType, StructField, StructType

    from streamer.spark_errors import spark_error_message

    fields = []
    for name, type_name in spec.schema:
        try:
            data_type = DataType.fromDDL(type_name)
        except Exception as exc:
            msg = (f"column {name!r} of source {spec.id!r} has type {type_name!r}, which Spark "
                   f"cannot parse ({spark_error_message(exc)}); use a Spark SQL type name "
                   "such as string, bigint, double, timestamp or decimal(10,2)")
            raise ConnectorError(msg) from exc
        if isinstance(data_type, StructType) and not type_name.strip().lower().startswith(
                "struct"):
            msg = (f"column {name!r} of source {spec.id!r} has type {type_name!r}, which is "
                   "not a single type; use a Spark SQL type name such as string, bigint, "
                   "double, timestamp or decimal(10,2)")
            raise ConnectorError(msg)
        fields.append(StructField(name, data_type, nullable=True))
    return StructType(fields)


def _arrow_compatible(found: DataType, wanted: DataType) -> bool:
    """Whether Spark reads a parquet column of type `found` as `wanted` (nullability aside)."""
    from pyspark.sql import types as T

    integral = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
    if isinstance(wanted, T.TimestampType | T.TimestampNTZType):
        # Spark's INT96 timestamps look zone-less to pyarrow; Spark reads either kind as either.
        return isinstance(found, T.TimestampType | T.TimestampNTZType)
    if isinstance(wanted, integral) and isinstance(found, integral):
        return integral.index(type(found)) <= integral.index(type(wanted))
    if isinstance(wanted, T.DoubleType):
        return isinstance(found, T.FloatType | T.DoubleType | T.IntegerType |
                          T.ShortType | T.ByteType)
    if isinstance(wanted, T.DecimalType):
        if isinstance(found, integral):
            return True
        return (isinstance(found, T.DecimalType) and found.scale <= wanted.scale
                and found.precision - found.scale <= wanted.precision - wanted.scale)
    if isinstance(wanted, T.ArrayType) and isinstance(found, T.ArrayType):
        return _arrow_compatible(found.elementType, wanted.elementType)
    if isinstance(wanted, T.MapType) and isinstance(found, T.MapType):
        return (_arrow_compatible(found.keyType, wanted.keyType)
                and _arrow_compatible(found.valueType, wanted.valueType))
    if isinstance(wanted, T.StructType) and isinstance(found, T.StructType):
        by_name = {f.name.lower(): f.dataType for f in found.fields}
        return all(f.name.lower() in by_name and _arrow_compatible(by_name[f.name.lower()],
                                                                   f.dataType)
                   for f in wanted.fields)
    return type(found) is type(wanted)


def _event_times_plain(path: str, ts_column: str) -> bool:
    """Whether the local parquet file's `ts_column` is a zoned timestamp whose statistics
    say it has no null in any row group (one footer read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    field = next(f for f in meta.schema.to_arrow_schema() if f.name.lower() == ts_column.lower())
    if not (pa.types.is_timestamp(field.type) and field.type.tz):
        return False
    return _no_nulls(path, (field.name,), meta)


def _no_nulls(path: str, columns: tuple[str, ...], meta: Any = None) -> bool:
    """Whether the statistics of the local parquet file say that `columns` (names matched
    without case) have no null in any row group (one footer read)."""
    import pyarrow.parquet as pq

    if meta is None:
        meta = pq.ParquetFile(path).metadata
    wanted = {c.lower() for c in columns}
    seen = set()
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        for j in range(group.num_columns):
            chunk = group.column(j)
            if chunk.path_in_schema.lower() in wanted:
                seen.add(chunk.path_in_schema.lower())
                stats = chunk.statistics
                if stats is None or not stats.has_null_count or stats.null_count:
                    return False
    return seen == wanted or meta.num_row_groups == 0


class FilesSource(Source):
    """New files under `path`, oldest name first; bounded unless `watch: true`."""

    def __init__(self, spec: SourceSpec, ctx: ConnectorContext) -> None:
        super().__init__(spec, ctx)
        from fsspec.core import url_to_fs

        self.url: str = spec.option("path")
        self.format: str = spec.option("format")
        self.watch: bool = bool(spec.option("watch"))
        #: `reload: true`: a table's files, read whole again when any changes (`_Reload`).
        self.reload: bool = bool(spec.option("reload"))
        max_files = spec.option("max_files_per_epoch")
        self.max_files: int | None = None if max_files is None else int(max_files)
        self.header: bool = bool(spec.option("header"))
        self.delimiter: str = spec.option("delimiter")
        self.fs, self.root = url_to_fs(self.url)
        self.local = is_local(self.fs)
        #: On S3, Spark reads the files itself through S3A (no local copies).
        self.s3a = is_s3(self.url)
        self._schema: StructType | None = None
        self._copies: str | None = None  # local copies of non-local files, made on demand
        #: File name -> why it cannot be read: a damaged page a failed epoch found
        #: (`mark_unreadable`); from then on the file is a dead letter.
        self._unreadable: dict[str, str] = {}

    # ------------------------------------------------------------------------- listing
    @property
    def task_reads(self) -> str | None:
        """Local JSON lines ("files"), CSV or parquet files, unless the files are reloaded
        as a table (`Source.task_reads`)."""
        if self.format in ("jsonl", "csv", "parquet") and self.local \
                and not self.spec.option("reload"):
            return {"jsonl": "files"}.get(self.format, self.format)
        return None

    @property
    def bounded(self) -> bool:
        """Bounded unless `watch: true` or `reload: true`."""
        return not (self.watch or self.reload)

    def _name(self, path: str) -> str:
        """How a file is named in offsets and dead letters: a local path or a full URL."""
        return path if self.local else self.fs.unstrip_protocol(path)

    def list_files(self) -> list[str]:
        """Every file the source covers now, sorted by name.

        Names starting with '_' or '.' (Spark's _SUCCESS, checksums, staging directories) are
        skipped, in a directory and in glob matches alike.
        """
        root = self.root
        self.fs.invalidate_cache()  # remote file systems cache listings; watch needs fresh ones
        if globlib.has_magic(root):
            found = self.fs.glob(root, detail=True)
            paths = [p for p, info in found.items() if info.get("type") == "file"]
        elif self.fs.isdir(root):
            paths = self.fs.find(root, maxdepth=1, withdirs=False)
        elif self.fs.isfile(root):
            paths = [root]
        else:
            paths = []
        visible = [p for p in paths if not PurePosixPath(p).name.startswith(("_", "."))]
        return sorted(self._name(p) for p in visible)

    def initial_offsets(self) -> Offsets:
        """No file read yet (`reload`: no load yet)."""
        return {SPLIT: {"load": 0, "files": {}}} if self.reload else {SPLIT: []}

    def _new_files(self, offsets: Mapping[str, Any]) -> list[str]:
        if self.reload:  # the files that changed since the last load, or went away
            loaded = _loaded(offsets)["files"]
            now = self.signatures()
            return sorted(n for n in {*loaded, *now} if loaded.get(n) != now.get(n))
        done = set(offsets.get(SPLIT, []))
        return [p for p in self.list_files() if p not in done]

    def signatures(self) -> dict[str, str]:
        """`reload`: each file present now, with its size and modification time."""
        out = {}
        for name in self.list_files():
            info = self.fs.info(name if self.local else self.fs._strip_protocol(name))
            modified = next((info[k] for k in ("mtime", "LastModified", "last_modified",
                                                "created") if info.get(k) is not None), "")
            out[name] = f"{info.get('size')}:{modified}"
        return out

    def plan(self, offsets: Mapping[str, Any], now_ms: int) -> SourceSlice | None:
        """The next new files in name order, at most `max_files_per_epoch`; None if none.
        `reload`: when a file changed, appeared or went away since the last load, every
        file present (the whole table, whatever `max_files_per_epoch`), as the next load:
        the offsets record each file's size and modification time, and the load's number."""
        if self.reload:
            if not self._new_files(offsets):
                return None
            now, load = self.signatures(), int(_loaded(offsets)["load"]) + 1
            return SourceSlice(source_id=self.spec.id, start=dict(offsets),
                               end={SPLIT: {"load": load, "files": now}},
                               payload={"files": sorted(now), "load": load})
        new = self._new_files(offsets)
        if self.max_files is not None:
            new = new[:self.max_files]
        if not new:
            return None
        done = list(offsets.get(SPLIT, []))
        return SourceSlice(source_id=self.spec.id, start={SPLIT: done},
                           end={SPLIT: sorted({*done, *new})}, payload={"files": new})

    def exhausted(self, offsets: Mapping[str, Any]) -> bool:
        """True for a bounded source once every file present has been read."""
        return self.bounded and not self._new_files(offsets)

    def lag(self, offsets: Mapping[str, Any], now_ms: int) -> int | None:
        """Files present but not read yet."""
        return len(self._new_files(offsets))

    def lag_unit(self) -> str:
        """`lag` counts files."""
        return "files"

    # --------------------------------------------------------------------- Spark access
    def _spark_paths(self, files: Sequence[str]) -> dict[str, str]:
        """File name -> a path Spark can read: a local path, the `s3a://` URL of a file on S3
        (`connectors/files/s3a.py`), else a copy of the file in a temp dir."""
        if self.local:
            return {f: f for f in files}
        if self.s3a:
            return {f: spark_url(f) for f in files}
        if self._copies is None:
            self._copies = tempfile.mkdtemp(prefix=f"streamer-{self.spec.id}-")
            weakref.finalize(self, shutil.rmtree, self._copies, True)
        out = {}
        for name in files:
            target = self._copy_target(name)
            if not os.path.exists(target):
                partial = target + ".partial"
                self.fs.get(name, partial)
                os.replace(partial, target)
            out[name] = target
        return out

    def _copy_target(self, name: str) -> str:
        """Where the local copy of the non-local file `name` goes."""
        assert self._copies is not None
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        return os.path.join(self._copies, f"{digest}-{PurePosixPath(name).name}")

    def _split_column(self, local: Mapping[str, str]) -> Column:
        """The file name of each row, from Spark's input file URL."""
        from pathlib import Path

        from pyspark.sql import functions as F

        pairs: dict[str, str] = {}
        for name, path in local.items():
            if "://" in path:  # an s3a:// URL, as is and as Hadoop's Path.toUri quotes it
                pairs[path] = pairs[_hadoop_quoted(path)] = name
            else:
                pairs[Path(path).as_uri()] = name
        by_url = F.create_map(*[F.lit(v) for pair in pairs.items() for v in pair])
        url = F.input_file_name()
        return F.coalesce(F.element_at(by_url, url), url)

    # ------------------------------------------------------------------------- schema
    def schema(self) -> StructType:
        """The declared schema, or one inferred once from up to 10 files present now."""
        if self._schema is None:
            if self.format == "text":
                from pyspark.sql.types import StringType, StructField, StructType

                self._schema = StructType([StructField("line", StringType())])
            else:
                self._schema = parse_schema(self.spec) or self._infer()
        return self._schema

    def _infer(self) -> StructType:
        from streamer.spark_errors import spark_error_message

        files = self.list_files()[:INFER_MAX_FILES]
        if not files:
            msg = (f"source {self.spec.id!r} has no schema and no files to infer one from at "
                   f"{self.url!r}; add schema: {{column: type}}")
            raise ConnectorError(msg)
        from pyspark.sql.types import StructType

        if self.format == "parquet" and self.local:
            footers = parquet_footer_schema(files)
            if footers is not None:
                return footers
        paths = [spark_path(p) for p in self._spark_paths(files).values()]
        reader = self.ctx.spark.read
        try:
            if self.format == "jsonl":
                inferred = reader.json(paths).schema
            elif self.format == "csv":
                inferred = (reader.option("header", self.header).option("sep", self.delimiter)
                            .option("inferSchema", True).csv(paths).schema)
            else:
                inferred = reader.parquet(*paths).schema
        except Exception as exc:
            msg = (f"source {self.spec.id!r} cannot infer a schema from the files at "
                   f"{self.url!r}: {spark_error_message(exc)}; add schema: {{column: type}}")
            raise ConnectorError(msg) from exc
        return StructType([f for f in inferred.fields if f.name != "_corrupt_record"])

    # --------------------------------------------------------------------------- read
    def read(self, piece: SourceSlice) -> SourceRead:
        """The records of the slice's files (lazy, one Spark scan per format)."""
        files: list[str] = list(piece.payload["files"])
        if not files:  # a reload that found no file: an empty table
            return SourceRead(records=self.ctx.spark.createDataFrame([], self.schema()))
        if self.format == "parquet":
            return self._read_parquet(files)
        schema = self.schema()
        local = self._spark_paths(files)
        paths = [spark_path(p) for p in local.values()]
        reader = self.ctx.spark.read
        if self.format == "text":  # every line is a record; nothing can fail to decode
            return SourceRead(records=reader.text(paths).withColumnRenamed("value", "line"))
        # With an event time, each record keeps its file, block and text for a dead letter
        # of a null one (`dead_letters.explained` turns the block into the line).
        from pyspark.sql import functions as F

        from streamer.connectors.dead_letters import explained

        position = (_SPLIT_COLUMN, _BLOCK_COLUMN) if self.spec.event_time else None
        split, block = self._split_column(local), F.col("_metadata.file_block_start")
        where = [split.alias(_SPLIT_COLUMN), block.cast("string").alias(_BLOCK_COLUMN)]
        if self.format == "jsonl":
            text = reader.text(paths)
            lines = text.select(F.col("value"), split.alias("split"), block.alias("offset"),
                                *([*where, F.col("value").alias(_RAW_COLUMN)] if position
                                  else []))
            decoded = decode_json_lines(self.ctx.spark, lines, schema, self.spec, extra=(
                _SPLIT_COLUMN, _BLOCK_COLUMN, _RAW_COLUMN) if position else ())
            return explained(decoded, schema, "jsonl", position, _RAW_COLUMN if position
                             else None)
        from pyspark.sql.types import StringType, StructField, StructType

        with_corrupt = StructType([*schema.fields, StructField(CORRUPT_COLUMN, StringType())])
        raw = (reader.schema(with_corrupt).option("header", self.header)
               .option("sep", self.delimiter).option("mode", "PERMISSIVE")
               .option("columnNameOfCorruptRecord", CORRUPT_COLUMN).csv(paths))
        names = schema.fieldNames()
        df = raw.select(*[column(n) for n in names], column(CORRUPT_COLUMN), *where)
        decoded = guard_or_split(df, self.spec, CORRUPT_COLUMN, _SPLIT_COLUMN, _BLOCK_COLUMN,
                                 CORRUPT_COLUMN, raw_file_scan=True,
                                 columns=[*names, *(position or ())])
        return explained(decoded, schema, "csv", position, None, self.delimiter)

    def parquet_problem(self, name: str, schema: StructType) -> str | None:
        """Why the parquet file `name` cannot be read with `schema`, or None if it can."""
        import pyarrow.parquet as pq
        from pyspark.sql.pandas.types import from_arrow_type

        try:
            with self.fs.open(name, "rb") as handle:
                found = pq.read_schema(handle)
        except Exception as exc:
            return f"not a readable parquet file ({type(exc).__name__}: {exc})"
        by_name = {f.name.lower(): f for f in found}
        for field in schema.fields:
            arrow_field = by_name.get(field.name.lower())
            if arrow_field is None:
                return f"no column {field.name!r} (the file has {', '.join(found.names)})"
            try:
                found_type = from_arrow_type(arrow_field.type)
            except Exception:
                found_type = None
            if found_type is None or not _arrow_compatible(found_type, field.dataType):
                return (f"column {field.name!r} is {arrow_field.type} in the file, which "
                        f"cannot be read as {field.dataType.simpleString()}")
        return None

    def mark_unreadable(self, path: str, reason: str) -> bool:
        """Whether `path` (as Spark or a subtask named it: the file, or its local copy) is
        one of this parquet source's files; if so it is a dead letter from now on."""
        if self.format != "parquet":
            return False
        for name in self.list_files():
            if path == name or (self.s3a and path in (spark_url(name),
                                                          _hadoop_quoted(spark_url(name)))) or (
                    not self.local and self._copies is not None
                    and path == self._copy_target(name)):
                self._unreadable[name] = (f"cannot read a data page ({reason}); no row of "
                                          "the file was read")
                return True
        return False

    def _sort_parquet(self, files: list[str]) -> tuple[list[str], list[tuple[Any, ...]]]:
        """(the files readable with the schema, a dead letter for each other file); without
        `on_error`, an unreadable file is an error."""
        schema = self.schema()
        good, dead = [], []
        for name in files:
            problem = self._unreadable.get(name) or self.parquet_problem(name, schema)
            if problem is None:
                good.append(name)
                continue
            if self.spec.on_error is None:
                msg = (f"source {self.spec.id!r} cannot decode the parquet file {name!r}: "
                       f"{problem}; add on_error: <sink id> to send such files to a dead-letter "
                       "sink")
                raise DecodeError(msg)
            dead.append((self.spec.id, name, name, None, problem))
        return good, dead

    def _dead_frame(self, dead: list[tuple[Any, ...]]) -> DataFrame | None:
        if self.spec.on_error is None:
            return None
        return self.ctx.spark.createDataFrame(dead, DEAD_LETTER_DDL)

    def plain_parquet(self, piece: SourceSlice, ts_column: str | None,
                      not_null: tuple[str, ...] = ()
                      ) -> tuple[list[str], DataFrame | None] | None:
        """For a keyed stage that reads the slice itself (`operators/direct.py`): (the local
        parquet files it can read, the dead letters of the others), or None when it cannot,
        so Spark reads the slice: a file's event-time column is a timestamp without a time
        zone (whose instant Spark derives from its session time zone), or its footer does
        not say that the column has no nulls (a record without event time is a bad record,
        which the Spark path sends to `on_error` or reports: `runtime.plan.stages.event_time`), or
        does not say that the `not_null` columns (a join's keys) have none."""
        if self.format != "parquet" or not self.local:
            return None
        good, dead = self._sort_parquet(list(piece.payload["files"]))
        if ts_column is not None and not all(_event_times_plain(name, ts_column)
                                             for name in good):
            return None
        if not_null and not all(_no_nulls(name, not_null) for name in good):
            return None
        return good, self._dead_frame(dead) if dead else None

    def _read_parquet(self, files: list[str]) -> SourceRead:
        """Compatible files through Spark; each other file as one dead letter (or an error)."""
        spark = self.ctx.spark
        schema = self.schema()
        good, dead = self._sort_parquet(files)
        if good:
            paths = [spark_path(p) for p in self._spark_paths(good).values()]
            records: DataFrame = spark.read.schema(schema).parquet(*paths)
            where: list[Column] = []
            if self.spec.event_time:  # a null event time's dead letter: file and row index
                from pyspark.sql import functions as F

                where = [self._split_column(self._spark_paths(good)).alias(_SPLIT_COLUMN),
                         F.col("_metadata.row_index").cast("string").alias(_ROW_COLUMN)]
            records = records.select(*[column(n) for n in schema.fieldNames()], *where)
        else:
            records = spark.createDataFrame([], schema)
            if self.spec.event_time:
                records = records.selectExpr("*", f"CAST(NULL AS STRING) AS {_SPLIT_COLUMN}",
                                             f"CAST(NULL AS STRING) AS {_ROW_COLUMN}")
        return SourceRead(records=records, dead_letters=self._dead_frame(dead),
                          position=((_SPLIT_COLUMN, _ROW_COLUMN) if self.spec.event_time
                                    else None))


def _loaded(offsets: Mapping[str, Any]) -> dict[str, Any]:
    """`reload`: the last load's number and files (a checkpoint of a run without `reload`
    has a list of files: as no load yet, so the table is read whole)."""
    found = offsets.get(SPLIT)
    return found if isinstance(found, dict) else {"load": 0, "files": {}}
