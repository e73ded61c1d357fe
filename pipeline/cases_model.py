"""The `tests:` block of the pipeline file as a pydantic v2 model (issue 38, item 3): each case
names the sources it replaces with inline rows and the rows each sink must receive. That a
case's `inputs` name sources and its `expect` sinks is checked with the other references
(`validate.check_references`); `streamer test` runs the cases (`runtime/job/testing.py`)
(docs/decisions/pydantic.md).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, WithJsonSchema

from streamer.pipeline.yaml_loader import Path
from streamer.pipeline.yaml_model import Text, YamlModel

#: One row: column -> value (any YAML value, as the source or sink would hold it).
Row = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "additionalProperties": {}, "description": "One row: column -> value."})]


class TestCaseModel(YamlModel):
    """A smoke test run by `streamer test`."""

    __test__ = False  # not a pytest test class

    name: Text = Field(description="What this case checks.")
    inputs: dict[str, list[Row]] = Field(
        description="Source id -> rows that replace the source.")
    expect: dict[str, list[Row]] = Field(
        description="Sink id -> the rows it must receive, in any order.")

    @classmethod
    def called(cls, value: Any, path: Path) -> str | None:
        """Messages name a case by its name: `test 'smoke'`, else `tests[2]`."""
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            return f"test {value['name']!r}"
        return f"tests[{path[-1]}]"
