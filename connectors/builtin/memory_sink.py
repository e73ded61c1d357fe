"""An in-process sink that keeps committed rows as JSON-friendly dicts, for `streamer test`.

Rows are staged at `write` and become visible in `committed` only at `commit`, like any
sink's output. Values are plain JSON data (see `formats.json_value`): timestamps are ISO-8601
UTC strings such as `2026-01-01T00:01:00Z`, so tests compare against what the YAML says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamer.connectors.base import ConnectorContext
from streamer.connectors.exceptions import ConnectorError
from streamer.connectors.formats import json_rows
from streamer.connectors.table_sink import TableSink

if TYPE_CHECKING:
    import pyarrow as pa

    from streamer.pipeline.spec import SinkSpec


class MemorySink(TableSink):
    """Collects every committed row in memory, in commit order."""

    def __init__(self, spec: SinkSpec, ctx: ConnectorContext) -> None:
        super().__init__(spec, ctx)
        #: Every committed row, epoch after epoch.
        self.committed: list[dict[str, Any]] = []
        self._staged: dict[int, list[dict[str, Any]]] = {}
        self._by_epoch: dict[int, list[dict[str, Any]]] = {}

    def write_table(self, epoch: int, table: pa.Table) -> dict[str, int]:
        """Stage `table_of`'s rows as JSON values."""
        rows = json_rows(table)
        self._staged[epoch] = rows
        return {"rows": len(rows)}

    def commit(self, epoch: int, handle: Any) -> None:
        """Make the epoch's staged rows visible; committing an epoch again changes nothing."""
        if epoch in self._by_epoch:
            return
        rows = self._staged.pop(epoch, None)
        if rows is None:
            msg = (f"sink {self.spec.id!r} has no staged rows for epoch {epoch}; a memory sink "
                   "keeps rows only inside one process, so run the job again from its start")
            raise ConnectorError(msg)
        self._by_epoch[epoch] = rows
        self.committed.extend(rows)

    def abort(self, epoch: int, handle: Any) -> None:
        """Drop the epoch's staged rows."""
        self._staged.pop(epoch, None)

    def rows_of(self, epoch: int) -> list[dict[str, Any]]:
        """The rows committed for `epoch` (empty when it committed none or not yet)."""
        return list(self._by_epoch.get(epoch, []))

    @property
    def epochs(self) -> list[int]:
        """The committed epochs, in commit order."""
        return list(self._by_epoch)
