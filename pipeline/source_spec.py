"""The frozen spec of a source (`SourceSpec`) and its watermark; `pipeline.spec` builds them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streamer.pipeline.yaml_loader import Path


@dataclass(frozen=True)
class WatermarkSpec:
    """Bounded out-of-orderness watermark of a source (its defaults are the model's,
    `source_model.WatermarkModel`)."""

    max_out_of_orderness_ms: int
    idle_timeout_ms: int | None


@dataclass(frozen=True)
class SourceSpec:
    """A source: common keys plus the type-specific ones in `options`."""

    id: str
    type: str
    uid: str
    schema: tuple[tuple[str, str], ...] | None
    event_time: str | None
    watermark: WatermarkSpec | None
    on_error: str | None
    options: Mapping[str, Any]
    path: Path

    def option(self, name: str, default: Any = None) -> Any:
        """A type-specific setting, or `default`."""
        return self.options.get(name, default)
