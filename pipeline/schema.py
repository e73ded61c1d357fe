"""The pipeline file, version 1, as a model: every key, its type, and the rules between keys.

This is the single description from which `streamer validate` checks files and `streamer
schema` renders JSON Schema. Cross-references (inputs, on_error, cycles) are checked in
`pipeline/validate.py`, and expressions against schemas in `runtime/analyze.py` (it needs Spark).
"""

from __future__ import annotations

from typing import Any

from streamer.pipeline.cases_model import TestCaseModel
from streamer.pipeline.job_model import JobModel
from streamer.pipeline.model import (
    Checker,
    Field,
    ListOf,
    MapOf,
    Obj,
    Scalar,
    Str,
)
from streamer.pipeline.operator_model import RULES as OPERATOR_RULES
from streamer.pipeline.operator_model import OperatorModel
from streamer.pipeline.pydantic_bridge import ModelNode
from streamer.pipeline.sink_model import RULES as SINK_RULES
from streamer.pipeline.sink_model import Sink
from streamer.pipeline.source_model import RULES as SOURCE_RULES
from streamer.pipeline.source_model import Source
from streamer.pipeline.storage_model import StorageOptionsModel
from streamer.pipeline.yaml_loader import Path

# -------------------------------------------------------------------------------- top level

#: Every block of the file but the top level is a pydantic model (`pipeline/job_model.py`,
#: `pipeline/source_model.py`, `pipeline/operator_model.py`, `pipeline/sink_model.py`,
#: `pipeline/storage_model.py`, `pipeline/cases_model.py`, issue 38).
JOB = ModelNode(JobModel)
OPERATOR = ModelNode(OperatorModel, rules=OPERATOR_RULES)
SOURCE = ModelNode(Source, "A source of records.", rules=SOURCE_RULES)
SINK = ModelNode(Sink, "Where results go.", rules=SINK_RULES)
STORAGE_OPTIONS = ModelNode(StorageOptionsModel)
TEST = ModelNode(TestCaseModel)


def _s3_urls(value: dict[str, Any]) -> bool:
    """Whether the pipeline's storage, or a source's or sink's path, is an `s3://` URL."""
    urls = [value.get("storage")] + [node.get("path") for key in ("sources", "sinks")
                                     for node in (value.get(key) or []) if isinstance(node, dict)]
    return any(isinstance(u, str) and u.startswith(("s3://", "s3a://")) for u in urls)


def _storage_options_need_s3(value: dict[str, Any], path: Path, ck: Checker) -> None:
    if "storage_options" in value and not _s3_urls(value):
        ck.report(("storage_options",), "storage_options applies to s3:// URLs, and neither "
                  "storage: nor any source or sink path is one; remove storage_options or set "
                  "storage: s3://bucket/prefix", at_key=True)


PIPELINE = Obj(
    {
        "name": Field(Str("Job name.", pattern=r"[a-z0-9][a-z0-9-]*",
                          pattern_hint="lowercase letters, digits and dashes, e.g. "
                          "'clicks-per-user'"), required=True),
        "description": Field(Str("What the job does, for people reading the file.",
                                 non_empty=False)),
        "storage": Field(Str("fsspec URL for the job registry, checkpoints and savepoints "
                             "(default $STREAMER_STORAGE, else ./.streamer).")),
        "storage_options": Field(STORAGE_OPTIONS),
        "job": Field(JOB),
        "spark": Field(MapOf(Scalar(), "Spark configuration, passed through as-is.")),
        "sources": Field(ListOf(SOURCE, "Where records come from.", min_items=1),
                         required=True),
        "operators": Field(ListOf(OPERATOR, "Transformations, in any order.")),
        "sinks": Field(ListOf(SINK, "Where results go.", min_items=1), required=True),
        "tests": Field(ListOf(TEST, "Smoke tests for `streamer test`.")),
    },
    "A streamer pipeline, version 1.",
    what=lambda v, p: "the pipeline",
    rules=[_storage_options_need_s3],
)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the pipeline file, for editors (`streamer schema`)."""
    out = PIPELINE.schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://streamer.dev/schema/pipeline-v1.json",
        "title": "streamer pipeline",
        **out,
    }
