"""`type: kafka` source: topic partitions read by offset range, offsets in checkpoints.

Splits are the topic partitions, named `<topic>:<partition>`; a split's offset is the next
offset to read. Per epoch, `plan` asks the broker for each partition's end (with
`read_committed`, the last stable offset: records of open transactions are never planned) and
plans `[offset, min(end, offset + cap))`; `read` reads exactly those ranges, so a replay of a
slice from a checkpoint reads the same records. There is no consumer group and no rebalancing:
the job owns its offsets, as Flink's Kafka source does.

Two clients read the ranges (`client:`):
- `confluent` (default): confluent-kafka consumers in the Spark tasks (`mapInArrow`), one per
  partition range, `assign()`ed at the range's start and read until its end. Offsets of a
  transactional topic skip control markers and aborted records, so a range ends at the first
  record at or past `end`, or at the partition's end (`enable.partition.eof`).
  A slice of at most `ctx.local_rows` records (1,000 by default) is read on the
  driver instead, by one consumer kept for the run, into a local relation (`runtime.plan.local`):
  no Spark job, no task start-up, no consumer per range.
- `spark`: Spark's own Kafka connector (`spark-sql-kafka-0-10`, put on the session's
  `spark.jars.packages`: Spark resolves it from Maven Central into `~/.cache/streamer/ivy`
  once, `connectors/maven.py`), as a batch read with
  `startingOffsets` / `endingOffsets`.

`format: json` decodes the value with the pipeline's `schema:` (undecodable values go to
`on_error`); `format: raw` gives `key`, `value` (binary), `topic`, `partition`, `offset`,
`timestamp`. `record_timestamp: <column>` adds the Kafka record timestamp as a column, for
`event_time`. `key: <column>` (a changelog read as a table join's table): a tombstone (null
value) becomes a deletion of that column's key, taken from the message key (`_tombstones`).
With `bounded: true` the source ends at the partitions' end offsets read when the
job starts (smoke runs in CI).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from streamer.columns import TOMBSTONE
from streamer.connectors.base import ConnectorContext, Offsets, Source, SourceRead, SourceSlice
from streamer.connectors.exceptions import ConnectorError, ReadFailed
from streamer.worker import prepare_task

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

    from streamer.pipeline.spec import PipelineSpec, SourceSpec

#: Records per Arrow batch handed to Spark by a reading task.
BATCH_ROWS = 20_000
#: Bytes a range's consumer fetches from its partition at a time (`reader_conf`).
READER_FETCH_BYTES = 16 << 20
#: A task that gets no record for this long while its range is not done fails.
READ_TIMEOUT_S = 60.0
RAW_DDL = ("key binary, value binary, topic string, partition int, offset bigint, "
           "timestamp timestamp")
_SPLIT = "__streamer_kafka_split"
_OFFSET = "__streamer_kafka_offset"
_TS = "__streamer_kafka_timestamp"
CLIENTS = ("confluent", "spark")


def split_name(topic: str, partition: int) -> str:
    """The split (and offsets key) of a topic partition."""
    return f"{topic}:{partition}"


def parse_split(name: str) -> tuple[str, int]:
    """`topic:partition` -> (topic, partition) (Kafka topic names have no ':')."""
    topic, _, part = name.rpartition(":")
    return topic, int(part)


def quiet_logger() -> logging.Logger:
    """Where the driver's Kafka clients log: librdkafka would print every failed connection
    attempt to the terminal; what matters reaches the user in streamer's own messages."""
    logger = logging.getLogger("streamer.kafka.client")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
        logger.propagate = False
    return logger


def client_config(spec_options: Mapping[str, Any]) -> dict[str, Any]:
    """The librdkafka settings of a source or sink: `bootstrap_servers` plus `properties`."""
    conf: dict[str, Any] = {"bootstrap.servers": spec_options["bootstrap_servers"]}
    for key, value in (spec_options.get("properties") or {}).items():
        conf[str(key)] = value
    return conf


