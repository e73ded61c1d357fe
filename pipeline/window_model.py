"""An operator's `window:` (and a window join's) as pydantic v2 models (issue 38, item 3):
`WindowModel`, with the sliding and session windows' own mappings, and `JoinWindowModel`, the
tumbling and sliding windows a window join takes. The rules between keys (exactly one kind of
window, a slide no longer than its size) are functions over the raw mapping, run after
pydantic (`window_rules`, `join_window_rules`), as the sources' and sinks' are
(docs/decisions/pydantic.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from streamer.pipeline.checker import Checker
from streamer.pipeline.schema_base import COLUMN_HINT, COLUMN_PATTERN, exactly_one
from streamer.pipeline.units import parse_duration_ms
from streamer.pipeline.yaml_loader import Path
from streamer.pipeline.yaml_model import Duration, DurationOrZero, Text, YamlModel, text

if TYPE_CHECKING:  # what it validates to; pydantic reads the type below
    Column: TypeAlias = str
else:
    Column = text(pattern=COLUMN_PATTERN, hint=COLUMN_HINT)

#: The kinds of window, of which a `window:` has exactly one.
WINDOW_KINDS = ("tumbling", "sliding", "session", "count", "until")
#: The kinds of window a window join takes.
JOIN_WINDOW_KINDS = ("tumbling", "sliding")


class SlidingModel(YamlModel):
    """Overlapping windows of `size`, one starting every `slide`."""

    size: Duration = Field(description="How long each window is.")
    slide: Duration = Field(description="How often a window starts.")


class SessionModel(YamlModel):
    """Per-key windows closed by a gap of inactivity."""

    gap: Duration = Field(description="A key's session closes after this long without a "
                          "record.")


class JoinWindowModel(YamlModel):
    """The window of a window join: records of both sides in the same window and key join
    when the window closes; exactly one of tumbling, sliding."""

    tumbling: Duration | SkipJsonSchema[None] = Field(
        default=None, description="Fixed, non-overlapping windows of this size.")
    sliding: SlidingModel | SkipJsonSchema[None] = None


class WindowModel(JoinWindowModel):
    """A keyed window; exactly one of tumbling, sliding, session, count, until."""

    session: SessionModel | SkipJsonSchema[None] = None
    count: Annotated[int, Field(ge=1)] | SkipJsonSchema[None] = Field(
        default=None, description="A window per key of this many records.")
    until: Column | SkipJsonSchema[None] = Field(
        default=None, description="A window per key closing at this timestamp column's time "
        "(e.g. an auction's expires): emitted once the watermark passes it.")
    time: Literal["event", "processing"] | SkipJsonSchema[None] = Field(
        default=None, description="Event time or processing time (default event when the "
        "input has an event time).")
    allowed_lateness: DurationOrZero = Field(
        default="0s", validate_default=True, description="Keep windows open this long after "
        "the watermark passes their end.")
    late: Text | SkipJsonSchema[None] = Field(
        default=None, description="The id of a sink for records later than watermark + "
        "lateness.")
    emit: Literal["final", "updates"] = Field(
        default="final", description="`final`: once per window; `updates`: also after every "
        "epoch in which it changed.")


def _sliding_rule(value: dict[str, Any], path: Path, ck: Checker) -> None:
    sliding = value.get("sliding")
    if isinstance(sliding, dict):
        size, slide = parse_duration_ms(sliding.get("size")), parse_duration_ms(
            sliding.get("slide"))
        if size and slide and slide > size:
            ck.report((*path, "sliding", "slide"), f"slide ({sliding['slide']}) must not be "
                      f"longer than size ({sliding['size']}), or some records would fall in "
                      "no window")


def window_rules(value: Any, path: Path, ck: Checker) -> None:
    """The rules of an operator's `window:` (a mapping; anything else pydantic reports)."""
    if isinstance(value, dict):
        exactly_one(WINDOW_KINDS, "window")(value, path, ck)
        _sliding_rule(value, path, ck)


def join_window_rules(value: Any, path: Path, ck: Checker) -> None:
    """The rules of a join's `window:`."""
    if isinstance(value, dict):
        exactly_one(JOIN_WINDOW_KINDS, "a join's window")(value, path, ck)
        _sliding_rule(value, path, ck)
