"""`TableSink`: the sink contract (`base.Sink`) for sinks that stage an epoch's rows on the
driver as one Arrow table. Apart from `base.py` because it formats rows with `formats`, which
itself builds on `base`.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import Sink
from streamer.connectors.formats import timestamps_as_iso

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame


class TableSink(Sink):
    """A sink that stages an epoch's rows on the driver, as one Arrow table of
    `table_of(df)` (by default the rows with ISO timestamps): `write` collects it with one
    Spark action; a local epoch (`runtime.plan.local`) hands it over without one."""

    @property
    def takes_tables(self) -> bool:
        """Always."""
        return True

    def table_of(self, df: DataFrame) -> DataFrame:
        """The rows with ISO timestamps (`connectors.formats.timestamps_as_iso`)."""
        return timestamps_as_iso(df)

    def write(self, epoch: int, df: DataFrame) -> Any:
        """Collect `table_of(df)` (one Spark action) and stage it with `write_table`."""
        return self.write_table(epoch, self.table_of(df).toArrow())

    @abstractmethod
    def write_table(self, epoch: int, table: pa.Table) -> Any:
        """Stage the epoch's rows."""
