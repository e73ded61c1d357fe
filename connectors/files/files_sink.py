"""`type: files` sink: jsonl, csv or parquet files that appear only when their epoch commits.

Two-phase commit per epoch:
1. `write` runs one Spark write into `<path>/_staging/epoch-<epoch>/` and returns the staged
   part files (empty ones left out) with the final name each will get.
2. `commit` renames each staged file to `<path>/part-<epoch:08d>-<n:05d>.<ext>` (n = its index
   among the epoch's staged files in name order), then removes the staging directory. A file
   already renamed is skipped, so committing twice gives the same files. An object store has
   no rename: there each file is copied server-side to its final name, and then the epoch's
   manifest (`connectors/files/manifests.py`) is published with one PUT; the epoch is committed
   once its manifest exists (docs/object-storage.md says what readers see).
3. `abort` removes the staging directory.

Readers see only `part-*` files outside `_staging`; a rename on a local file system, a PUT
or copy on an object store, makes each file appear whole.

A local parquet or jsonl sink fed by nothing but one keyed operator lets that operator's
Spark tasks write the staging files themselves (`task_target`, `TaskFile`): each subtask writes
its output rows with pyarrow as Spark would (parquet: its schema in the footer, timestamps as
`spark.sql.parquet.outputTimestampType` says; jsonl: `connectors.arrow.arrow_json_writer`, Spark's
bytes), and the rows never cross into the JVM; the commit is the same. Where the JSON encoder
refuses a batch (a double Java 17 may print otherwise, a year outside 1000-9999), that subtask's
remaining rows are kept as a parquet file and Spark's JSON writer renders it when the sink
stages the epoch (`tasks_wrote`), so the bytes are always Spark's. A local epoch
(`runtime.plan.local`: rows Spark evaluated on the driver, without a job) of a parquet sink is
written the same way, from the driver (`write_table`). On S3, Spark writes
the staging directory itself through S3A (`connectors/files/s3a.py`); Spark writes to other file
systems (`memory://`, ...) go to a local temporary directory first and are then uploaded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from streamer.columns import HIDDEN_PREFIX
from streamer.connectors.arrow.arrow_json_writer import JsonLines, jvm_prints_shortest, unsupported
from streamer.connectors.base import ConnectorContext, Sink, WritesTaskFiles
from streamer.connectors.exceptions import ConnectorError
from streamer.connectors.files import manifests
from streamer.connectors.files.files_source import is_local, spark_path
from streamer.connectors.files.s3a import is_s3, spark_url
from streamer.connectors.formats import not_utc, timestamps_as_iso
from streamer.exceptions import ArrowRefused
from streamer.storage import abort_stale_uploads

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from streamer.pipeline.spec import SinkSpec

#: Sink format -> (Spark data source, extension of committed files).
FORMATS = {"jsonl": ("json", "jsonl"), "csv": ("csv", "csv"), "parquet": ("parquet", "parquet")}
STAGING = "_staging"
#: How a jsonl (or Kafka) sink's task file of rows left to Spark ends (`TaskFile`).
SPILL = ".spill.parquet"
#: How a Kafka sink's task file of (key, value) records ends (`TaskTarget.records`).
RECORDS = ".records.parquet"


def _has_rows(local_file: str, fmt: str) -> bool:
    """Whether a part file Spark wrote holds any row.

    Spark writes the first part even for an empty partition: zero bytes of json, a csv
    header, a parquet footer.
    """
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return bool(pq.read_metadata(local_file).num_rows)
    if fmt == "csv":
        with open(local_file, "rb") as handle:
            handle.readline()  # the header
            return bool(handle.read(1))
    return os.path.getsize(local_file) > 0


def _remote_has_rows(fs: Any, path: str, fmt: str) -> bool:
    """`_has_rows` of a file on a remote file system (a footer or a first line read)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        with fs.open(path, "rb") as handle:
            return bool(pq.read_metadata(handle).num_rows)
    if fmt == "csv":
        with fs.open(path, "rb") as handle:
            handle.readline()
            return bool(handle.read(1))
    return bool(fs.size(path))


