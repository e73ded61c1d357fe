"""`type: console` sink: each committed epoch's rows as a rich table.

Rows are collected at `write` (one Spark action) and printed only at `commit`, so what the
console shows is exactly what was committed. They are kept in memory between the two; after a
crash between write and commit there is nothing left to print, which is fine for a console.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import ConnectorContext
from streamer.connectors.formats import json_value
from streamer.connectors.table_sink import TableSink

if TYPE_CHECKING:
    import pyarrow as pa
    from rich.text import Text

    from streamer.pipeline.spec import SinkSpec


@dataclass(frozen=True)
class _Pending:
    """The rows of an epoch between write and commit: the first `max_rows` and the total."""

    columns: list[str]
    rows: list[dict[str, Any]]
    total: int


def _cell(value: Any) -> Text:
    """A value as table text; nested values as compact JSON, nulls dimmed."""
    from rich.text import Text

    if value is None:
        return Text("null", style="dim")
    value = json_value(value)
    if isinstance(value, dict | list):
        return Text(json.dumps(value, ensure_ascii=False, default=str))
    return Text(str(value))


class ConsoleSink(TableSink):
    """Prints at most `max_rows` rows per committed epoch, with a count of the rest."""

    def __init__(self, spec: SinkSpec, ctx: ConnectorContext) -> None:
        super().__init__(spec, ctx)
        self.max_rows: int = int(spec.option("max_rows"))
        self._pending: dict[int, _Pending] = {}

    def write_table(self, epoch: int, table: pa.Table) -> dict[str, int]:
        """Keep the first `max_rows` rows of `table_of`'s table for the commit."""
        rows = table.slice(0, self.max_rows).to_pylist(maps_as_pydicts="lossy")
        self._pending[epoch] = _Pending(list(table.column_names), rows, table.num_rows)
        return {"rows": table.num_rows}

    def commit(self, epoch: int, handle: Any) -> None:
        """Print the epoch's table; a second commit of the same epoch prints nothing."""
        pending = self._pending.pop(epoch, None)
        if pending is None or pending.total == 0:
            return
        from rich.console import Console
        from rich.table import Table

        hidden = pending.total - len(pending.rows)
        title = f"{self.spec.id} · epoch {epoch}"
        caption = f"… and {hidden} more rows" if hidden else None
        table = Table(title=title, caption=caption, title_justify="left",
                      caption_justify="left", min_width=max(len(title), len(caption or "")))
        for name in pending.columns:
            table.add_column(name, overflow="fold")
        for row in pending.rows:
            table.add_row(*[_cell(row[name]) for name in pending.columns])
        console = self.ctx.console or Console()
        console.print(table)

    def abort(self, epoch: int, handle: Any) -> None:
        """Forget the epoch's rows."""
        self._pending.pop(epoch, None)
