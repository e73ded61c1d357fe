"""`KeyedConfig`: everything a keyed task needs (operators/keyed.py), as plain picklable data
shipped to its Spark task every epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamer.pipeline.spec import AggregateSpec


@dataclass(frozen=True)
class KeyedConfig:
    """Everything a task needs, as plain picklable data."""

    uid: str
    kind: str  # window | aggregate | dedupe | process | join
    keys: tuple[str, ...]
    aggregates: tuple[AggregateSpec, ...]
    window_kind: str | None
    size_ms: int | None
    slide_ms: int | None
    gap_ms: int | None
    count: int | None
    lateness_ms: int
    emit: str
    domain: str  # event | processing
    dedupe_ms: int | None
    record_columns: tuple[str, ...]  # dedupe: the forwarded record's columns
    out_schema: Any  # pyarrow.Schema of the output batches
    backend: str
    state_root: str
    job: str
    parallelism: int
    max_parallelism: int
    epoch: int
    #: Timers at or before this time fire this epoch (watermark, or wall clock).
    fire_up_to: int
    #: The end of input (or a drain) in this epoch: after its records, the task fires every
    #: timer up to this too, in a second pass without records (`keyed.run_task`).
    flush_to: int | None = None
    #: process only: the user's KeyedProcessFunction subclass, and the wall clock.
    fn_class: Any = None
    now_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: Checkpoint restore/snapshot instructions (`checkpoint.task.TaskCheckpointing`).
    checkpointing: Any = None
    #: On a cluster: keep working state per executor (`operators/executor.py`).
    executor_scoped: bool = False
    #: A small epoch: keep the subtask's state open in the worker for the next task
    #: (`KeyedStateBackend.park`). A big epoch on the Spark path closes it, as its open costs
    #: little next to it; direct-read epochs always park (`KeyedStage.run_direct`).
    park: bool = False
    #: The keyed stage reads this epoch's files itself (`operators.direct.DirectRead`).
    direct: Any = None
    #: Rolling aggregates read by a keyed operator: before a key's new value, emit the
    #: value it had as a `RETRACT` row (`columns.CHANGE`), so the reader takes it back.
    changelog: bool = False
    #: join only: the `JoinSpec`, and its output columns (`operators.join.JoinColumns`).
    join: Any = None
    join_columns: Any = None
    #: The operator's spec (`pipeline.spec.OperatorSpec`), whose settings a kind reads.
    op: Any = None


def window_settings(window: Any) -> dict[str, Any]:
    """The `KeyedConfig` fields an operator's `window:` (a `WindowSpec`, or None for a kind
    without one) sets: the planner's and the test harness's configs take them from here."""
    return {
        "window_kind": window.kind if window else None,
        "size_ms": window.size_ms if window else None,
        "slide_ms": (window.slide_ms or window.size_ms) if window else None,
        "gap_ms": window.gap_ms if window else None,
        "count": window.count if window else None,
        "lateness_ms": window.allowed_lateness_ms if window else 0,
        "emit": window.emit if window else "updates",
    }
