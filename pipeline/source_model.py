"""The `sources:` block of the pipeline file as pydantic v2 models (issue 38, item 3): one model
per source type (`DatagenSource`, `FilesSource`, `KafkaSource`), a union discriminated by
`type:` (`Source`), `extra="forbid"`, the nested `watermark:` model, and each default written
once (the connectors read it from `SourceSpec.options`, which `build_source` fills in). The
rules between keys are functions over the raw mapping, run after pydantic (`RULES`), so that a
source with a wrong type and a broken rule gets both messages in one run
(docs/decisions/pydantic.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeAlias

from pydantic import Discriminator, Field, Tag
from pydantic.json_schema import SkipJsonSchema

from streamer.pipeline.checker import Checker, Rule
from streamer.pipeline.schema_base import COLUMN_HINT, COLUMN_PATTERN, exactly_one, named
from streamer.pipeline.source_spec import SourceSpec, WatermarkSpec
from streamer.pipeline.yaml_loader import Path
from streamer.pipeline.yaml_model import (
    Duration,
    DurationOrZero,
    Id,
    PositiveNumber,
    Settings,
    Text,
    YamlModel,
    mapping,
    text,
    type_of,
)

if TYPE_CHECKING:  # what they validate to; pydantic reads the types below
    Column: TypeAlias = str
    Columns: TypeAlias = dict[str, str]
    Fields: TypeAlias = dict[str, str]
else:
    Column = text(pattern=COLUMN_PATTERN, hint=COLUMN_HINT)
    Columns = mapping(text("A Spark SQL type name: string, bigint, double, timestamp, "
                           "decimal(10,2), array<string>, ..."),
                      "Columns and their Spark SQL types, in order.", COLUMN_PATTERN,
                      COLUMN_HINT)
    Fields = mapping(text("A Spark SQL expression."), "Columns as Spark SQL expressions of "
                     "`offset`, `split` and `generated_at`.", COLUMN_PATTERN, COLUMN_HINT)


class WatermarkModel(YamlModel):
    """Event-time watermark: per split, max event time - max_out_of_orderness."""

    max_out_of_orderness: DurationOrZero = Field(
        default="0s", validate_default=True, description="How late an event may arrive "
        "behind the newest one seen on its split.")
    idle_timeout: Duration | SkipJsonSchema[None] = Field(
        default=None, description="A split with no records for this long is left out of the "
        "watermark.")


class SourceModel(YamlModel):
    """What every source has: its type, id, and how its records are read as events."""

    #: How messages name a source: `source 'clicks'` by its id, else `sources[2]`.
    noun: ClassVar[tuple[str, str]] = ("source", "sources")

    type: str
    id: Id
    uid: Text | SkipJsonSchema[None] = Field(
        default=None, description="Stable identity of this source's offsets in checkpoints "
        "and savepoints (default: the id).")
    schema_: Columns | SkipJsonSchema[None] = Field(default=None, alias="schema")
    event_time: Text | SkipJsonSchema[None] = Field(
        default=None, description="A column or expression of type timestamp: the record's "
        "event time.")
    watermark: WatermarkModel | SkipJsonSchema[None] = None
    on_error: Text | SkipJsonSchema[None] = Field(
        default=None, description="The id of a sink that receives records this source "
        "cannot decode (the dead-letter output).")


class DatagenSource(SourceModel):
    """Deterministic rows computed from (split, offset)."""

    type: Literal["datagen"]
    splits: Annotated[int, Field(ge=1)] = Field(default=1,
                                                description="Number of parallel splits.")
    rows_per_second: PositiveNumber | SkipJsonSchema[None] = Field(
        default=None, description="Total rate over all splits; absent = as fast as possible.")
    limit: Annotated[int, Field(ge=0)] | SkipJsonSchema[None] = Field(
        default=None, description="Rows per split; absent = unbounded.")
    max_records_per_epoch: Annotated[int, Field(ge=1)] | SkipJsonSchema[None] = Field(
        default=None, description="At most this many rows per epoch over all splits.")
    fields: Fields


class FilesSource(SourceModel):
    """Files read in name order; with watch: true, new files are picked up as they appear."""

    type: Literal["files"]
    path: Text = Field(description="fsspec URL or glob of the input files.")
    format: Literal["jsonl", "csv", "parquet", "text"] = Field(
        description="File format; `text` gives one column `line` per line.")
    watch: bool = Field(default=False, description="Watch for new files (unbounded).")
    header: bool = Field(default=True,
                         description="CSV only: the first line names the columns.")
    delimiter: Text = Field(default=",", description="CSV only: the field separator.")
    max_files_per_epoch: Annotated[int, Field(ge=1)] | SkipJsonSchema[None] = Field(
        default=None, description="At most this many new files per epoch.")
    reload: bool = Field(default=False, description="A table join's right input: when a file "
                         "changes, appears or goes away (size, modification time), every "
                         "file is read again and replaces the table (keys no longer present "
                         "are deleted); unbounded.")


class KafkaSource(SourceModel):
    """Kafka topic partitions; offsets are the source's state."""

    type: Literal["kafka"]
    bootstrap_servers: Text = Field(description="host:port[,host:port]")
    topic: Text | SkipJsonSchema[None] = Field(default=None, description="Topic to read.")
    topics: Annotated[list[Text], Field(min_length=1)] | SkipJsonSchema[None] = Field(
        default=None, description="Topics to read.")
    start: Literal["earliest", "latest"] = Field(
        default="earliest", description="Where a job without a checkpoint starts reading.")
    format: Literal["json", "raw"] = Field(
        default="json", description="Value format: `json` decodes by `schema`; `raw` gives "
        "the columns key, value, topic, partition, offset, timestamp.")
    properties: Settings | SkipJsonSchema[None] = Field(
        default=None, description="Passed to the Kafka client as-is.")
    bounded: bool = Field(default=False, description="Stop at the partitions' end offsets "
                          "read when the job starts (smoke runs).")
    client: Literal["confluent", "spark"] = Field(
        default="confluent", description="How partitions are read: confluent-kafka in the "
        "Spark tasks or Spark's own Kafka connector.")
    record_timestamp: Column | SkipJsonSchema[None] = Field(
        default=None, description="Add the Kafka record timestamp as this column (use it as "
        "event_time).")
    max_records_per_epoch: Annotated[int, Field(ge=1)] = Field(
        default=1_000_000, description="At most this many records per partition per epoch.")
    key: Column | SkipJsonSchema[None] = Field(
        default=None, description="A changelog read as a table join's right input: the "
        "column (of schema) that the message key holds, as text (as the Kafka sink's key: "
        "writes it); a tombstone (null value) then deletes the table row of that key.")


