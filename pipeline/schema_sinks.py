"""The sinks of the pipeline file's model: their keys, types and rules (`SINK`, tagged by
`type`). Part of `schema.py`'s model, kept apart for its size."""

from __future__ import annotations

from typing import Any

from streamer.pipeline.model import (
    Bool,
    Checker,
    Field,
    Int,
    MapOf,
    Obj,
    OneOrList,
    Scalar,
    Str,
    Tagged,
)
from streamer.pipeline.schema_base import COLUMN_HINT, COLUMN_PATTERN, ID, REF, named
from streamer.pipeline.yaml_loader import Path

SINK_COMMON: dict[str, Field] = {
    "id": Field(ID, required=True),
    "input": Field(OneOrList(REF, "One id or a list of ids. A sink used only as on_error "
                             "or late output needs none.")),
}


def _sink(fields: dict[str, Field], doc: str) -> Obj:
    return Obj({**SINK_COMMON, **fields}, description=doc, what=named("sink", "sinks"),
               extra_keys=("type",))


COLUMNS = OneOrList(Str("A column of the sink's input.", pattern=COLUMN_PATTERN,
                        pattern_hint=COLUMN_HINT), "One column or a list of columns.",
                    noun="column")
DELTA_SINK = _sink(
    {
        "path": Field(Str("Local path or URL (s3://, gs://, az://, abfss://, file://) of the "
                          "Delta table; created by the first commit."), required=True),
        "mode": Field(Str("append (default): add each epoch's rows; merge: upsert them by "
                          "`key` (for `emit: updates` and rolling aggregates).",
                          enum=("append", "merge"))),
        "key": Field(COLUMNS),
        "partition_by": Field(COLUMNS),
        "storage_options": Field(MapOf(Scalar(), "Passed to delta-rs's object store as-is "
                                       "(credentials, endpoint, region, ...).")),
    },
    "A Delta Lake table, committed by delta-rs once per epoch; exactly once with the epoch "
    "recorded in the same commit.",
)


def _delta_sink_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
    mode = value.get("mode", "append")
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


DELTA_SINK.rules.append(_delta_sink_rules)


PG_NAME = r"[A-Za-z_][A-Za-z0-9_$]*"
POSTGRES_SINK = _sink(
    {
        "dsn": Field(Str("libpq connection string or URI, e.g. 'host=db.example port=5432 "
                         "dbname=analytics user=streamer' or 'postgresql://streamer@db/"
                         "analytics'; unset parts come from the PG* environment variables."),
                     required=True),
        "password_env": Field(Str("The environment variable holding the password (or set "
                                  "PGPASSWORD, or use ~/.pgpass).", pattern=r"[A-Za-z_]\w*",
                                  pattern_hint="an environment variable's name")),
        "table": Field(Str("The table, `name` or `schema.name` (case-sensitive, as written).",
                           pattern=rf"({PG_NAME}\.)?{PG_NAME}",
                           pattern_hint="a table name, optionally schema-qualified, e.g. "
                           "'clicks' or 'analytics.clicks'"), required=True),
        "mode": Field(Str("append (default): insert every row; upsert: insert or update the "
                          "row of each key.", enum=("append", "upsert"))),
        "key": Field(OneOrList(Str(pattern=COLUMN_PATTERN, pattern_hint=COLUMN_HINT),
                               "upsert only: the columns that identify a row.",
                               noun="column")),
        "create_table": Field(Bool("Create the table from the input's columns when it does "
                                   "not exist (default true).")),
    },
    "A PostgreSQL table, appended to or upserted by key; exactly once in exactly_once mode.",
)


def _postgres_sink_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
    upsert = value.get("mode") == "upsert"
    if upsert and "key" not in value:
        ck.report((*path, "mode"), f"{named('sink', 'sinks')(value, path)} has mode: upsert "
                  "but no key; add key: [columns that identify a row]", at_key=True)
    if "key" in value and not upsert:
        ck.report((*path, "key"), f"{named('sink', 'sinks')(value, path)} has a key, which "
                  "only mode: upsert uses; add mode: upsert, or remove key", at_key=True)


POSTGRES_SINK.rules.append(_postgres_sink_rules)

SINK = Tagged(
    {
        "console": _sink({"max_rows": Field(Int("Rows printed per epoch (default 20).",
                                                minimum=1))},
                         "Prints committed rows as a table."),
        "delta": DELTA_SINK,
        "files": _sink({"path": Field(Str("fsspec URL of the output directory."),
                                      required=True),
                        "format": Field(Str("File format.", enum=("jsonl", "csv", "parquet")),
                                        required=True)},
                       "Files that become visible only when their epoch commits."),
        "kafka": _sink({"bootstrap_servers": Field(Str("host:port[,host:port]"),
                                                   required=True),
                        "topic": Field(Str("Topic to write."), required=True),
                        "format": Field(Str("Value format: one JSON object per row "
                                            "(default json).", enum=("json",))),
                        "key": Field(Str("Column used as the record key.")),
                        "properties": Field(MapOf(Scalar(), "Passed to the Kafka producer "
                                                  "as-is."))},
                       "A Kafka topic; transactional in exactly_once mode."),
        "postgres": POSTGRES_SINK,
    },
    what=named("sink", "sinks"), description="Where results go.",
)

