"""What a continuous source subtask reads (`runtime.continuous_source`): its splits, a slice
at a time, with a position between two slices that it can resume from. Free of Spark.

- `FileSplits`: files in order (local parquet, JSON lines or CSV, decoded whole by
  `runtime.arrow_input.decode_unit`, as the epoch mode's Arrow tasks read them), then taken
  `batch_rows` rows at a time. The position is the files done, the file being read and its
  rows taken. One split, the files source's `files`.
- `KafkaSplits`: topic partitions, read by one confluent-kafka consumer `assign()`ed at
  their offsets (no consumer group: the job owns its offsets, as in the epoch mode). The
  position is the next offset per partition, named as the epoch mode names its splits
  (`<topic>:<partition>`), so a checkpoint of either mode has the same offsets. JSON values
  are decoded by `connectors.arrow.arrow_json` as the epoch mode's tasks decode them. With
  `stop_at` (a bounded source: each partition's end when the job started) the input ends
  there; otherwise it never ends, and a poll that finds nothing gives an empty slice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from streamer.exceptions import ArrowRefused, StreamerError
from streamer.runtime.arrow_input import ArrowInput, decode_unit, kafka_text


class ContinuousSourceError(StreamerError):
    """A source subtask met input it cannot read as Spark would (the continuous mode has no
    Spark to fall back to), or a position that is not its own: the message names the file
    or partition and why."""


@dataclass(frozen=True)
class Slice:
    """Rows read (the source's columns, decoded), the split of each (one name for all, or
    one per row), and every split the read looked at (for idleness)."""

    table: Any
    splits: str | list[str]
    polled: tuple[str, ...]


class FileSplits:
    """Files in order (module docstring)."""

    def __init__(self, plan: ArrowInput, files: Sequence[str], batch_rows: int) -> None:
        self.plan = plan
        self.files = list(files)
        self.batch_rows = batch_rows
        self.file = 0  # the index of the file being read
        self.row = 0  # rows of it taken
        self._table: Any = None  # the file being read, decoded
        self._split = "files"

    def position(self) -> dict[str, Any]:
        """The files done, the file being read (None: all done) and its rows taken."""
        current = self.files[self.file] if self.file < len(self.files) else None
        return {"done": self.files[:self.file], "file": current, "row": self.row,
                "files": list(self.files)}

    def epoch_offsets(self) -> dict[str, Any]:
        """What the epoch mode's files source records: the files read whole."""
        return {"files": self.files[:self.file]}

    def resume(self, position: Mapping[str, Any]) -> None:
        """Continue after `position` (`position()`'s)."""
        done = list(position.get("done", []))
        current = position.get("file")
        self.file = self.files.index(current) if current in self.files else len(self.files)
        if self.files[:self.file] != done or (current is not None and current not in self.files):
            msg = (f"the position (files done {done}, reading {current!r}) is not one of "
                   f"this subtask's files {self.files}")
            raise ContinuousSourceError(msg)
        self.row = int(position.get("row", 0))
        self._table = None

    def next_slice(self) -> Slice | None:
        """The next `batch_rows` rows (advancing the position), or None at the end."""
        while self.file < len(self.files):
            if self._table is None:
                name = self.files[self.file]
                try:
                    self._table, self._split = decode_unit(self.plan, name)
                except ArrowRefused as exc:
                    msg = f"source {self.plan.source_id!r}: cannot read {name!r} with Arrow: {exc}"
                    raise ContinuousSourceError(msg) from exc
            if self.row < self._table.num_rows:
                table = self._table.slice(self.row, self.batch_rows)
                self.row += table.num_rows
                return Slice(table, self._split, (self._split,))
            self.file += 1
            self.row = 0
            self._table = None
        return None

    def where(self) -> str:
        """The file being read (for messages)."""
        return self.files[min(self.file, len(self.files) - 1)] if self.files else "(no file)"

    def close(self) -> None:
        """Nothing to release."""


