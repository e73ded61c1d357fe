"""The `sinks:` block of the pipeline file as pydantic v2 models (issue 38, item 3): one model
per sink type, a discriminated union on `type` (`Sink`), `extra="forbid"`, and each default
written once (the connectors read it from `SinkSpec.options`). The rules between keys are
functions over the raw mapping, run beside pydantic (`RULES`), so that a sink with a wrong
type and a broken rule gets both messages in one run (docs/decisions/pydantic.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeAlias

from pydantic import Discriminator, Field, Tag
from pydantic.json_schema import SkipJsonSchema

from streamer.pipeline.checker import Checker, Rule
from streamer.pipeline.schema_base import COLUMN_HINT, COLUMN_PATTERN, named
from streamer.pipeline.yaml_loader import Path
from streamer.pipeline.yaml_model import (
    Id,
    Ref,
    Settings,
    Text,
    YamlModel,
    one_or_list,
    text,
    type_of,
)

PG_NAME = r"[A-Za-z_][A-Za-z0-9_$]*"
if TYPE_CHECKING:  # what they validate to; pydantic reads the types below
    EnvName: TypeAlias = str
    PgTable: TypeAlias = str
    Ids: TypeAlias = str | list[str]
    Columns: TypeAlias = str | list[str]
    PgColumns: TypeAlias = str | list[str]
else:
    Ids = one_or_list(Ref, "id")
    Columns = one_or_list(text("A column of the sink's input.", COLUMN_PATTERN, COLUMN_HINT),
                          "column")
    PgColumns = one_or_list(text(pattern=COLUMN_PATTERN, hint=COLUMN_HINT), "column")
    EnvName = text(pattern=r"[A-Za-z_]\w*", hint="an environment variable's name")
    PgTable = text(pattern=rf"({PG_NAME}\.)?{PG_NAME}", hint="a table name, optionally "
                   "schema-qualified, e.g. 'clicks' or 'analytics.clicks'")


class SinkModel(YamlModel):
    """What every sink has: its type, id and input."""

    #: How messages name a sink: `sink 'out'` by its id, else `sinks[2]`.
    noun: ClassVar[tuple[str, str]] = ("sink", "sinks")

    type: str
    id: Id
    input: Ids | SkipJsonSchema[None] = Field(
        default=None, description="One id or a list of ids. A sink used only as on_error "
        "or late output needs none.")


class ConsoleSink(SinkModel):
    """Prints committed rows as a table."""

    type: Literal["console"]
    max_rows: Annotated[int, Field(ge=1)] = Field(default=20,
                                                  description="Rows printed per epoch.")


class DeltaSink(SinkModel):
    """A Delta Lake table, committed by delta-rs once per epoch; exactly once with the epoch
    recorded in the same commit."""

    type: Literal["delta"]
    path: Text = Field(description="Local path or URL (s3://, gs://, az://, abfss://, "
                       "file://) of the Delta table; created by the first commit.")
    mode: Literal["append", "merge"] = Field(
        default="append", description="append: add each epoch's rows; merge: upsert them "
        "by `key` (for `emit: updates` and rolling aggregates).")
    key: Columns | SkipJsonSchema[None] = Field(
        default=None, description="One column or a list of columns.")
    partition_by: Columns | SkipJsonSchema[None] = Field(
        default=None, description="One column or a list of columns.")
    storage_options: Settings | SkipJsonSchema[None] = Field(
        default=None, description="Passed to delta-rs's object store as-is (credentials, "
        "endpoint, region, ...).")


class FilesSink(SinkModel):
    """Files that become visible only when their epoch commits."""

    type: Literal["files"]
    path: Text = Field(description="fsspec URL of the output directory.")
    format: Literal["jsonl", "csv", "parquet"] = Field(description="File format.")


class KafkaSink(SinkModel):
    """A Kafka topic; transactional in exactly_once mode."""

    type: Literal["kafka"]
    bootstrap_servers: Text = Field(description="host:port[,host:port]")
    topic: Text = Field(description="Topic to write.")
    format: Literal["json"] = Field(default="json", description="Value format: one JSON "
                                    "object per row.")
    key: Text | SkipJsonSchema[None] = Field(default=None,
                                             description="Column used as the record key.")
    properties: Settings | SkipJsonSchema[None] = Field(
        default=None, description="Passed to the Kafka producer as-is.")


class PostgresSink(SinkModel):
    """A PostgreSQL table, appended to or upserted by key; exactly once in exactly_once
    mode."""

    type: Literal["postgres"]
    dsn: Text = Field(description="libpq connection string or URI, e.g. 'host=db.example "
                      "port=5432 dbname=analytics user=streamer' or 'postgresql://streamer@db/"
                      "analytics'; unset parts come from the PG* environment variables.")
    password_env: EnvName | SkipJsonSchema[None] = Field(
        default=None, description="The environment variable holding the password (or set "
        "PGPASSWORD, or use ~/.pgpass).")
    table: PgTable = Field(description="The table, `name` or `schema.name` (case-sensitive, "
                           "as written).")
    mode: Literal["append", "upsert"] = Field(
        default="append", description="append: insert every row; upsert: insert or update "
        "the row of each key.")
    key: PgColumns | SkipJsonSchema[None] = Field(
        default=None, description="upsert only: the columns that identify a row.")
    create_table: bool = Field(default=True, description="Create the table from the input's "
                               "columns when it does not exist.")


#: A sink of the pipeline file, by its `type:`.
Sink = Annotated[Annotated[ConsoleSink, Tag("console")] | Annotated[DeltaSink, Tag("delta")]
                 | Annotated[FilesSink, Tag("files")] | Annotated[KafkaSink, Tag("kafka")]
                 | Annotated[PostgresSink, Tag("postgres")], Discriminator(type_of)]


def sink_options(sink: SinkModel) -> dict[str, Any]:
    """A validated sink's settings beyond type, id and input, each default filled in from
    its model (`SinkSpec.options`); a setting that is not set (None) is left out."""
    return dict(sink.model_dump(exclude={"type", "id", "input"}, exclude_none=True))


def _delta_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
    mode = value.get("mode", DeltaSink.model_fields["mode"].default)
    if mode == "merge" and "key" not in value:
        ck.report((*path, "mode"), "mode: merge upserts rows by key; add key: [<columns>] "
                  "that identify a row (e.g. the key_by columns, and window_start for "
                  "windows)")
    if mode != "merge" and "key" in value:
        ck.report((*path, "key"), "'key' applies only to mode: merge; add mode: merge, or "
                  "remove 'key'", at_key=True)
    for name in ("key", "partition_by"):
        columns = value.get(name)
        if isinstance(columns, list):
            seen = [c for i, c in enumerate(columns) if c in columns[:i]]
            if seen:
                ck.report((*path, name), f"{name!r} names column {seen[0]!r} twice; "
                          "name each column once")


def _postgres_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
    upsert = value.get("mode") == "upsert"
    what = named(*SinkModel.noun)(value, path)
    if upsert and "key" not in value:
        ck.report((*path, "mode"), f"{what} has mode: upsert but no key; add key: [columns "
                  "that identify a row]", at_key=True)
    if "key" in value and not upsert:
        ck.report((*path, "key"), f"{what} has a key, which only mode: upsert uses; add "
                  "mode: upsert, or remove key", at_key=True)


#: The rules between a sink's keys, by type: run on the raw mapping of a sink whose type is
#: valid, whatever else is wrong with it.
RULES: dict[str, list[Rule]] = {"delta": [_delta_rules], "postgres": [_postgres_rules]}