def session_conf(spec: PipelineSpec, conf: Mapping[str, Any]) -> dict[str, str]:
    """Spark settings a pipeline's Kafka sources add to `conf`: Spark's Kafka connector on
    `spark.jars.packages` (after the user's own) when a source has `client: spark`, which
    Spark resolves from Maven Central at the session's start (once, then from the cache)."""
    if not any(s.type == "kafka" and s.option("client") == "spark" for s in spec.sources):
        return {}
    from streamer.connectors.maven import packages_conf, spark_kafka_packages

    return packages_conf(conf, spark_kafka_packages())


class KafkaSource(Source):
    """Topic partitions as splits; reads planned offset ranges with confluent-kafka or Spark."""

    def __init__(self, spec: SourceSpec, ctx: ConnectorContext) -> None:
        super().__init__(spec, ctx)
        topic, topics = spec.option("topic"), spec.option("topics")
        self.topics: list[str] = [topic] if topic else list(topics or [])
        self.start: str = spec.option("start")
        self.format: str = spec.option("format")
        self.client: str = spec.option("client")
        if self.client not in CLIENTS:
            msg = (f"source {spec.id!r} has client: {self.client}; use one of "
                   f"{', '.join(CLIENTS)}")
            raise ConnectorError(msg)
        self.is_bounded: bool = bool(spec.option("bounded"))
        self.record_timestamp: str | None = spec.option("record_timestamp")
        #: A changelog's key column (`key:`): a tombstone deletes the row of its message key.
        self.key: str | None = spec.option("key")
        cap = spec.option("max_records_per_epoch")
        self.cap: int = max(1, int(cap))
        self.conf = client_config(spec.options)
        self.conf.setdefault("isolation.level", "read_committed")
        self._consumer: Any = None
        self._reader: Any = None  # the driver's consumer of local reads (`_local_frame`)
        self._bounds: dict[str, int] | None = None
        self._high: dict[str, int] = {}
        self._schema: StructType | None = None

    # --------------------------------------------------------------------- broker access
    def _admin_consumer(self) -> Any:
        """A driver-side consumer for metadata and watermark queries (never subscribes)."""
        if self._consumer is None:
            from confluent_kafka import Consumer

            conf = {**self.conf, "group.id": f"streamer.{self.ctx.job_name}.{self.spec.id}",
                    "enable.auto.commit": False}
            self._consumer = Consumer(conf, logger=quiet_logger())
        return self._consumer

    def partitions(self) -> list[str]:
        """Every partition of the source's topics now, as split names."""
        consumer = self._admin_consumer()
        found = []
        for topic in self.topics:
            try:
                meta = consumer.list_topics(topic, timeout=30).topics.get(topic)
            except Exception as exc:
                msg = (f"source {self.spec.id!r} cannot reach Kafka at "
                       f"{self.conf['bootstrap.servers']!r}: {exc}; check bootstrap_servers "
                       "and that the broker is running")
                raise ConnectorError(msg) from exc
            if meta is None or meta.error is not None or not meta.partitions:
                why = meta.error.str() if meta is not None and meta.error else "no partitions"
                msg = (f"source {self.spec.id!r} cannot read topic {topic!r} at "
                       f"{self.conf['bootstrap.servers']!r} ({why}); create the topic or fix "
                       "the topic name")
                raise ConnectorError(msg)
            found += [split_name(topic, p) for p in sorted(meta.partitions)]
        return found

    def watermarks(self, splits: list[str]) -> dict[str, tuple[int, int]]:
        """(low, high) offsets per split; with read_committed, high is the last stable offset."""
        from confluent_kafka import TopicPartition

        consumer = self._admin_consumer()
        out = {}
        for name in splits:
            topic, part = parse_split(name)
            try:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, part),
                                                           timeout=30, cached=False)
            except Exception as exc:
                msg = (f"source {self.spec.id!r} cannot read the offsets of {name!r}: {exc}; "
                       "check that the broker is running")
                raise ConnectorError(msg) from exc
            out[name] = (int(low), int(high))
        return out

    # ------------------------------------------------------------------------- contract
    @property
    def local_reads(self) -> bool:
        """Small slices are read by a consumer kept on the driver (confluent client)."""
        return self.client == "confluent"

    @property
    def task_reads(self) -> str | None:
        """JSON values read with the confluent client, without `key` or `record_timestamp`
        columns: "kafka" (`Source.task_reads`)."""
        if self.format == "json" and self.client == "confluent" and not self.key \
                and not self.record_timestamp:
            return "kafka"
        return None

    @property
    def bounded(self) -> bool:
        """Bounded with `bounded: true`."""
        return self.is_bounded

    def _bounds_now(self) -> dict[str, int]:
        """End offsets of a bounded source, read once per process (at the job's start)."""
        if self._bounds is None:
            self._bounds = {s: hi for s, (_, hi) in self.watermarks(self.partitions()).items()}
        return self._bounds

    def bounds(self) -> dict[str, int] | None:
        """Where a bounded source ends: each partition's end offset when the job started
        (None: unbounded)."""
        return self._bounds_now() if self.is_bounded else None

    def initial_offsets(self) -> Offsets:
        """Per partition, the low (earliest) or high (latest) watermark."""
        marks = self.watermarks(self.partitions())
        if self.is_bounded:
            self._bounds_now()
        pick = 0 if self.start == "earliest" else 1
        return {s: m[pick] for s, m in marks.items()}

    def plan(self, offsets: Mapping[str, Any], now_ms: int) -> SourceSlice | None:
        """Per partition, the next records up to its end (bound) and the per-epoch cap."""
        # Offsets of a topic the pipeline no longer reads (restored from a checkpoint or
        # savepoint) are dropped; partitions that appeared since start at their earliest.
        kept = {s for s in offsets if parse_split(s)[0] in self.topics}
        splits = sorted(set(self.partitions()) | kept)
        marks = self.watermarks(splits)
        self._high = {s: hi for s, (_, hi) in marks.items()}
        bounds = self._bounds_now() if self.is_bounded else None
        start, end, ranges = {}, {}, []
        for name in splits:
            low, high = marks[name]
            at = int(offsets.get(name, low))
            at = max(at, low)  # records deleted by retention are gone
            stop = high if bounds is None else min(high, bounds.get(name, at))
            stop = max(at, min(stop, at + self.cap))
            start[name], end[name] = at, stop
            if stop > at:
                topic, part = parse_split(name)
                ranges.append([topic, part, at, stop])
        if not ranges:
            return None
        return SourceSlice(source_id=self.spec.id, start=start, end=end,
                           payload={"ranges": ranges})

    def exhausted(self, offsets: Mapping[str, Any]) -> bool:
        """True for a bounded source once every partition reached its start-time end."""
        if not self.is_bounded:
            return False
        return all(int(offsets.get(s, 0)) >= b for s, b in self._bounds_now().items())

    def lag(self, offsets: Mapping[str, Any], now_ms: int) -> int | None:
        """Records in the partitions (as of the last plan) that the job has not read."""
        if not self._high:
            return None
        return sum(max(0, hi - int(offsets.get(s, hi))) for s, hi in self._high.items())

    def split_lag(self, offsets: Mapping[str, Any], now_ms: int) -> dict[str, int] | None:
        """`lag` per `topic:partition` (as of the last plan)."""
        if not self._high:
            return None
        return {s: max(0, hi - int(offsets.get(s, hi))) for s, hi in self._high.items()}

    # --------------------------------------------------------------------------- schema
    def schema(self) -> StructType:
        """The declared schema (json) or the raw record columns, plus `record_timestamp`."""
        if self._schema is None:
            from pyspark.sql.types import StructField, StructType, TimestampType

            from streamer.connectors.files.files_source import parse_schema

            base: StructType
            if self.format == "raw":
                base = StructType([StructField(f.name, f.dataType) for f in
                                   StructType.fromDDL(RAW_DDL).fields])  # type: ignore[attr-defined]
            else:
                declared = parse_schema(self.spec)
                if declared is None:
                    msg = (f"source {self.spec.id!r} reads JSON values but has no schema; add "
                           "schema: {column: type}, or use format: raw")
                    raise ConnectorError(msg)
                base = declared
            fields = list(base.fields)
            if self.record_timestamp:
                if self.record_timestamp in base.fieldNames():
                    msg = (f"source {self.spec.id!r} has record_timestamp: "
                           f"{self.record_timestamp}, which is already a column; choose "
                           "another name")
                    raise ConnectorError(msg)
                fields.append(StructField(self.record_timestamp, TimestampType()))
            self._schema = StructType(fields)
        return self._schema

    # ----------------------------------------------------------------------------- read
    def _raw_frame(self, ranges: list[list[Any]]) -> DataFrame:
        """The ranges' records as RAW_DDL rows, read by the chosen client."""
        if self.client == "spark":
            return self._spark_frame(ranges)
        frame = self.ctx.spark.range(0, len(ranges), 1, numPartitions=len(ranges))
        return frame.mapInArrow(_range_reader(ranges, self.reader_conf()), RAW_DDL)

    def _local_frame(self, ranges: list[list[Any]]) -> DataFrame | None:
        """The ranges' records read on the driver as a local relation, when they are few
        enough (`ConnectorContext.local_rows`) and the client is confluent; else None."""
        total = sum(end - start for _, _, start, end in ranges)
        if self.client != "confluent" or not 0 < total <= self.ctx.local_rows:
            return None
        import pyarrow as pa

        if self._reader is None:
            from confluent_kafka import Consumer

            # A kept consumer re-assigned to a partition waits out the long poll of its
            # previous fetch there first (`fetch.wait.max.ms`, 500 ms by default): measured
            # 500-1,000 ms per 100-record read, against 1-30 ms with 10 ms.
            conf = {"fetch.wait.max.ms": 10, **self.reader_conf()}
            self._reader = Consumer(conf, logger=quiet_logger())
        batches: list[pa.RecordBatch] = []
        for topic, part, start, end in ranges:
            try:
                batches += read_range({}, topic, part, start, end, self._reader)
            except Exception as exc:
                msg = (f"source {self.spec.id!r} cannot read {topic}:{part} offsets [{start}, "
                       f"{end}) from {self.conf['bootstrap.servers']!r}: {exc}; check that "
                       "the broker is running")
                raise ReadFailed(msg) from exc
        schema = raw_arrow_schema()
        table = pa.Table.from_batches(batches, schema=schema).combine_chunks()
        return self.ctx.spark.createDataFrame(table, schema=RAW_DDL)

    def reader_conf(self) -> dict[str, Any]:
        """The configuration of the consumers that read planned ranges (never a group's).

        A range is read whole, so each fetch asks for up to `READER_FETCH_BYTES` of the
        partition (librdkafka's default is 1 MiB: a 200,000-record range of ~75-byte
        values took 1.2-1.4 s to read, against 0.3 s with 16 MiB; `properties:` may set
        `max.partition.fetch.bytes` otherwise)."""
        return {"max.partition.fetch.bytes": READER_FETCH_BYTES, **self.conf,
                "group.id": f"streamer.{self.ctx.job_name}.{self.spec.id}",
                "enable.auto.commit": False, "enable.partition.eof": True,
                "auto.offset.reset": "error"}

    def close(self) -> None:
        """Close the driver's consumers."""
        for consumer in (self._reader, self._consumer):
            if consumer is not None:
                with contextlib.suppress(Exception):
                    consumer.close()
        self._reader = self._consumer = None

    def _spark_frame(self, ranges: list[list[Any]]) -> DataFrame:
        from pyspark.sql import functions as F

        assign: dict[str, list[int]] = {}
        starting: dict[str, dict[str, int]] = {}
        ending: dict[str, dict[str, int]] = {}
        for topic, part, start, end in ranges:
            assign.setdefault(topic, []).append(part)
            starting.setdefault(topic, {})[str(part)] = start
            ending.setdefault(topic, {})[str(part)] = end
        reader = (self.ctx.spark.read.format("kafka")
                  .option("assign", json.dumps(assign))
                  .option("startingOffsets", json.dumps(starting))
                  .option("endingOffsets", json.dumps(ending)))
        for key, value in self.conf.items():
            reader = reader.option(f"kafka.{key}", str(value))
        try:
            df = reader.load()
        except Exception as exc:
            from streamer.spark_errors import spark_error_message

            msg = (f"source {self.spec.id!r} has client: spark, but Spark's Kafka connector "
                   f"failed to load ({spark_error_message(exc)}); use client: confluent, or "
                   "run through `streamer run` so its jars are put on the session")
            raise ConnectorError(msg) from exc
        return df.select("key", "value", "topic", "partition", "offset",
                         F.col("timestamp").cast("timestamp").alias("timestamp"))

    def read(self, piece: SourceSlice) -> SourceRead:
        """The slice's records: decoded values (json) or raw records, with the split column."""
        from pyspark.sql import functions as F

        from streamer.connectors.formats import decode_json_lines

        local = self._local_frame(piece.payload["ranges"])
        raw = local if local is not None else self._raw_frame(piece.payload["ranges"])
        split = F.concat(F.col("topic"), F.lit(":"), F.col("partition").cast("string"))
        if self.format == "raw":
            cols = [F.col(c) for c in ("key", "value", "topic", "partition", "offset",
                                       "timestamp")]
            if self.record_timestamp:
                cols.append(F.col("timestamp").alias(self.record_timestamp))
            return SourceRead(records=raw.select(*cols, split.alias(_SPLIT),
                                                 F.col("offset").cast("string").alias(_OFFSET)),
                              split_column=_SPLIT, local=local is not None,
                              position=(_SPLIT, _OFFSET))
        carried = [split.alias(_SPLIT), F.col("timestamp").alias(_TS)]
        if self.spec.event_time:  # where a record whose event time is null was
            carried.append(F.col("offset").cast("string").alias(_OFFSET))
        # (Invalid UTF-8 becomes U+FFFD: Spark's cast does not check it, and a string that
        # is not UTF-8 fails whatever converts it to Python, a console sink's print.)
        value = F.make_valid_utf8(F.col("value").cast("string"))
        extra: tuple[str, ...] = (_SPLIT, _TS, _OFFSET) if self.spec.event_time else (_SPLIT, _TS)
        if self.key:  # a tombstone: its key column from the message key, a TOMBSTONE time
            value, tombstone = self._tombstones(value)
            carried.append(tombstone)
            extra = (*extra, TOMBSTONE)
        lines = raw.select(value.alias("value"), split.alias("split"),
                           F.col("offset").alias("offset"), *carried)
        decoded = decode_json_lines(self.ctx.spark, lines, self.schema_without_timestamp(),
                                    self.spec, extra=extra, local=local is not None,
                                    blank_is_record=True)
        records = decoded.records
        if self.record_timestamp:
            records = records.withColumnRenamed(_TS, self.record_timestamp)
        else:
            records = records.drop(_TS)
        dead = decoded.dead_letters
        if dead is not None:  # which field failed, not the whole schema
            from streamer.connectors.dead_letters import explain

            dead = explain(dead, self.schema_without_timestamp(), "json", lines=False)
        return SourceRead(records=records, dead_letters=dead,
                          split_column=_SPLIT, local=local is not None,
                          position=(_SPLIT, _OFFSET) if self.spec.event_time else None)

    def _tombstones(self, value: Column) -> tuple[Column, Column]:
        """(`value`, with a tombstone's (null value's) replaced by the JSON object of its
        `key:` column from the message key's text, cast to the column's type; a tombstone
        without a key, or whose key does not cast, by text that does not decode, so that it
        is a dead letter of the source's `on_error` (the record: what its key was); the
        `TOMBSTONE` column: a tombstone's Kafka timestamp, else null)."""
        from pyspark.sql import functions as F

        assert self.key is not None
        types = {f.name: f.dataType for f in self.schema_without_timestamp().fields}
        text = F.make_valid_utf8(F.col("key").cast("string"))
        key = text.try_cast(types[self.key]) if self.key in types else text
        is_tombstone = F.col("value").isNull()
        synthetic = F.when(key.isNotNull(), F.to_json(F.struct(key.alias(self.key)))).otherwise(
            F.coalesce(F.concat(F.lit(f"a tombstone whose key is not a {self.key}: "), text),
                       F.lit("a tombstone without a key")))
        return (F.when(is_tombstone, synthetic).otherwise(value),
                F.when(is_tombstone, F.col("timestamp")).alias(TOMBSTONE))

    def schema_without_timestamp(self) -> StructType:
        """The decoded value's columns (the schema less `record_timestamp`)."""
        from pyspark.sql.types import StructType

        return StructType([f for f in self.schema().fields if f.name != self.record_timestamp])


