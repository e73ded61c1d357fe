"""`type: kafka` sink: JSON values, an optional key column, transactions in exactly_once mode.

**exactly_once** (the job checkpoints with `mode: exactly_once`): a two-phase commit whose
second phase is one Kafka transaction per epoch, with a marker that says which epoch it was.
1. `write` collects the epoch's (key, value) pairs (one Spark action, through Arrow) and stages
   them as one Parquet file under the job's storage:
   `<storage>/<job>/sinks/<sink id>/epoch-<n>.parquet`. The handle names the file, the epoch
   and the sink's *lineage* (a token drawn when the sink opens or recovers).
2. `commit` (after the checkpoint's `_metadata` is written) uses one transactional producer
   per job and sink (`transactional.id = streamer.<job>.<sink id>`; `init_transactions` fences
   a dead run's producer and settles its open transaction). It reads the marker, the offset
   that the consumer group `streamer.<job>.<sink id>.commits` has committed on partition 0 of
   the topic, whose value is the last committed epoch and whose metadata is its lineage. If the
   marker shows this epoch (same lineage, epoch at or past it), the epoch is already in Kafka
   and only the staged file is removed. Otherwise it begins a transaction, produces the staged
   records, moves the marker to this epoch with `send_offsets_to_transaction`, and commits: the
   records and the marker become visible together, to `read_committed` consumers, or not at all.
3. A crash between `_metadata` and the commit is resolved on recovery: the coordinator commits
   the checkpoint's pending handles again; the marker tells which of them Kafka already has.
   `recover` then removes files staged for epochs that will be written again.

The lineage makes the marker safe when epoch numbers start over (`--fresh`, a savepoint): a new
lineage's epoch 3 is not "already committed" because an older lineage reached epoch 9.

**at_least_once** (or no checkpoints): `write` produces straight from the Spark tasks with an
idempotent producer per task and waits for delivery; a restart replays and may duplicate.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import ConnectorContext
from streamer.connectors.exceptions import ConnectorError
from streamer.connectors.formats import column, timestamps_as_iso
from streamer.connectors.kafka import client_config, quiet_logger
from streamer.connectors.staged_sink import StagedTableSink
from streamer.worker import prepare_task

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from streamer.pipeline.spec import SinkSpec

#: How long a flush or a transaction step may take before the commit fails.
TIMEOUT_S = 120.0
_KEY, _VALUE = "__streamer_key", "__streamer_value"


class KafkaSink(StagedTableSink):
    """Writes rows as JSON records to one topic."""

    destination = "Kafka"

    def __init__(self, spec: SinkSpec, ctx: ConnectorContext) -> None:
        super().__init__(spec, ctx)
        self.topic: str = spec.option("topic")
        self.key: str | None = spec.option("key")
        self.conf = client_config(spec.options)
        # Java clients' default partitioner, so keys land where other clients put them.
        self.conf.setdefault("partitioner", "murmur2_random")
        self.transactional_id = f"streamer.{ctx.job_name}.{spec.id}"
        self.marker_group = f"streamer.{ctx.job_name}.{spec.id}.commits"
        self._producer: Any = None
        self._plain_producer: Any = None
        self._marker_consumer: Any = None

    # ---------------------------------------------------------------------------- setup
    def open(self) -> None:
        """Check the topic exists; in exactly_once mode, prepare the staging directory."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({k: v for k, v in self.conf.items() if k != "partitioner"},
                            logger=quiet_logger())
        try:
            meta = admin.list_topics(self.topic, timeout=30).topics.get(self.topic)
        except Exception as exc:
            msg = (f"sink {self.spec.id!r} cannot reach Kafka at "
                   f"{self.conf['bootstrap.servers']!r}: {exc}; check bootstrap_servers and "
                   "that the broker is running")
            raise ConnectorError(msg) from exc
        if meta is None or meta.error is not None or not meta.partitions:
            msg = (f"sink {self.spec.id!r} cannot write to topic {self.topic!r} at "
                   f"{self.conf['bootstrap.servers']!r}; create the topic first")
            raise ConnectorError(msg)
        self.open_staging()

    def _records(self, df: DataFrame) -> DataFrame:
        """(key string or null, value = the row as a JSON object) with ISO timestamps."""
        from pyspark.sql import functions as F

        if self.key is not None and self.key not in df.columns:
            msg = (f"sink {self.spec.id!r} has key: {self.key}, but its input has no such "
                   f"column (it has {', '.join(df.columns)}); use one of them")
            raise ConnectorError(msg)
        iso = timestamps_as_iso(df)
        key = (column(self.key).cast("string") if self.key is not None
               else F.lit(None).cast("string"))
        value = F.to_json(F.struct(*[column(c) for c in iso.columns]),
                          {"ignoreNullFields": "false"})
        return iso.select(key.alias(_KEY), value.alias(_VALUE))

    # ---------------------------------------------------------------------------- write
    def write(self, epoch: int, df: DataFrame) -> dict[str, Any]:
        """exactly_once: stage the epoch's records; otherwise produce them now."""
        records = self._records(df)
        if not self.transactional:
            counts = records.mapInArrow(_producer_task(self._plain_conf(), self.topic),
                                        "n bigint")
            total = counts.agg({"n": "sum"}).collect()[0][0]
            return {"epoch": epoch, "records": int(total or 0)}
        return self.write_table(epoch, records.toArrow())

    def _plain_conf(self) -> dict[str, Any]:
        """The configuration of producers outside transactions."""
        return {**self.conf, "enable.idempotence": True, "linger.ms": 20}

    def table_of(self, df: DataFrame) -> DataFrame:
        """(key, value) records: `_records`."""
        return self._records(df)

    def write_table(self, epoch: int, table: pa.Table) -> dict[str, Any]:
        """exactly_once: stage the (key, value) records; otherwise produce them now, from
        the driver."""
        if not self.transactional:
            if self._plain_producer is None:
                from confluent_kafka import Producer

                self._plain_producer = Producer(self._plain_conf(), logger=quiet_logger())
            return {"epoch": epoch,
                    "records": _produce_table(self._plain_producer, self.topic, table)}
        return self.stage(epoch, table)

    # --------------------------------------------------------------------------- commit
    def _txn_producer(self) -> Any:
        if self._producer is None:
            from confluent_kafka import Producer

            conf = {**self.conf, "transactional.id": self.transactional_id, "linger.ms": 20}
            producer = Producer(conf, logger=quiet_logger())
            # Fences the producer of a dead run and aborts (or completes) its open transaction.
            producer.init_transactions(TIMEOUT_S)
            self._producer = producer
        return self._producer

    def _marker(self) -> tuple[int, str]:
        """(last committed epoch, its lineage) from the marker group; (-1, '') if none."""
        from confluent_kafka import Consumer, TopicPartition

        if self._marker_consumer is None:
            self._marker_consumer = Consumer({
                "bootstrap.servers": self.conf["bootstrap.servers"],
                **{k: v for k, v in self.conf.items() if k.startswith(("security.", "sasl.",
                                                                       "ssl."))},
                "group.id": self.marker_group, "enable.auto.commit": False,
                "isolation.level": "read_committed"}, logger=quiet_logger())
        found = self._marker_consumer.committed([TopicPartition(self.topic, 0)],
                                                timeout=TIMEOUT_S)[0]
        if found.error is not None:
            msg = f"sink {self.spec.id!r} cannot read its commit marker: {found.error}"
            raise ConnectorError(msg)
        if found.offset < 0:
            return -1, ""
        return int(found.offset), str(found.metadata or "")

    def committed(self, epoch: int, lineage: str) -> bool:
        """Whether Kafka holds the records of `epoch` written by `lineage`."""
        marked, marked_lineage = self._marker()
        return marked_lineage == lineage and marked >= epoch

    def commit(self, epoch: int, handle: Any) -> None:
        """Produce the staged records in one transaction that also moves the marker to
        `epoch`; nothing to do when the marker shows the epoch committed. Idempotent."""
        if not self.transactional or not handle.get("file"):
            return
        from confluent_kafka import TopicPartition

        producer = self._txn_producer()  # first: settles a dead run's open transaction
        path = handle["file"]
        if self.committed(epoch, handle["lineage"]):
            self.drop_staged(path)
            return
        table = self.staged_rows(epoch, path)
        producer.begin_transaction()
        try:
            _produce_table(producer, self.topic, table)
            marker = TopicPartition(self.topic, 0, epoch, metadata=handle["lineage"])
            self._marker()  # opens the marker consumer, whose group metadata is needed
            producer.send_offsets_to_transaction(
                [marker], self._marker_consumer.consumer_group_metadata(), TIMEOUT_S)
            producer.commit_transaction(TIMEOUT_S)
        except BaseException:
            import contextlib

            with contextlib.suppress(Exception):
                producer.abort_transaction(TIMEOUT_S)
            raise
        self._fs.rm(path)

    def close(self) -> None:
        """Close the marker consumer; flush and drop the producer."""
        if self._marker_consumer is not None:
            self._marker_consumer.close()
            self._marker_consumer = None
        for producer in (self._producer, self._plain_producer):
            if producer is not None:
                producer.flush(10)
        self._producer = self._plain_producer = None


def _produce_table(producer: Any, topic: str, table: pa.Table) -> int:
    """Produce every (key, value) row of `table`; returns the count once all are delivered."""
    failures: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    n = 0
    for batch in table.to_batches():
        keys = batch.column(0).to_pylist()
        values = batch.column(1).to_pylist()
        for key, value in zip(keys, values, strict=True):
            while True:
                try:
                    producer.produce(topic, value=value, key=key, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
            n += 1
        producer.poll(0)
    left = producer.flush(TIMEOUT_S)
    if left or failures:
        msg = (f"{left} records were not delivered to {topic!r} within {TIMEOUT_S:.0f}s"
               if left else f"delivery to {topic!r} failed: {failures[0]}")
        raise ConnectorError(msg)
    return n


def _producer_task(conf: dict[str, Any], topic: str) -> Any:
    """The `mapInArrow` function that produces a task's rows and yields their count."""

    def produce(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        prepare_task()
        import pyarrow as pa
        from confluent_kafka import Producer

        producer = Producer(conf)
        n = 0
        for batch in batches:
            n += _produce_table(producer, topic, pa.Table.from_batches([batch]))
        yield pa.RecordBatch.from_arrays([pa.array([n], pa.int64())], names=["n"])

    return produce