#: Footer key under which Spark keeps a parquet file's Spark schema (read back as is).
SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"
#: Footer key of the Spark version that wrote a parquet file (it decides date rebasing).
SPARK_VERSION_KEY = "org.apache.spark.version"


@dataclass(frozen=True)
class TaskTarget:
    """Where the tasks of an epoch's keyed stage write the sink's rows themselves: the
    epoch's staging directory; the rows' Spark schema (JSON); the session's
    `spark.sql.parquet.outputTimestampType` (INT96, TIMESTAMP_MICROS or TIMESTAMP_MILLIS)."""

    directory: str
    spark_schema: str
    timestamps: str
    spark_version: str
    #: A jsonl sink's encoder (None: the sink is parquet), or a Kafka sink's (`records`).
    json: JsonLines | None = None
    #: Kafka records: each row becomes (key, value) — the `key` column as text (or null)
    #: and the row as a JSON object — written as `part-<subtask>-0.records.parquet`.
    records: bool = False
    key: str | None = None

    def writer(self, path: str, schema: pa.Schema) -> Any:
        """A `pyarrow.parquet.ParquetWriter` at `path` that writes rows of `schema` as
        Spark's parquet writer would: small decimals as integers, the Spark schema and version
        in the footer (`schema` should be `nullable`: Spark writes every column optional).
        Only text and binary columns are dictionary-encoded: on numbers and times, mostly
        distinct, the dictionary is built and then dropped (100,000 rows of the table-join
        benchmark's output: 25 ms with dictionaries everywhere, 13 ms and 15 % fewer bytes
        this way; Spark reads both alike)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        texts = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_binary(
            f.type) or pa.types.is_large_string(f.type) or pa.types.is_large_binary(f.type)]
        writer = pq.ParquetWriter(
            path, schema, compression="snappy", store_schema=False, use_dictionary=texts,
            store_decimal_as_integer=True,
            use_deprecated_int96_timestamps=self.timestamps == "INT96",
            coerce_timestamps={"TIMESTAMP_MICROS": "us", "TIMESTAMP_MILLIS": "ms"}.get(
                self.timestamps),
            allow_truncated_timestamps=True)
        # (Without the Arrow schema, pyarrow writes no schema metadata: add it to the file.)
        writer.add_key_value_metadata({SPARK_SCHEMA_KEY.decode(): self.spark_schema,
                                       SPARK_VERSION_KEY: self.spark_version})
        return writer


def epoch_staging(staging_root: str, epoch: int) -> str:
    """The staging directory of `epoch` under a sink's `staging_root`."""
    return f"{staging_root}/epoch-{epoch:08d}"


def empty_target(spark: Any, fs: Any, directory: str, schema: StructType, *, json: bool,
                 records: bool = False, key: str | None = None) -> TaskTarget:
    """A `TaskTarget` for rows of `schema` in `directory` (emptied, on file system `fs`), as
    this Spark session writes them: its schema with every column nullable (as Spark's
    writer), its parquet timestamp type and version; with `json`, the JSON encoder of those
    columns for this JVM (a jsonl sink's, or with `records` a Kafka sink's, keyed by `key`)."""
    from pyspark.sql.types import StructField, StructType

    if fs.exists(directory):
        fs.rm(directory, recursive=True)
    fs.makedirs(directory, exist_ok=True)
    optional = StructType([StructField(f.name, f.dataType, True, f.metadata)
                           for f in schema.fields])
    encoder = None
    if json:
        encoder = JsonLines(tuple((f.name, f.dataType.simpleString()) for f in schema.fields),
                            shortest=jvm_prints_shortest(spark))
    conf = spark.conf.get("spark.sql.parquet.outputTimestampType", "INT96")
    return TaskTarget(directory=directory, spark_schema=optional.json(),
                      timestamps=str(conf).upper(), spark_version=spark.version, json=encoder,
                      records=records, key=key)


def kafka_records(batch: pa.RecordBatch, json: JsonLines, key: str | None) -> pa.RecordBatch:
    """`batch`'s rows as a Kafka sink's (key, value) records, as its Spark plan renders them
    (`KafkaSink._records`: the key cast to a string, the row through `to_json`)."""
    import pyarrow as pa

    values = json.values(batch)
    keys = (pa.nulls(batch.num_rows, pa.string()) if key is None
            else batch.column(key).cast(pa.string()))
    return pa.RecordBatch.from_arrays([keys, values], schema=record_schema())