class KafkaSplits:
    """Topic partitions from their offsets (module docstring). `offsets`: split name ->
    the next offset to read; `stop_at`: split name -> where a bounded source ends."""

    def __init__(self, plan: ArrowInput, offsets: Mapping[str, int], batch_rows: int, *,
                 stop_at: Mapping[str, int] | None = None, poll_s: float = 0.1) -> None:
        self.plan = plan
        self.offsets = dict(offsets)
        self.stop_at = dict(stop_at) if stop_at is not None else None
        self.batch_rows = batch_rows
        self.poll_s = poll_s
        self._consumer: Any = None

    def position(self) -> dict[str, Any]:
        """The next offset per partition."""
        return {"offsets": dict(self.offsets)}

    def epoch_offsets(self) -> dict[str, Any]:
        """What the epoch mode's Kafka source records: the next offset per partition."""
        return dict(self.offsets)

    def resume(self, position: Mapping[str, Any]) -> None:
        """Continue from `position`'s offsets."""
        offsets = dict(position.get("offsets", {}))
        if set(offsets) != set(self.offsets):
            msg = (f"the position's partitions {sorted(offsets)} are not this subtask's "
                   f"{sorted(self.offsets)}")
            raise ContinuousSourceError(msg)
        self.offsets = {k: int(v) for k, v in offsets.items()}
        self.close()

    def _open(self) -> Any:
        from confluent_kafka import Consumer, TopicPartition

        assert self.plan.conf is not None
        consumer = Consumer(dict(self.plan.conf))
        consumer.assign([TopicPartition(*_partition(split), offset)
                         for split, offset in self._open_splits().items()])
        return consumer

    def _open_splits(self) -> dict[str, int]:
        if self.stop_at is None:
            return self.offsets
        return {s: o for s, o in self.offsets.items() if o < self.stop_at.get(s, 0)}

    def next_slice(self) -> Slice | None:
        """The records one poll returns (at most `batch_rows`; none: an empty slice), or
        None once a bounded source read every partition to its end."""
        import pyarrow as pa
        from confluent_kafka import KafkaError, KafkaException

        from streamer.connectors.arrow.arrow_json import decode
        from streamer.connectors.kafka.kafka_source import split_name
        from streamer.operators.arrow_sql import arrow_type

        if self.stop_at is not None and not self._open_splits():
            return None
        if self._consumer is None:
            self._consumer = self._open()
        values: list[bytes | None] = []
        splits: list[str] = []
        for m in self._consumer.consume(num_messages=self.batch_rows, timeout=self.poll_s):
            err = m.error()
            split = split_name(m.topic(), m.partition())
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
                # At the partition's end: what is left before it (transaction markers,
                # aborted records) is nothing to read.
                end = int(m.offset() or 0)
                if self.stop_at is not None:
                    end = min(end, self.stop_at.get(split, 0))
                self.offsets[split] = max(self.offsets[split], end)
                continue
            offset = int(m.offset() or 0)
            if offset < self.offsets[split] or (
                    self.stop_at is not None and offset >= self.stop_at.get(split, 0)):
                continue  # before its position, or past a bounded source's end
            self.offsets[split] = offset + 1
            values.append(m.value())
            splits.append(split)
        polled = tuple(self.offsets)
        if not values:
            schema = pa.schema([(n, arrow_type(k)) for n, k in self.plan.columns])
            return Slice(schema.empty_table(), [], polled)
        try:
            table = decode(kafka_text(values), self.plan.columns, len(values))
        except ArrowRefused as exc:
            msg = (f"source {self.plan.source_id!r}: cannot decode records of "
                   f"{sorted(set(splits))} with Arrow: {exc}")
            raise ContinuousSourceError(msg) from exc
        return Slice(table, splits, polled)

    def where(self) -> str:
        """The partitions (for messages)."""
        return ", ".join(sorted(self.offsets))

    def close(self) -> None:
        """Close the consumer (a later slice opens another at the offsets)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def _partition(split: str) -> tuple[str, int]:
    """(topic, partition) of a split named `<topic>:<partition>`."""
    topic, _, partition = split.rpartition(":")
    return topic, int(partition)


def end_offsets(conf: Mapping[str, Any], splits: Sequence[str]) -> dict[str, int]:
    """Each partition's end now (the last stable offset under `read_committed`): where a
    bounded source stops."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(dict(conf))
    try:
        return {s: int(consumer.get_watermark_offsets(TopicPartition(*_partition(s)),
                                                      timeout=30)[1]) for s in splits}
    finally:
        consumer.close()
