"""The keyed operator contract: what one kind of keyed operator declares to the engine.

A kind is one class, in the module of its per-subtask logic, registered by one line in
`operators.kinds`. The engine asks it, and nothing else, about the kind:

- `output_fields`: the columns of its output batches (after `__kind` and `__meta`);
- `prepare`: the epoch's Spark plan before routing: its combinable pre-aggregation (windows,
  rolling aggregates), the first record per key (dedupe), or the records as they are;
- `logic`: its per-subtask logic, as a function of (config, state backend, the epoch's rows,
  the output), which fires the timers due up to `config.fire_up_to` and then takes the rows.
  The end of input is the same call with the timers up to +inf and no rows
  (`operators.keyed.run_task`); snapshots are the state backend's, which holds every byte of
  a kind's state (so checkpoints, savepoints and rescaling treat every kind alike);
- `capabilities`: what the planner may do with it (below); `local_refusal`: why an operator
  of the kind cannot take a local epoch or a direct read, when its settings rule it out.

The spec half of a kind (its YAML keys, validation and what it declares to the operators
after it: `emits_updates`, `output_event_time`, `watermark_hold_ms`) lives in
`pipeline.spec` (the core package, which validation needs without Spark).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructField, StructType

    from streamer.operators.keyed_config import KeyedConfig
    from streamer.pipeline.spec import OperatorSpec

#: Spark combines the epoch's rows per key (and window) before they are routed, so a small
#: epoch may route first and combine after (one shuffle, not two).
COMBINES = "combines"
#: Its logic takes the epoch's rows as one Arrow table (`keyed_rows.Input`); without it, as
#: a list of dicts, one per row.
COLUMNAR = "columnar"
#: It can take a local epoch's rows collected on the driver, and read a parquet source
#: itself (`runtime.plan.stages.keyed_stage.local_plan`, `direct_plan`), unless `local_refusal`
#: says its settings rule that out.
LOCAL_EPOCHS = "local-epochs"
#: Its rows carry every column of its input (dedupe, joins): a direct read casts them all.
WHOLE_RECORDS = "whole-records"
#: It reads every record of the epoch unaggregated (joins, process functions).
EVERY_RECORD = "every-record"

#: (config, state backend, rows, output): fire the timers due, then take the rows.
Logic = Callable[["KeyedConfig", Any, Any, Any], None]


class Planning(ABC):
    """What a kind's `prepare` may ask of the stage that plans it (`runtime.plan.keyed_plan`)."""

    op: OperatorSpec
    domain: str

    @abstractmethod
    def routed(self, df: DataFrame) -> DataFrame:
        """`df` with its route, in the Spark partition of its subtask."""

    @abstractmethod
    def count_late(self, df: DataFrame, is_late: Any, epoch: int) -> tuple[DataFrame, Any]:
        """(the records in time, what counts the late ones, which are dropped)."""

    def split_late(self, df: DataFrame, is_late: Any, epoch: int, keep: bool
                   ) -> tuple[DataFrame, DataFrame | None, Any]:
        """(the records in time, with `keep` the late ones for a `late:` output (else None),
        without it what counts the late ones dropped)."""
        if keep:
            return df.filter(~is_late), df.filter(is_late), None
        in_time, seen = self.count_late(df, is_late, epoch)
        return in_time, None, seen


class KeyedKind(ABC):
    """One kind of keyed operator (see the module docstring)."""

    #: The kind's name, as `OperatorSpec.keyed_kind` gives it and savepoints store it.
    name: ClassVar[str]
    capabilities: ClassVar[frozenset[str]]

    def has(self, capability: str) -> bool:
        """Whether the kind declares `capability`."""
        return capability in self.capabilities

    def local_refusal(self, op: OperatorSpec) -> str | None:
        """Why this operator cannot take local epochs and direct reads despite its kind's
        `LOCAL_EPOCHS` (None: it can)."""
        del op
        return None

    def row_input(self, cfg: KeyedConfig) -> bool:
        """Whether this operator's logic takes its rows as dicts (not `COLUMNAR`)."""
        del cfg
        return not self.has(COLUMNAR)

    @abstractmethod
    def output_fields(self, spark: Any, op: OperatorSpec, input_schema: StructType
                      ) -> list[StructField]:
        """The columns of the output batches after `__kind` and `__meta`."""

    @abstractmethod
    def prepare(self, plan: Planning, df: DataFrame, group: list[Any], epoch: int,
                watermark: int, prerouted: bool) -> tuple[DataFrame, DataFrame | None, Any]:
        """The epoch's rows as the subtasks take them (`df` has the key group, subtask,
        event time in ms and sequence columns; `group` the columns that make a key), the
        late records for a `late:` output (or None), and what counts the late records
        dropped (or None). `prerouted`: route before combining (`COMBINES` kinds)."""

    @abstractmethod
    def logic(self, cfg: KeyedConfig) -> Logic:
        """The per-subtask logic of this operator."""


def records_as_they_are(plan: Planning, df: DataFrame, group: list[Any], epoch: int,
                        watermark: int, prerouted: bool
                        ) -> tuple[DataFrame, DataFrame | None, Any]:
    """A `prepare` for kinds that take every record as it is, with nothing late."""
    del plan, group, epoch, watermark, prerouted
    return df, None, None