#: A source of the pipeline file, by its `type:`.
Source = Annotated[Annotated[DatagenSource, Tag("datagen")]
                   | Annotated[FilesSource, Tag("files")]
                   | Annotated[KafkaSource, Tag("kafka")], Discriminator(type_of)]

#: The keys every source has, which `SourceSpec` holds as fields, not `options`.
_COMMON = {"type", "id", "uid", "schema_", "event_time", "watermark", "on_error"}


def build_source(src: SourceModel, path: Path) -> SourceSpec:
    """The spec of a validated source (`src`, an item of `PipelineModel.sources`): its common
    keys, and its type's settings in `options` with each default filled in from its model
    (one not set, None, left out)."""
    wm = src.watermark
    if wm is None and src.event_time:
        wm = WatermarkModel()
    return SourceSpec(
        id=src.id, type=src.type, uid=src.uid or src.id,
        schema=tuple(src.schema_.items()) if src.schema_ else None,
        event_time=src.event_time,
        watermark=WatermarkSpec(wm.max_out_of_orderness, wm.idle_timeout) if wm else None,
        on_error=src.on_error,
        options=src.model_dump(exclude=_COMMON, exclude_none=True), path=path)


def _watermark_needs_event_time(value: dict[str, Any], path: Path, ck: Checker) -> None:
    if "watermark" in value and "event_time" not in value:
        ck.report((*path, "watermark"), f"{named(*SourceModel.noun)(value, path)} has a "
                  "watermark but no event_time; add event_time: <timestamp column>", at_key=True)


def _datagen_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
    if "schema" in value:
        ck.report((*path, "schema"), "a datagen source takes its schema from `fields`; "
                  "remove `schema` (cast in the field expressions instead)", at_key=True)


def _files_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
    if value.get("format") == "text":
        for key in ("schema", "on_error"):
            if key in value:
                ck.report((*path, key), f"format: text has one column `line` and cannot fail "
                          f"to decode; remove {key!r}", at_key=True)
    if value.get("reload") is True:
        for key in ("watch", "max_files_per_epoch"):
            if key in value:
                ck.report((*path, key), f"{key!r} does not apply with reload: true, which "
                          "watches the files and reads them all at each change; remove "
                          f"{key!r}", at_key=True)
    if value.get("format") != "csv":
        for key in ("header", "delimiter"):
            if key in value:
                ck.report((*path, key), f"{key!r} applies only to format: csv", at_key=True)


def _kafka_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
    if value.get("format") == "raw" and "schema" in value:
        ck.report((*path, "schema"), "format: raw has the columns key, value, topic, "
                  "partition, offset, timestamp; remove 'schema'", at_key=True)
    if value.get("format") == "raw" and "on_error" in value:
        ck.report((*path, "on_error"), "format: raw cannot fail to decode; remove "
                  "'on_error'", at_key=True)
    key, schema = value.get("key"), value.get("schema")
    if isinstance(key, str) and value.get("format") == "raw":
        ck.report((*path, "key"), "format: raw has the message key as its column key; "
                  "remove 'key' (it applies to format: json)", at_key=True)
    elif isinstance(key, str) and isinstance(schema, dict) and key not in schema:
        ck.report((*path, "key"), f"key {key!r} is not a column of the source's schema "
                  f"({', '.join(map(str, schema)) or 'none'}); name the column the message "
                  "key holds")


#: The rules between a source's keys, by type: run on the raw mapping of a source whose type
#: is valid, whatever else is wrong with it.
RULES: dict[str, list[Rule]] = {
    "datagen": [_watermark_needs_event_time, _datagen_rules],
    "files": [_watermark_needs_event_time, _files_rules],
    "kafka": [_watermark_needs_event_time, exactly_one(("topic", "topics"), "a kafka source"),
              _kafka_rules],
}
