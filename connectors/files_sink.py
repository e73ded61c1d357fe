"""`type: files` sink: jsonl, csv or parquet files that appear only when their epoch commits.

Two-phase commit per epoch:
1. `write` runs one Spark write into `<path>/_staging/epoch-<epoch>/` and returns the staged
   part files (empty ones left out) with the final name each will get.
2. `commit` renames each staged file to `<path>/part-<epoch:08d>-<n:05d>.<ext>` (n = its index
   among the epoch's staged files in name order), then removes the staging directory. A file
   already renamed is skipped, so committing twice gives the same files.
3. `abort` removes the staging directory.

Readers see only `part-*` files outside `_staging`; a rename on a local file system makes
each file appear whole. Spark writes to other file systems (`memory://`, object stores) go
to a local temporary directory first and are then uploaded to the staging directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import ConnectorContext, Sink
from streamer.connectors.exceptions import ConnectorError
from streamer.connectors.files import is_local, spark_path
from streamer.connectors.formats import timestamps_as_iso

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from streamer.pipeline.spec import SinkSpec

#: Sink format -> (Spark data source, extension of committed files).
FORMATS = {"jsonl": ("json", "jsonl"), "csv": ("csv", "csv"), "parquet": ("parquet", "parquet")}
STAGING = "_staging"


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


class FilesSink(Sink):
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

    def staging_dir(self, epoch: int) -> str:
        """Where the epoch's files wait for the commit."""
        return f"{self.root.rstrip('/')}/{STAGING}/epoch-{epoch:08d}"

    def final_name(self, epoch: int, index: int) -> str:
        """The committed name of the epoch's `index`-th file (deterministic)."""
        return f"part-{epoch:08d}-{index:05d}.{self.extension}"

    def open(self) -> None:
        """Create the output directory."""
        self.fs.makedirs(self.root, exist_ok=True)

    def write(self, epoch: int, df: DataFrame) -> dict[str, Any]:
        """Stage the epoch's rows with one Spark write; the handle lists staged -> final names."""
        if self.format != "parquet":
            df = timestamps_as_iso(df)
        staging = self.staging_dir(epoch)
        if self.fs.exists(staging):
            self.fs.rm(staging, recursive=True)
        scratch = None if self.local else tempfile.mkdtemp(prefix=f"streamer-{self.spec.id}-")
        target = staging if scratch is None else os.path.join(scratch, "out")
        try:
            writer = df.write.mode("overwrite").format(self.spark_format)
            if self.format == "csv":
                writer = writer.option("header", True)
            elif self.format == "jsonl":
                writer = writer.option("ignoreNullFields", False)
            writer.save(spark_path(target, for_read=False))
            staged = []
            for name in sorted(os.listdir(target)):
                path = os.path.join(target, name)
                if not name.startswith("part-") or name.endswith(".crc"):
                    continue
                if _has_rows(path, self.format):
                    staged.append(name)
                else:
                    os.remove(path)
            if scratch is not None and staged:
                self.fs.makedirs(staging, exist_ok=True)
                for name in staged:
                    self.fs.put_file(os.path.join(target, name), f"{staging}/{name}")
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        if not staged and self.fs.exists(staging):
            self.fs.rm(staging, recursive=True)  # an empty epoch leaves nothing behind
        return {"epoch": epoch,
                "files": [[name, self.final_name(epoch, i)] for i, name in enumerate(staged)]}

    def _move(self, source: str, target: str) -> None:
        if self.local:
            os.replace(source, target)  # an atomic rename: readers never see half a file
        else:
            self.fs.mv(source, target)

    def commit(self, epoch: int, handle: Any) -> None:
        """Rename the staged files to their final names, then drop the staging directory.

        Idempotent: a file whose staged copy is gone but whose final name exists was moved
        by an earlier commit of the same epoch.
        """
        staging = self.staging_dir(epoch)
        root = self.root.rstrip("/")
        for staged_name, final_name in handle["files"]:
            source, target = f"{staging}/{staged_name}", f"{root}/{final_name}"
            if self.fs.exists(source):
                self._move(source, target)
            elif not self.fs.exists(target):
                msg = (f"sink {self.spec.id!r} cannot commit epoch {epoch}: the staged file "
                       f"{source!r} is gone and {target!r} does not exist; restore the job "
                       "from an earlier checkpoint so the epoch is written again")
                raise ConnectorError(msg)
        if self.fs.exists(staging):
            self.fs.rm(staging, recursive=True)

    def recover(self, committed_epoch: int) -> None:
        """Remove what a dead run staged: every epoch up to `committed_epoch` is committed, so
        all of `_staging/` is left over (later epochs will be written again)."""
        staging = f"{self.root.rstrip('/')}/{STAGING}"
        if self.fs.exists(staging):
            self.fs.rm(staging, recursive=True)

    def abort(self, epoch: int, handle: Any) -> None:
        """Discard the epoch's staged files."""
        staging = self.staging_dir(epoch)
        if self.fs.exists(staging):
            self.fs.rm(staging, recursive=True)

    def committed_files(self) -> list[str]:
        """The files readers see now: `part-*.<ext>` directly under `path`, in name order."""
        if not self.fs.exists(self.root):
            return []
        names = (PurePosixPath(p).name for p in self.fs.ls(self.root, detail=False))
        return sorted(n for n in names
                      if n.startswith("part-") and n.endswith(f".{self.extension}"))
