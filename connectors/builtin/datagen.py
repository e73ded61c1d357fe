"""`type: datagen`: deterministic rows computed from (split, offset) with Spark SQL only.

Splits are named "0".."n-1" and each split's offset is the next row number it will produce,
so re-reading a slice from the same offsets gives the same rows. All splits advance by the
same number of rows per epoch, which lets one `spark.range` (one partition per split) build
a whole slice: `split = id DIV k`, `offset = start[split] + id % k` for `k` rows per split.
A slice of at most `ctx.local_rows` rows is an inline `VALUES` table of the same
(split, offset) pairs instead, so that Spark evaluates the epoch on the driver, without a job.

Admission per epoch, per split, is the smallest of: what is left before `limit`; with
`rows_per_second` (the total rate over all splits), `floor(seconds since the first plan *
rate / splits)` rows past the offsets of that first plan, minus what was read already (so
after a restart the rate continues from the restored offsets, without a burst for the time
the job was down); and `max_records_per_epoch / splits` (at least one row), defaulting to
`DEFAULT_MAX_RECORDS_PER_EPOCH / splits` when the source has neither limit nor rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import ConnectorContext, Offsets, Source, SourceRead, SourceSlice
from streamer.connectors.exceptions import ConnectorError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from streamer.pipeline.spec import SourceSpec

#: Rows per epoch over all splits of an unbounded datagen source without a rate.
DEFAULT_MAX_RECORDS_PER_EPOCH = 1_000_000
#: The column naming each record's split (`SourceRead.split_column`; the runtime drops it).
_SPLIT_COLUMN = "__split"
#: The column naming each record's offset (`SourceRead.position`; the runtime drops it).
_OFFSET_COLUMN = "__offset"


class DatagenSource(Source):
    """Generates rows from Spark SQL expressions of `offset` (bigint) and `split` (int)."""

    def __init__(self, spec: SourceSpec, ctx: ConnectorContext) -> None:
        super().__init__(spec, ctx)
        self.splits: int = int(spec.option("splits"))
        limit = spec.option("limit")
        self.limit: int | None = None if limit is None else int(limit)
        rate = spec.option("rows_per_second")
        self.rate: float | None = None if rate is None else float(rate)
        if self.rate is not None and self.rate <= 0:
            msg = (f"source {spec.id!r} has rows_per_second: {rate}; set a positive rate or "
                   "remove rows_per_second to generate rows as fast as possible")
            raise ConnectorError(msg)
        cap = spec.option("max_records_per_epoch")
        if cap is None and self.limit is None and self.rate is None:
            cap = DEFAULT_MAX_RECORDS_PER_EPOCH
        #: Rows per split per epoch, or None for no cap.
        self.cap_per_split: int | None = None if cap is None else max(1, int(cap) // self.splits)
        self.fields: tuple[tuple[str, str], ...] = tuple((spec.option("fields") or {}).items())
        self._split_names = [str(i) for i in range(self.splits)]
        #: (now_ms, offsets) of the first plan: the origin of rate admission.
        self._rate_origin: tuple[int, dict[str, int]] | None = None
        self._schema: StructType | None = None

    @property
    def local_reads(self) -> bool:
        """Small slices are an inline `VALUES` table."""
        return True

    @property
    def bounded(self) -> bool:
        """Bounded when `limit` is set."""
        return self.limit is not None

    def initial_offsets(self) -> Offsets:
        """Every split starts at offset 0."""
        return dict.fromkeys(self._split_names, 0)

    def _current(self, offsets: Mapping[str, Any]) -> list[int]:
        return [int(offsets.get(name, 0)) for name in self._split_names]

    def _admitted(self, now_ms: int) -> list[int] | None:
        """Per split, the offset up to which the rate admits rows by `now_ms` (None = no rate)."""
        if self.rate is None or self._rate_origin is None:
            return None
        start_ms, origin = self._rate_origin
        per_split = math.floor(max(0, now_ms - start_ms) * self.rate / 1000 / self.splits)
        admitted = [origin.get(name, 0) + per_split for name in self._split_names]
        if self.limit is not None:
            admitted = [min(a, self.limit) for a in admitted]
        return admitted

    def plan(self, offsets: Mapping[str, Any], now_ms: int) -> SourceSlice | None:
        """The next rows of every split within limit, rate and per-epoch cap; None if none."""
        current = self._current(offsets)
        if self.rate is not None and self._rate_origin is None:
            self._rate_origin = (now_ms, dict(zip(self._split_names, current, strict=True)))
        admitted = self._admitted(now_ms)
        counts = []
        for i, off in enumerate(current):
            room = math.inf
            if self.limit is not None:
                room = self.limit - off
            if admitted is not None:
                room = min(room, admitted[i] - off)
            if self.cap_per_split is not None:
                room = min(room, self.cap_per_split)
            counts.append(int(max(0, room)))
        if not any(counts):
            return None
        end = {name: off + n for name, off, n in zip(self._split_names, current, counts,
                                                     strict=True)}
        return SourceSlice(
            source_id=self.spec.id,
            start=dict(zip(self._split_names, current, strict=True)),
            end=end,
            payload={"start": current, "counts": counts,
                     "generated_at": self._generated_at(now_ms)},
            expected_records=sum(counts),
        )

    def _base_sql(self, start: Sequence[int], counts: Sequence[int],
                  generated_at: str) -> str:
        """SQL of the slice's `offset`, `split` and `generated_at` columns: one range, one
        partition per split (a single `spark.sql` call: building the same plan through the
        DataFrame API costs dozens of round trips to the JVM every epoch)."""
        k = max(counts) if counts else 0
        rows = f"range(0, {k * self.splits}, 1, {max(1, self.splits)})"
        k = max(k, 1)  # keeps the expressions valid over an empty range
        where = ""
        if len(set(counts)) > 1:  # only when splits were restored at different offsets
            where = f" WHERE pos < {_per_split(counts)}"
        base = str(int(start[0]) if start else 0) if len(set(start)) <= 1 else _per_split(start)
        inner = f"SELECT CAST(id DIV {k} AS INT) AS split, id % {k} AS pos FROM {rows}"
        offset = f"CAST({base} + pos AS BIGINT)"
        return (f"SELECT {offset} AS offset, split, {generated_at.format(offset=offset)} "
                f"AS generated_at FROM ({inner}){where}")

    def _local_sql(self, start: Sequence[int], counts: Sequence[int],
                   generated_at: str) -> str:
        """`_base_sql`'s rows as an inline table (a local relation, which Spark evaluates on
        the driver without a job: `runtime.plan.local`); for small slices only, since the
        table's text grows with its rows."""
        rows = ", ".join(f"({split}, {int(off)}L)" for split, (first, n) in
                         enumerate(zip(start, counts, strict=True))
                         for off in range(first, first + n))
        offset = "offset"
        return (f"SELECT offset, split, {generated_at.format(offset=offset)} AS generated_at "
                f"FROM VALUES {rows} AS t(split, offset)")

    def _generated_at(self, now_ms: int) -> str:
        """SQL of a row's `generated_at`: with a rate, the moment the rate admitted the row
        (so it is the row's creation time, like Spark's rate source `timestamp`); without
        one, the time the epoch was planned. `{offset}` stands for the row's offset."""
        if self.rate is None or self._rate_origin is None:
            return f"timestamp_millis({now_ms}L)"
        start_ms, origin = self._rate_origin
        first = [origin.get(name, 0) for name in self._split_names]
        base = str(first[0]) if len(set(first)) <= 1 else _per_split(first)
        step = self.splits * 1000 / self.rate
        return (f"timestamp_millis(CAST({start_ms}L + ceil(({{offset}} - {base} + 1) * "
                f"{step!r}D) AS BIGINT))")

    def schema(self) -> StructType:
        """The types of the field expressions, analyzed over an empty range (no Spark job)."""
        if self._schema is not None:
            return self._schema
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        from streamer.spark_errors import spark_error_message

        empty = self.ctx.spark.sql(self._base_sql([0] * self.splits, [0] * self.splits,
                                                  self._generated_at(0)))
        fields = []
        for name, expr in self.fields:
            try:
                fields.append(empty.select(F.expr(expr).alias(name)).schema.fields[0])
            except Exception as exc:
                msg = (f"field {name!r} of source {self.spec.id!r} is not a valid expression "
                       f"{expr!r}: {spark_error_message(exc)}; fix the expression (it may use "
                       "the columns offset, split and generated_at and Spark SQL functions)")
                raise ConnectorError(msg) from exc
        self._schema = StructType(fields)
        return self._schema

    def read(self, piece: SourceSlice) -> SourceRead:
        """The slice's rows: lazy, deterministic (but for `generated_at`), no Python UDFs."""
        payload = piece.payload
        rows = sum(payload["counts"])
        local = 0 < rows <= self.ctx.local_rows
        base = (self._local_sql if local else self._base_sql)(
            payload["start"], payload["counts"], payload["generated_at"])
        columns = [f"({expr}) AS `{name}`" for name, expr in self.fields]
        split_column = position = None
        if self.spec.event_time:  # per-split watermarks, and where a bad event time was
            columns += [f"CAST(split AS STRING) AS {_SPLIT_COLUMN}",
                        f"CAST(offset AS STRING) AS {_OFFSET_COLUMN}"]
            split_column, position = _SPLIT_COLUMN, (_SPLIT_COLUMN, _OFFSET_COLUMN)
        return SourceRead(records=self.ctx.spark.sql(f"SELECT {', '.join(columns)} FROM ({base})"),
                          split_column=split_column, local=local,
                          local_rows=rows if local else None, position=position)

    def exhausted(self, offsets: Mapping[str, Any]) -> bool:
        """True when `limit` is set and every split has produced `limit` rows."""
        if self.limit is None:
            return False
        return all(off >= self.limit for off in self._current(offsets))

    def lag(self, offsets: Mapping[str, Any], now_ms: int) -> int | None:
        """Rows the rate has admitted but the job has not read yet (None without a rate)."""
        if self.rate is None:
            return None
        admitted = self._admitted(now_ms)
        if admitted is None:
            return 0
        return sum(max(0, a - off)
                   for a, off in zip(admitted, self._current(offsets), strict=True))

    def split_lag(self, offsets: Mapping[str, Any], now_ms: int) -> dict[str, int] | None:
        """`lag` per split (None without a rate)."""
        if self.rate is None:
            return None
        admitted = self._admitted(now_ms) or [0] * self.splits
        return {name: max(0, a - off) for name, a, off in
                zip(self._split_names, admitted, self._current(offsets), strict=True)}


def _per_split(values: Sequence[int]) -> str:
    """SQL picking the value of the row's split from a literal array."""
    return f"element_at(array({', '.join(f'{int(v)}L' for v in values)}), split + 1)"