def _range_reader(ranges: list[list[Any]], conf: dict[str, Any]) -> Any:
    """The `mapInArrow` function that reads the ranges whose indexes arrive in `id`."""

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        prepare_task()
        for batch in batches:
            for index in batch.column(0).to_pylist():
                topic, part, start, end = ranges[index]
                yield from read_range(conf, topic, part, start, end)

    return read


def raw_arrow_schema() -> pa.Schema:
    """RAW_DDL as Arrow."""
    import pyarrow as pa

    return pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                      ("partition", pa.int32()), ("offset", pa.int64()),
                      ("timestamp", pa.timestamp("us", tz="UTC"))])


def read_range(conf: dict[str, Any], topic: str, partition: int, start: int,
               end: int, consumer: Any = None) -> Iterator[pa.RecordBatch]:
    """Records of one partition with offsets in [start, end), as Arrow batches of RAW_DDL,
    read by a consumer of `conf` (closed at the end), or by `consumer` (kept open).

    Offsets may skip (transaction markers, aborted records, compaction), so the range is
    done at the first record at or past `end`, or at the partition's end.
    """
    import pyarrow as pa
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    schema = raw_arrow_schema()
    owned = consumer is None
    if owned:
        consumer = Consumer(conf)
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        offsets: list[int] = []
        stamps: list[int | None] = []
        last_progress = time.monotonic()
        done = start >= end
        position = start
        while not done:
            # Ask for no more than the range holds, or consume() waits out its timeout.
            messages = consumer.consume(num_messages=max(1, min(BATCH_ROWS, end - position)),
                                        timeout=1.0)
            if not messages and time.monotonic() - last_progress > READ_TIMEOUT_S:
                msg = (f"reading {topic}:{partition} offsets [{start}, {end}) made no progress "
                       f"for {READ_TIMEOUT_S:.0f}s")
                raise RuntimeError(msg)
            for m in messages:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done = True
                        break
                    raise KafkaException(err)
                off = int(m.offset() or 0)  # a message without error has an offset
                if off < start:  # fetched for an earlier assignment of a kept consumer
                    continue
                if off >= end:
                    done = True
                    break
                position = off + 1
                keys.append(m.key())
                values.append(m.value())
                offsets.append(off)
                kind, ts = m.timestamp()
                stamps.append(ts * 1000 if kind != 0 and ts >= 0 else None)
                if off >= end - 1:
                    done = True
                    break
            if messages:
                last_progress = time.monotonic()
            if len(offsets) >= BATCH_ROWS or (done and offsets):
                n = len(offsets)
                yield pa.RecordBatch.from_arrays(
                    [pa.array(keys, pa.binary()), pa.array(values, pa.binary()),
                     pa.array([topic] * n, pa.string()),
                     pa.array([partition] * n, pa.int32()), pa.array(offsets, pa.int64()),
                     pa.array(stamps, pa.timestamp("us", tz="UTC"))], schema=schema)
                keys, values, offsets, stamps = [], [], [], []
    finally:
        if owned:
            consumer.close()
        else:
            consumer.unassign()
