"""What a continuous source subtask reads (`runtime.continuous.source_subtask`): its splits, a slice
at a time, with a position between two slices that it can resume from. Free of Spark.

- `FileSplits`: files in order (local parquet, JSON lines or CSV, decoded whole by
  `runtime.arrow.arrow_input.decode_unit`, as the epoch mode's Arrow tasks read them), then taken
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
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from streamer.exceptions import ArrowRefused, StreamerError
from streamer.runtime.arrow.arrow_input import ArrowInput, decode_unit, kafka_text
from streamer.runtime.continuous.source_records import (
    BadRecords,
    Dead,
    Where,
    file_lines,
    salvage_lines,
    salvage_values,
)


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
    #: Bad records met reading it, as dead letters (a source with `on_error`).
    dead: list[Dead] = field(default_factory=list)
    #: Where some of its rows were (for dead letters of records without event time).
    where: Where | None = None


class FileSplits:
    """Files in order (module docstring)."""

    def __init__(self, plan: ArrowInput, files: Sequence[str], batch_rows: int,
                 bad: BadRecords | None = None) -> None:
        self.plan = plan
        self.files = list(files)
        self.batch_rows = batch_rows
        self.bad = bad
        self.file = 0  # the index of the file being read
        self.row = 0  # rows of it taken
        self._table: Any = None  # the file being read, decoded
        self._split = "files"
        self._dead: list[Dead] = []  # the file's bad records, sent with its first slice
        self._dead_sent = False
        self._lines: list[tuple[int, str | None]] | None = None  # each decoded row's line and text

    def position(self) -> dict[str, Any]:
        """The files done, the file being read (None: all done) and its rows taken."""
        current = self.files[self.file] if self.file < len(self.files) else None
        return {"done": self.files[:self.file], "file": current, "row": self.row,
                "files": list(self.files), "dead_sent": self._dead_sent}

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
        self._dead_sent = bool(position.get("dead_sent", self.row > 0))
        self._table = None

    def next_slice(self) -> Slice | None:
        """The next `batch_rows` rows (advancing the position), or None at the end. A file's
        bad records go with its first slice (`dead_sent` in the position)."""
        while self.file < len(self.files):
            if self._table is None:
                self._open(self.files[self.file])
            dead = [] if self._dead_sent else self._dead
            self._dead_sent = True
            if self.row < self._table.num_rows or dead:
                start = self.row
                table = self._table.slice(self.row, self.batch_rows)
                self.row += table.num_rows
                return Slice(table, self._split, (self._split,), dead,
                             partial(self._where, start))
            self.file += 1
            self.row = 0
            self._table, self._dead, self._dead_sent, self._lines = None, [], False, None
        return None

    def _open(self, name: str) -> None:
        """Decode file `name`; one Arrow refuses whole record by record (`salvage_lines`)."""
        try:
            self._table, self._split = decode_unit(self.plan, name)
            self._dead = []
            return
        except ArrowRefused as exc:
            refused = exc
        if self.bad is not None and self.plan.kind == "files":
            from streamer.connectors.files.files_source import SPLIT

            with open(name, "rb") as f:
                data = f.read()
            try:
                found = salvage_lines(self.bad, data, name)
            except ArrowRefused as exc:
                refused = exc
            else:
                self._table, self._split, self._dead = found.table, SPLIT, found.dead
                self._lines = list(zip(found.lines, found.texts, strict=True))
                return
        msg = f"source {self.plan.source_id!r}: cannot read {name!r} with Arrow: {refused}"
        raise ContinuousSourceError(msg) from refused

    def _where(self, start: int, rows: list[int]) -> list[tuple[str | None, str | None,
                                                                 str | None]]:
        """The file, line and text of `rows` of the slice from row `start` (JSON lines; of
        another format the row's index in the file, and no text)."""
        name = self.files[self.file]
        if self.plan.kind != "files":
            return [(name, str(start + i), None) for i in rows]
        if self._lines is None:
            self._lines = file_lines(name)
        return [(name, str(self._lines[start + i][0]), self._lines[start + i][1])
                for i in rows]

    def where(self) -> str:
        """The file being read (for messages)."""
        return self.files[min(self.file, len(self.files) - 1)] if self.files else "(no file)"

    def close(self) -> None:
        """Nothing to release."""


class KafkaSplits:
    """Topic partitions from their offsets (module docstring). `offsets`: split name ->
    the next offset to read; `stop_at`: split name -> where a bounded source ends."""

    def __init__(self, plan: ArrowInput, offsets: Mapping[str, int], batch_rows: int, *,
                 stop_at: Mapping[str, int] | None = None, poll_s: float = 0.1,
                 bad: BadRecords | None = None) -> None:
        self.plan = plan
        self.bad = bad
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

        from streamer.connectors.kafka.kafka_source import split_name
        from streamer.runtime.arrow.arrow_sql import arrow_type

        if self.stop_at is not None and not self._open_splits():
            return None
        if self._consumer is None:
            self._consumer = self._open()
        values: list[bytes | None] = []
        splits: list[str] = []
        offsets: list[int] = []
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
            offsets.append(offset)
        polled = tuple(self.offsets)
        if not values:
            schema = pa.schema([(n, arrow_type(k)) for n, k in self.plan.columns])
            return Slice(schema.empty_table(), [], polled)
        return self._decoded(values, splits, offsets, polled)

    def _decoded(self, values: list[bytes | None], splits: list[str], offsets: list[int],
                 polled: tuple[str, ...]) -> Slice:
        """The slice of one poll's values; values Arrow refuses together are taken one by
        one (`salvage_values`): the bad ones as dead letters."""
        from streamer.connectors.arrow.arrow_json import decode

        dead: list[Dead] = []
        try:
            table = decode(kafka_text(values), self.plan.columns, len(values))
        except ArrowRefused as exc:
            if self.bad is None:
                msg = (f"source {self.plan.source_id!r}: cannot decode records of "
                       f"{sorted(set(splits))} with Arrow: {exc}")
                raise ContinuousSourceError(msg) from exc
            try:
                found = salvage_values(self.bad, values, splits, offsets)
            except ArrowRefused as again:
                msg = (f"source {self.plan.source_id!r}: cannot decode records of "
                       f"{sorted(set(splits))} with Arrow: {again}")
                raise ContinuousSourceError(msg) from again
            table, splits, offsets, dead = found.table, found.splits, found.lines, found.dead

        def where(rows: list[int]) -> list[tuple[str | None, str | None, str | None]]:
            return [(splits[i], str(offsets[i]), None) for i in rows]

        return Slice(table, splits, polled, dead, where)

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
