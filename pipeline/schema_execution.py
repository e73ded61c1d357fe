"""The `job.execution:` block of the pipeline file's model: engine settings (how epochs run,
not what they compute). Part of `schema.py`'s model, kept apart for its size."""

from __future__ import annotations

from streamer.pipeline.model import Bool, Field, Int, Obj

EXECUTION = Obj(
    {
        "small_epoch_rows": Field(Int(
            "Epochs with at most this many input rows run in the small-epoch mode: "
            "interpreted Spark expressions (no code generation), no adaptive execution, one "
            "shuffle partition, and keyed records routed to their subtask before they are "
            "aggregated. Default 20000; 0 turns the mode off. $STREAMER_SMALL_EPOCH_ROWS "
            "overrides it.", minimum=0,
            hint="set a number of rows, or 0 to turn the small-epoch mode off")),
        "local_rows": Field(Int(
            "A source slice of at most this many rows (over all its splits) is read on the "
            "driver as a local relation, and its epoch runs without Spark jobs where it can "
            "(a local epoch). Default 1000; 0 = never. $STREAMER_LOCAL_ROWS overrides it.",
            minimum=0, hint="set a number of rows, or 0 to never read a slice on the driver")),
        "direct_read": Field(Bool(
            "Keyed subtasks (rolling aggregates, tumbling and sliding windows) read a local "
            "parquet files source themselves, and take a local epoch's rows collected on the "
            "driver; false leaves both to Spark. Default true. $STREAMER_DIRECT_READ "
            "overrides it.")),
        "driver_subtasks": Field(Bool(
            "In local mode (local[*]) a local epoch runs the keyed subtasks in the driver "
            "process, one after the other, instead of as a Spark job; false always runs a "
            "Spark job. No effect on a cluster. Default true. $STREAMER_DRIVER_SUBTASKS "
            "overrides it.")),
        "task_sink": Field(Bool(
            "A keyed operator's tasks write the staging files of a local parquet or jsonl "
            "files sink that reads only that operator (with pyarrow, in the bytes Spark's "
            "writer gives; jsonl rows they cannot be sure of go to Spark's writer); false has "
            "Spark write them. "
            "Default true. $STREAMER_TASK_SINK overrides it.")),
        "staged_input": Field(Bool(
            "In local mode, a rolling aggregate, a tumbling, sliding or session window or a "
            "dedupe whose input Spark computes (a JSON, CSV or Kafka source, or a filter or "
            "derived column before it) has Spark write that input once per epoch as local "
            "parquet files, which its subtasks read themselves, in place of Spark's partial "
            "aggregation and shuffles. Small epochs keep the Spark path. No effect on a "
            "cluster. Default true. $STREAMER_STAGED_INPUT overrides it.")),
        "arrow_input": Field(Bool(
            "Where such staged input comes from local JSON-lines, CSV or parquet files or Kafka "
            "JSON values, Python tasks read and decode them with Arrow and run the event time "
            "and the filters and derived columns before the keyed operator, for the files, "
            "ranges and expressions where Arrow's result is certainly Spark's (any other is "
            "read by Spark as before, in the same epoch). Default true. "
            "$STREAMER_ARROW_INPUT overrides it.")),
    },
    "Engine settings: how epochs run, not what they compute (results are the same either "
    "way). The environment variables named here override them for one run.",
)
