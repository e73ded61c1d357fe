"""Rolling aggregates, the keyed kind (`RollingKind`, see `operators.contract`): `aggregate:`
per key without a window. Every epoch emits each key's new value: an update stream
(`columns.CHANGE`), with the value a key had taken back first when a keyed operator reads it
(`KeyedConfig.changelog`, Flink's update-before).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamer.columns import CHANGE, INSERT, KEY_GROUP, RETRACT, UPDATE, WINDOW_START
from streamer.operators.contract import COLUMNAR, COMBINES, LOCAL_EPOCHS, KeyedKind, Logic, Planning
from streamer.operators.keyed_config import KeyedConfig
from streamer.operators.keyed_rows import (
    NS_ROLLING,
    Emitter,
    Input,
    accumulators_of,
    encode_keys,
    final_columns,
    lift_columns,
    merge_accumulators,
)
from streamer.operators.windows import aggregate_fields, combine

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructField, StructType

    from streamer.pipeline.spec import OperatorSpec


class RollingKind(KeyedKind):
    """A rolling aggregate (`aggregate:` without `window:`)."""

    name = "aggregate"
    capabilities = frozenset({COMBINES, COLUMNAR, LOCAL_EPOCHS})

    def output_fields(self, spark: Any, op: OperatorSpec, input_schema: StructType
                      ) -> list[StructField]:
        """The keys, the aggregates and `__op` (what each row changes)."""
        from pyspark.sql.types import StringType, StructField

        return [*(input_schema[k] for k in op.key_by), *aggregate_fields(spark, op, input_schema),
                StructField(CHANGE, StringType())]

    def prepare(self, plan: Planning, df: DataFrame, group: list[Any], epoch: int,
                watermark: int, prerouted: bool) -> tuple[DataFrame, DataFrame | None, Any]:
        """The epoch's partials per key (nothing is late: no window closes)."""
        from pyspark.sql import functions as F

        del epoch, watermark
        rows = combine(plan, df, group, prerouted)
        return rows.withColumn(WINDOW_START, F.lit(0).cast("bigint")), None, None

    def logic(self, cfg: KeyedConfig) -> Logic:
        """Merge the epoch's partials into each key's accumulators, emit the new values."""
        return rolling


def rolling(cfg: KeyedConfig, backend: Any, rows: Input, out: Emitter) -> None:
    """One epoch of a rolling aggregate for one subtask (no timers: nothing fires)."""
    accs = accumulators_of(cfg)
    if not len(rows):
        return
    keys = rows.keys(cfg.keys)
    cells = [(kg, key, NS_ROLLING)
             for kg, key in zip(rows.column(KEY_GROUP), encode_keys(keys), strict=True)]
    stored = backend.get_many("acc", cells)
    merged_all = [merge_accumulators(accs, old, new)
                  for old, new in zip(stored, lift_columns(accs, rows), strict=True)]
    if cfg.changelog:  # what each key had, taken back first (Flink's update-before)
        had = [i for i, old in enumerate(stored) if old is not None]
        out.columns([keys[i] for i in had], final_columns(accs, [stored[i] for i in had]),
                    changes=[RETRACT] * len(had))
    out.columns(keys, final_columns(accs, merged_all),
                changes=[INSERT if old is None else UPDATE for old in stored])
    backend.put_many("acc", [(*cell, merged)
                             for cell, merged in zip(cells, merged_all, strict=True)])
