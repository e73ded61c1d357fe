"""`StagedTableSink`: what the exactly-once sinks that commit on the driver share (Kafka,
Delta, PostgreSQL). In exactly_once mode `write` stages an epoch's rows as one parquet file
under the job's storage, `<storage>/<job>/sinks/<sink id>/epoch-<n>.parquet`, and returns a
handle naming the file, the epoch and the sink's *lineage* (a token drawn when the sink opens
or recovers); the checkpoint's commit reads the file back and hands the rows to the sink's
own transaction, which records (lineage, epoch) so that committing it again is a no-op. What
each sink commits into and how it records the epoch is its own (`committed`, `commit`).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import ConnectorContext
from streamer.connectors.exceptions import ConnectorError
from streamer.connectors.table_sink import TableSink

if TYPE_CHECKING:
    import pyarrow as pa

    from streamer.pipeline.spec import SinkSpec


class StagedTableSink(TableSink):
    """A table sink whose exactly_once epochs are staged as parquet files until committed."""

    #: Where the sink's commits go, for messages ("Kafka", "the table").
    destination = "the sink"

    def __init__(self, spec: SinkSpec, ctx: ConnectorContext) -> None:
        super().__init__(spec, ctx)
        self.transactional = ctx.exactly_once
        self.lineage = uuid.uuid4().hex
        self._fs: Any = None
        self._staging = ""

    def open_staging(self) -> None:
        """In exactly_once mode, the staging directory (call from `open`)."""
        if not self.transactional:
            return
        from fsspec.core import url_to_fs

        base = self.ctx.storage_url or "./.streamer"
        self._fs, root = url_to_fs(base)
        self._staging = f"{root.rstrip('/')}/{self.ctx.job_name}/sinks/{self.spec.id}"
        self._fs.makedirs(self._staging, exist_ok=True)

    def stage(self, epoch: int, table: pa.Table, **fields: Any) -> dict[str, Any]:
        """The handle of the epoch's rows, staged (written whole, then renamed) if any."""
        handle: dict[str, Any] = {"epoch": epoch, "lineage": self.lineage,
                                  "records": table.num_rows, "file": None, **fields}
        if table.num_rows:
            import pyarrow.parquet as pq

            path = f"{self._staging}/epoch-{epoch:08d}.parquet"
            with self._fs.open(path + ".partial", "wb") as out:
                pq.write_table(table, out)
            self._fs.mv(path + ".partial", path)
            handle["file"] = path
        return handle

    def staged_rows(self, epoch: int, path: str) -> pa.Table:
        """The staged rows of `epoch`; a clear error when the file is gone uncommitted."""
        if not self._fs.exists(path):
            msg = (f"sink {self.spec.id!r} cannot commit epoch {epoch}: its staged rows "
                   f"{path!r} are gone and {self.destination} does not have them; restore "
                   "the job from an earlier checkpoint so the epoch is written again")
            raise ConnectorError(msg)
        import pyarrow.parquet as pq

        with self._fs.open(path, "rb") as f:
            return pq.read_table(f)

    def drop_staged(self, path: str | None) -> None:
        """Remove a staged file (committed, or discarded)."""
        if path and self._fs is not None and self._fs.exists(path):
            self._fs.rm(path)

    def abort(self, epoch: int, handle: Any) -> None:
        """Discard the epoch's staged rows."""
        self.drop_staged(handle.get("file") if isinstance(handle, dict) else None)

    def recover(self, committed_epoch: int) -> None:
        """Everything up to `committed_epoch` is committed: staged files are left over. Later
        epochs are written again, under a new lineage."""
        self.lineage = uuid.uuid4().hex
        if self.transactional and self._fs.exists(self._staging):
            for path in self._fs.ls(self._staging, detail=False):
                self._fs.rm(path, recursive=True)  # (a task-written epoch is a directory)
