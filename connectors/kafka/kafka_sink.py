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

from streamer import failpoints
from streamer.connectors.base import ConnectorContext, WritesTaskFiles
from streamer.connectors.exceptions import ConnectorError
from streamer.connectors.formats import column, timestamps_as_iso
from streamer.connectors.kafka.kafka_source import client_config, quiet_logger
from streamer.connectors.staged_sink import StagedTableSink
from streamer.worker import prepare_task

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from streamer.connectors.files.files_sink import TaskTarget
    from streamer.pipeline.spec import SinkSpec

#: How long a flush or a transaction step may take before the commit fails.
TIMEOUT_S = 120.0
_KEY, _VALUE = "__streamer_key", "__streamer_value"


class KafkaSink(StagedTableSink, WritesTaskFiles):
    """Writes rows as JSON records to one topic."""

    #: What its tasks stage (`WritesTaskFiles`): records, not files of a format.
    format = "kafka"

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

    # ------------------------------------------------------------------ task-written records
    def task_files_refused(self, schema: StructType) -> str | None:
        """Why Spark tasks cannot stage rows of `schema` as this sink's records themselves
        (`files_sink.TaskTarget.records`), or None: exactly_once (the records wait in
        staging files for the commit), staging on the local file system, the JSON encoder
        takes every column (`arrow_json_writer.TYPES`, a UTC session), and the key (if any)
        is a string, integer or boolean column, whose text Arrow casts as Spark does."""
        from fsspec.core import url_to_fs

        from streamer.connectors.arrow.arrow_json_writer import unsupported
        from streamer.connectors.files.files_source import is_local
        from streamer.connectors.formats import not_utc

        if not self.transactional:
            return f"sink {self.spec.id!r} is not exactly_once: its tasks produce themselves"
        if not is_local(url_to_fs(self.ctx.storage_url or "./.streamer")[0]):
            return "the job's storage is not on the local file system"
        why = not_utc(self.ctx.spark) or unsupported(
            [(f.name, f.dataType.simpleString()) for f in schema.fields])
        if why is not None:
            return f"sink {self.spec.id!r}: {why}"
        if self.key is not None:
            kinds = {f.name: f.dataType.simpleString() for f in schema.fields}
            if kinds.get(self.key) not in ("string", "bigint", "int", "boolean"):
                return f"sink {self.spec.id!r}: key {self.key!r} is not a string, integer or " \
                    "boolean column"
        return None

    def task_target(self, epoch: int, schema: StructType) -> TaskTarget | None:
        """Where the epoch's tasks stage their rows as records (an empty directory), or
        None when they cannot (`task_files_refused`)."""
        if self.task_files_refused(schema) is not None:
            return None
        from streamer.connectors.files.files_sink import empty_target

        return empty_target(self.ctx.spark, self._fs, self._epoch_dir(epoch), schema, json=True,
                            records=True, key=self.key)

    def direct(self, schema: StructType, linger_ms: int = 0) -> DirectProducer | None:
        """How a long-running task produces rows of `schema` itself as they come (the
        continuous mode's at_least_once path: records are visible at once, and each
        checkpoint flushes what came before it), or None: the sink is exactly_once (its
        records wait for the checkpoint's transaction), or the JSON encoder does not take
        every column. `linger_ms`: the producer's `linger.ms` (how long it waits to fill a
        batch)."""
        from streamer.connectors.arrow.arrow_json_writer import (
            JsonLines,
            jvm_prints_shortest,
            unsupported,
        )
        from streamer.connectors.formats import not_utc

        columns = tuple((f.name, f.dataType.simpleString()) for f in schema.fields
                        if not f.name.startswith("__"))
        if self.transactional or not_utc(self.ctx.spark) or unsupported(list(columns)):
            return None
        json = JsonLines(columns, shortest=jvm_prints_shortest(self.ctx.spark))
        return DirectProducer(self.topic, {"linger.ms": linger_ms, **self.conf}, self.key, json)

    @property
    def staging_root(self) -> str:
        """Where every epoch's task-written records wait (`files_sink.epoch_staging`)."""
        return self._staging

    def _epoch_dir(self, epoch: int) -> str:
        """The directory of an epoch's task-written records."""
        from streamer.connectors.files.files_sink import epoch_staging

        return epoch_staging(self._staging, epoch)

    def tasks_wrote(self, epoch: int, run: Any, beside: DataFrame | None = None
                    ) -> dict[str, Any]:
        """Stage the epoch's task-written records: `run()` runs the job whose tasks write
        them into `task_target(epoch)`; Spark renders the rows the encoder refused and those
        of `beside` as further files. The handle is `stage`'s, listing the files."""
        import os

        import pyarrow.parquet as pq

        from streamer.connectors.files.files_sink import RECORDS, SPILL
        from streamer.connectors.files.files_source import spark_path

        run()
        directory = self._epoch_dir(epoch)
        extra = [(name[:-len(SPILL)], self.ctx.spark.read.parquet(spark_path(
            os.path.join(directory, name)))) for name in sorted(os.listdir(directory))
            if name.endswith(SPILL)]
        if beside is not None:
            extra.append(("part-s", beside))
        for stem, df in extra:
            table = self._records(df).toArrow()
            if table.num_rows:
                pq.write_table(table, os.path.join(directory, f".{stem}.tmp"))
                os.replace(os.path.join(directory, f".{stem}.tmp"),
                           os.path.join(directory, f"{stem}{RECORDS}"))
        for name in os.listdir(directory):
            if name.endswith(SPILL):
                os.remove(os.path.join(directory, name))
        files = sorted(os.path.join(directory, n) for n in os.listdir(directory)
                       if n.endswith(RECORDS))
        records = sum(pq.read_metadata(f).num_rows for f in files)
        return {"epoch": epoch, "lineage": self.lineage, "records": records, "file": None,
                "files": files, "directory": directory}

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
        files = _staged_files(handle)
        if not self.transactional:
            return
        if not files:
            self._drop(handle)  # (an epoch whose tasks wrote no records)
            return
        from confluent_kafka import TopicPartition

        producer = self._txn_producer()  # first: settles a dead run's open transaction
        if self.committed(epoch, handle["lineage"]):
            self._drop(handle)
            return
        tables = [self.staged_rows(epoch, path) for path in files]
        producer.begin_transaction()
        try:
            for table in tables:
                _produce_table(producer, self.topic, table)
            failpoints.reached("mid-transaction", epoch)
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
        self._drop(handle)

    def _drop(self, handle: dict[str, Any]) -> None:
        """Remove an epoch's staged records (its file, or its task-written directory)."""
        for path in _staged_files(handle):
            self.drop_staged(path)
        if handle.get("directory") and self._fs.exists(handle["directory"]):
            self._fs.rm(handle["directory"], recursive=True)

    def abort(self, epoch: int, handle: Any) -> None:
        """Discard the epoch's staged records."""
        if isinstance(handle, dict):
            self._drop(handle)

    def close(self) -> None:
        """Close the marker consumer; flush and drop the producer."""
        if self._marker_consumer is not None:
            self._marker_consumer.close()
            self._marker_consumer = None
        for producer in (self._producer, self._plain_producer):
            if producer is not None:
                producer.flush(10)
        self._producer = self._plain_producer = None


