"""The pipeline file, version 1, as one pydantic v2 model (`PipelineModel`): every key, its
type and default, and the rules between keys.

This is the single description from which `streamer validate` checks files and `streamer
schema` (and the docs reference) renders JSON Schema. Each block is a model of its own
(`pipeline/*_model.py`); `pipeline/pydantic_bridge.py` turns pydantic's errors into the file's
messages. The rules between keys are functions over the raw mapping, run after pydantic
(`check_pipeline`). Cross-references (inputs, on_error, cycles) are checked in
`pipeline/validate.py`, and expressions against schemas in `runtime/analyze.py` (it needs Spark).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, TypeAlias

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from streamer.pipeline.cases_model import TestCaseModel
from streamer.pipeline.checker import Checker, Rule
from streamer.pipeline.job_model import JobModel
from streamer.pipeline.operator_model import RULES as OPERATOR_RULES
from streamer.pipeline.operator_model import OperatorModel
from streamer.pipeline.pydantic_bridge import check_model, check_rules, model_schema
from streamer.pipeline.sink_model import RULES as SINK_RULES
from streamer.pipeline.sink_model import Sink
from streamer.pipeline.source_model import RULES as SOURCE_RULES
from streamer.pipeline.source_model import Source
from streamer.pipeline.storage_model import StorageOptionsModel
from streamer.pipeline.yaml_loader import Path
from streamer.pipeline.yaml_model import Settings, Text, YamlModel, text

if TYPE_CHECKING:  # what it validates to; pydantic reads the type below
    JobName: TypeAlias = str
else:
    JobName = text(pattern=r"[a-z0-9][a-z0-9-]*",
                   hint="lowercase letters, digits and dashes, e.g. 'clicks-per-user'")


class PipelineModel(YamlModel):
    """A streamer pipeline, version 1."""

    name: JobName = Field(description="Job name.")
    description: str = Field(
        default="", description="What the job does, for people reading the file.")
    storage: Text | SkipJsonSchema[None] = Field(
        default=None, description="fsspec URL for the job registry, checkpoints and savepoints "
        "(default $STREAMER_STORAGE, else ./.streamer).")
    storage_options: StorageOptionsModel | SkipJsonSchema[None] = Field(default=None)
    job: JobModel = Field(default_factory=JobModel)
    spark: Settings | SkipJsonSchema[None] = Field(
        default=None, description="Spark configuration, passed through as-is.")
    sources: list[Annotated[Source, Field(description="A source of records.")]] = Field(
        min_length=1, description="Where records come from.")
    operators: list[OperatorModel] = Field(
        default_factory=list, description="Transformations, in any order.")
    sinks: list[Annotated[Sink, Field(description="Where results go.")]] = Field(
        min_length=1, description="Where results go.")
    tests: list[TestCaseModel] = Field(
        default_factory=list, description="Smoke tests for `streamer test`.")

    @classmethod
    def called(cls, value: Any, path: Path) -> str | None:
        """Messages name the file's top level `the pipeline`."""
        return "the pipeline"


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


#: The rules of each list's items (by the item's `type:`, "" for any), with the item's type.
_ITEM_RULES: dict[str, tuple[Any, dict[str, list[Rule]]]] = {
    "sources": (Source, SOURCE_RULES),
    "operators": (OperatorModel, OPERATOR_RULES),
    "sinks": (Sink, SINK_RULES),
}


def check_pipeline(data: dict[str, Any], ck: Checker) -> PipelineModel | None:
    """Report every problem of the file's structure: pydantic's, in the file's words, then
    every broken rule between keys (of each source, operator and sink, and the file's). The
    validated model, or None when pydantic found a problem."""
    model = check_model(PipelineModel, data, (), ck)
    for key, (annotation, rules) in _ITEM_RULES.items():
        items = data.get(key)
        for i, item in enumerate(items if isinstance(items, list) else []):
            check_rules(annotation, rules, item, (key, i), ck)
    _storage_options_need_s3(data, (), ck)
    return model if isinstance(model, PipelineModel) else None


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the pipeline file, for editors (`streamer schema`)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://streamer.dev/schema/pipeline-v1.json",
        "title": "streamer pipeline",
        **model_schema(PipelineModel),
    }