def record_schema() -> pa.Schema:
    """The (key, value) columns of staged Kafka records (both text, either may be null)."""
    import pyarrow as pa

    return pa.schema([("__streamer_key", pa.string()), ("__streamer_value", pa.string())])


def nullable(schema: pa.Schema) -> pa.Schema:
    """`schema` with every column nullable, as Spark writes parquet."""
    import pyarrow as pa

    return pa.schema([f.with_nullable(True) for f in schema], metadata=schema.metadata)


class TaskFile:
    """One subtask's staging file of a `TaskTarget`: `take` writes the output rows
    (`kind_column == out_kind`, hidden `__` columns dropped) of a batch and returns the rest;
    `close` publishes the file with one rename (a retried task replaces it whole) and returns
    the rows written. Parquet: `part-<subtask>.parquet`. Jsonl: `part-<subtask>-0.jsonl`,
    and, from the first batch the encoder refuses (`refused` says why), the rest of the rows
    in `part-<subtask>-1.spill.parquet` for Spark's writer. Kafka records (`records`):
    `part-<subtask>-0.records.parquet`, and the same spill for Spark's `to_json`."""

    def __init__(self, target: TaskTarget, subtask: int, kind_column: str = "",
                 out_kind: str = "") -> None:
        self.target = target
        self.subtask = subtask
        self.kind_column = kind_column
        self.out_kind = out_kind
        self.rows = 0
        self.refused: str | None = None
        self._writer: Any = None
        self._text: Any = None
        self._tmp = os.path.join(target.directory,
                                 f".part-{subtask:05d}-{uuid.uuid4().hex}.tmp")

    def take(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Write `batch`'s output rows; return its other rows."""
        import pyarrow.compute as pc

        is_out = pc.equal(batch.column(self.kind_column), self.out_kind)
        out = batch.filter(is_out)
        if out.num_rows:
            self._write(out.select([n for n in batch.schema.names
                                    if not n.startswith(HIDDEN_PREFIX)]))
            self.rows += out.num_rows
        return batch.filter(pc.invert(is_out))

    def write_rows(self, table: pa.Table) -> None:
        """Write every row of `table` (the sink's columns, in order)."""
        for batch in table.to_batches():
            if batch.num_rows:
                self._write(batch)
                self.rows += batch.num_rows

    def _write(self, out: pa.RecordBatch) -> None:
        import pyarrow as pa

        if self.target.json is not None and self.refused is None:
            try:
                data = (self.target.json.encode(out) if not self.target.records
                        else kafka_records(out, self.target.json, self.target.key))
            except ArrowRefused as exc:
                self.refused = str(exc)
            else:
                if self.target.records:
                    import pyarrow.parquet as pq

                    if self._text is None:
                        self._text = pq.ParquetWriter(f"{self._tmp}{RECORDS}", record_schema(),
                                                      compression="none")
                    self._text.write_batch(data)
                    return
                if self._text is None:
                    self._text = open(f"{self._tmp}.jsonl", "wb")  # noqa: SIM115 (closed in close)
                self._text.write(data)
                return
        if self._writer is None:
            self._writer = self.target.writer(self._tmp, nullable(out.schema))
        self._writer.write_batch(pa.RecordBatch.from_arrays(out.columns,
                                                            schema=nullable(out.schema)))

    def close(self) -> int:
        """Publish the file(s) (those with rows); the number of rows written."""
        part = os.path.join(self.target.directory, f"part-{self.subtask:05d}")
        if self._text is not None:
            self._text.close()
            end = RECORDS if self.target.records else ".jsonl"
            os.replace(f"{self._tmp}{end}", f"{part}-0{end}")
        if self._writer is not None:
            self._writer.close()
            os.replace(self._tmp, f"{part}-1{SPILL}" if self.target.json else f"{part}.parquet")
        return self.rows

    def discard(self) -> None:
        """Drop half-written files (the task failed)."""
        if self._writer is not None:
            self._writer.close()
        if self._text is not None:
            self._text.close()
        for path in (self._tmp, f"{self._tmp}.jsonl", f"{self._tmp}{RECORDS}"):
            if os.path.exists(path):
                os.remove(path)


class FilesSink(Sink, WritesTaskFiles):
    """Writes each epoch's rows as files under `path`, visible once the epoch commits."""

    def __init__(self, spec: SinkSpec, ctx: ConnectorContext) -> None:
        super().__init__(spec, ctx)
        from fsspec.core import url_to_fs

        self.url: str = spec.option("path")
        self.format: str = spec.option("format")
        if self.format not in FORMATS:
            msg = (f"sink {spec.id!r} has format {self.format!r}; use one of "
                   f"{', '.join(FORMATS)}")
            raise ConnectorError(msg)
        self.spark_format, self.extension = FORMATS[self.format]
        self.fs, self.root = url_to_fs(self.url)
        self.local = is_local(self.fs)
        #: On S3, Spark writes each epoch's files into the staging prefix through S3A.
        self.s3a = is_s3(self.url)

    def staging_dir(self, epoch: int) -> str:
        """Where the epoch's files wait for the commit."""
        return epoch_staging(self.staging_root, epoch)

    @property
    def staging_root(self) -> str:
        """Where every epoch's staging directory is (`epoch_staging`)."""
        return f"{self.root.rstrip('/')}/{STAGING}"

    def final_name(self, epoch: int, index: int) -> str:
        """The committed name of the epoch's `index`-th file (deterministic)."""
        return f"part-{epoch:08d}-{index:05d}.{self.extension}"

    def open(self) -> None:
        """Create the output directory."""
        self.fs.makedirs(self.root, exist_ok=True)

    def _spark_writer(self, df: DataFrame) -> Any:
        """Spark's writer of `df` in this sink's format, as every Spark-written file of the
        sink is written (timestamps as ISO text outside parquet, a csv header, jsonl nulls)."""
        if self.format != "parquet":
            df = timestamps_as_iso(df)
        writer = df.write.mode("overwrite").format(self.spark_format)
        if self.format == "csv":
            writer = writer.option("header", True)
        elif self.format == "jsonl":
            writer = writer.option("ignoreNullFields", False)
        return writer

    def _parts_with_rows(self, directory: str) -> list[str]:
        """The part files Spark wrote into local `directory` that hold rows (name order);
        empty ones are removed."""
        found = []
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if not name.startswith("part-") or name.endswith(".crc"):
                continue
            if _has_rows(path, self.format):
                found.append(name)
            else:
                os.remove(path)
        return found

    def write(self, epoch: int, df: DataFrame) -> dict[str, Any]:
        """Stage the epoch's rows with one Spark write; the handle lists staged -> final names."""
        staging = self.staging_dir(epoch)
        if self.fs.exists(staging):
            self.fs.rm(staging, recursive=True)
        writer = self._spark_writer(df)
        if self.s3a:  # Spark writes straight into the staging prefix on S3
            writer.save(spark_url(staging))
            return self._handle(epoch, self._staged_on_s3(staging))
        scratch = None if self.local else tempfile.mkdtemp(prefix=f"streamer-{self.spec.id}-")
        target = staging if scratch is None else os.path.join(scratch, "out")
        try:
            writer.save(spark_path(target, for_read=False))
            staged = self._parts_with_rows(target)
            if scratch is not None and staged:
                self.fs.makedirs(staging, exist_ok=True)
                for name in staged:
                    self.fs.put_file(os.path.join(target, name), f"{staging}/{name}")
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        return self._handle(epoch, staged)

    def _staged_on_s3(self, staging: str) -> list[str]:
        """The part files with rows that Spark wrote under `staging` on S3 (name order); the
        others (empty parts, `_SUCCESS`, what the committer left) are deleted."""
        self.fs.invalidate_cache()
        staged, junk = [], []
        for path in sorted(self.fs.find(staging, withdirs=False)):
            name = path.rsplit("/", 1)[-1]
            if (path.rsplit("/", 1)[0].rstrip("/") == staging.rstrip("/")
                    and name.startswith("part-") and not name.endswith(".crc")
                    and _remote_has_rows(self.fs, path, self.format)):
                staged.append(name)
            else:
                junk.append(path)
        if junk:
            self.fs.rm(junk)
        return staged

    def _handle(self, epoch: int, staged: list[str]) -> dict[str, Any]:
        """The commit handle of the staged files `staged` (names in staging order)."""
        staging = self.staging_dir(epoch)
        if not staged and self.fs.exists(staging):
            self.fs.rm(staging, recursive=True)  # an empty epoch leaves nothing behind
        return {"epoch": epoch,
                "files": [[name, self.final_name(epoch, i)] for i, name in enumerate(staged)]}

    def task_files_refused(self, schema: StructType) -> str | None:
        """Why the keyed tasks cannot write rows of `schema` to this sink themselves, or None:
        they write local parquet, and local jsonl of the types the JSON encoder takes."""
        if self.format not in ("parquet", "jsonl") or not self.local:
            return f"sink {self.spec.id!r} is not a local parquet or jsonl files sink"
        if self.format != "jsonl":
            return None
        why = not_utc(self.ctx.spark)
        if why is not None:
            return why
        why = unsupported([(f.name, f.dataType.simpleString()) for f in schema.fields])
        return None if why is None else f"sink {self.spec.id!r}: {why}"

    def task_target(self, epoch: int, schema: StructType) -> TaskTarget | None:
        """Where the epoch's keyed tasks may write rows of `schema` themselves (an empty
        staging directory), or None when the sink does not take task-written files."""
        if self.task_files_refused(schema) is not None:
            return None
        return empty_target(self.ctx.spark, self.fs, self.staging_dir(epoch), schema,
                            json=self.format == "jsonl")

    @property
    def takes_tables(self) -> bool:
        """Local parquet only, written as the keyed tasks write it (`TaskTarget.writer`)."""
        return self.format == "parquet" and self.local

    def write_table(self, epoch: int, table: pa.Table) -> dict[str, Any]:
        """Stage a local epoch's rows, collected on the driver, as one parquet file."""
        from pyspark.sql.pandas.types import from_arrow_schema

        target = self.task_target(epoch, from_arrow_schema(table.schema))
        assert target is not None  # (takes_tables)
        staged = []
        if table.num_rows:
            name = "part-00000.parquet"
            tmp = os.path.join(target.directory, f".{name}.tmp")
            writer = target.writer(tmp, nullable(table.schema))
            try:
                writer.write_table(table.cast(nullable(table.schema)))
            finally:
                writer.close()
            os.replace(tmp, os.path.join(target.directory, name))
            staged.append(name)
        return self._handle(epoch, staged)

    def tasks_wrote(self, epoch: int, run: Any, beside: DataFrame | None = None
                    ) -> dict[str, Any]:
        """Stage the epoch's task-written files: `run()` runs the Spark job whose tasks write
        them into `task_target(epoch)`, and Spark's writer adds the rows of `beside` (those
        the tasks did not take: `runtime.arrow.arrow_input`) as further files; the handle is
        `write`'s."""
        run()
        staging = self.staging_dir(epoch)
        if beside is not None:
            self._spark_into(staging, beside, "part-s")
        for name in sorted(os.listdir(staging)):
            if name.endswith(SPILL):
                self._spill_to_json(staging, name)
        staged = sorted(n for n in os.listdir(staging)
                        if n.startswith("part-") and n.endswith(f".{self.extension}"))
        return self._handle(epoch, staged)

    def _spill_to_json(self, staging: str, name: str) -> None:
        """Have Spark's JSON writer render a task's refused rows (`SPILL`), as `write` does:
        `part-<subtask>-1-<k>.jsonl`, which sorts after the task's own `-0.jsonl`."""
        spill = os.path.join(staging, name)
        self._spark_into(staging, self.ctx.spark.read.parquet(spark_path(spill)),
                         name[:-len(SPILL)])
        os.remove(spill)

    def _spark_into(self, staging: str, df: DataFrame, stem: str) -> None:
        """Spark's writer writes `df` beside the tasks' files in local directory `staging`:
        its files with rows become `<stem>-<k>.<ext>`."""
        target = os.path.join(staging, f".{stem}.spark")
        self._spark_writer(df).save(spark_path(target, for_read=False))
        for k, part in enumerate(self._parts_with_rows(target)):
            os.replace(os.path.join(target, part),
                       os.path.join(staging, f"{stem}-{k:05d}.{self.extension}"))
        shutil.rmtree(target)

    def _move(self, source: str, target: str) -> None:
        if self.local:
            os.replace(source, target)  # an atomic rename: readers never see half a file
        else:
            # An object store has no rename: a server-side copy (the final object appears
            # whole), and the staged object is deleted with the staging directory at step 3.
            self.fs.copy(source, target)

    def commit(self, epoch: int, handle: Any) -> None:
        """Commit the epoch's staged files, in three steps.

        1. each staged file gets its final name: a rename on a local file system; on an
           object store a server-side copy (each object appears whole, an epoch's files one
           after another);
        2. on an object store, the epoch's manifest `_manifests/epoch-<epoch>.json` (its
           files and their sizes) is published with one PUT: readers that want whole epochs
           trust it, and an epoch is committed once it is there;
        3. the staging directory is dropped.

        Idempotent: a file whose staged copy is gone but whose final name exists was moved
        by an earlier commit of the same epoch; a manifest is rewritten with the same content.
        """
        staging = self.staging_dir(epoch)
        root = self.root.rstrip("/")
        self.fs.invalidate_cache()  # an object store's cached listings may be stale
        for staged_name, final_name in handle["files"]:
            source, target = f"{staging}/{staged_name}", f"{root}/{final_name}"
            if self.fs.exists(source):
                self._move(source, target)
            elif not self.fs.exists(target):
                msg = (f"sink {self.spec.id!r} cannot commit epoch {epoch}: the staged file "
                       f"{source!r} is gone and {target!r} does not exist; restore the job "
                       "from an earlier checkpoint so the epoch is written again")
                raise ConnectorError(msg)
        if not self.local:
            manifests.publish(self.fs, root, epoch, [final for _, final in handle["files"]])
        if self.fs.exists(staging):
            self.fs.rm(staging, recursive=True)
        self._drop_empty_staging()

    def _drop_empty_staging(self) -> None:
        """Remove `_staging/` once nothing is staged, so a committed sink holds only its
        output. Local only: elsewhere directories are prefixes that vanish with their files.
        `rmdir` fails on a directory that is not empty, so a staged epoch is never lost."""
        if self.local:
            with contextlib.suppress(OSError):
                os.rmdir(f"{self.root.rstrip('/')}/{STAGING}")

    def recover(self, committed_epoch: int) -> None:
        """Remove what a dead run staged: every epoch up to `committed_epoch` is committed, so
        all of `_staging/` is left over (later epochs will be written again). On an object
        store also the files and manifests of later epochs (a restore from an earlier
        checkpoint writes them again, maybe as fewer files) and the multipart uploads a
        killed run left unfinished under the sink's path."""
        staging = f"{self.root.rstrip('/')}/{STAGING}"
        self.fs.invalidate_cache()
        if self.fs.exists(staging):
            self.fs.rm(staging, recursive=True)
        if not self.local:
            manifests.drop_after(self.fs, self.root.rstrip("/"), committed_epoch,
                                 self.extension)
            abort_stale_uploads(self.fs, self.root, older_than_s=0.0)

    def abort(self, epoch: int, handle: Any) -> None:
        """Discard the epoch's staged files."""
        staging = self.staging_dir(epoch)
        if self.fs.exists(staging):
            self.fs.rm(staging, recursive=True)
        self._drop_empty_staging()

    def committed_files(self) -> list[str]:
        """The files readers see now: `part-*.<ext>` directly under `path`, in name order
        (on an object store: the files the published manifests name)."""
        if not self.local:
            return manifests.committed(self.fs, self.root.rstrip("/"))
        if not self.fs.exists(self.root):
            return []
        names = (PurePosixPath(p).name for p in self.fs.ls(self.root, detail=False))
        return sorted(n for n in names
                      if n.startswith("part-") and n.endswith(f".{self.extension}"))