def _staged_files(handle: dict[str, Any]) -> list[str]:
    """The files of an epoch's staged records: task-written ones, or the one `stage` wrote."""
    return list(handle.get("files") or ([handle["file"]] if handle.get("file") else []))


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


class DirectProducer:
    """A task's producer of a Kafka sink's records (`KafkaSink.direct`): `write` produces
    a batch's output rows (the `kind_column == out_kind` rows, hidden columns dropped) as
    the sink's records without waiting; `flush` waits until every one is delivered, and
    raises if one was not. Picklable until `write` opens the producer."""

    def __init__(self, topic: str, conf: dict[str, Any], key: str | None, json: Any) -> None:
        self.topic = topic
        self.conf = conf
        self.key = key
        self.json = json
        self.rows = 0
        self._producer: Any = None
        self._failures: list[str] = []

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_producer": None, "_failures": []}

    def write(self, batch: pa.RecordBatch, kind_column: str | None = None,
              out_kind: str = "") -> None:
        """Produce the batch's output rows (class docstring; without `kind_column`, every
        row)."""
        import pyarrow.compute as pc

        from streamer.connectors.files.files_sink import kafka_records

        out = batch if kind_column is None else batch.filter(
            pc.equal(batch.column(kind_column), out_kind))
        if not out.num_rows:
            return
        out = out.select([n for n in out.schema.names if not n.startswith("__")])
        records = kafka_records(out, self.json, self.key)
        if self._producer is None:
            from confluent_kafka import Producer

            self._producer = Producer(self.conf, logger=quiet_logger())
        keys, values = records.column(0).to_pylist(), records.column(1).to_pylist()
        for key, value in zip(keys, values, strict=True):
            while True:
                try:
                    self._producer.produce(self.topic, value=value, key=key,
                                           on_delivery=self._delivered)
                    break
                except BufferError:
                    self._producer.poll(0.01)
        self._producer.poll(0)
        self.rows += out.num_rows

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._failures.append(str(err))

    def flush(self) -> None:
        """Wait until everything written is in Kafka."""
        left = self._producer.flush(TIMEOUT_S) if self._producer is not None else 0
        if left or self._failures:
            msg = (f"{left} records were not delivered to {self.topic!r} within "
                   f"{TIMEOUT_S:.0f}s" if left else
                   f"delivery to {self.topic!r} failed: {self._failures[0]}")
            raise ConnectorError(msg)
