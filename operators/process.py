"""Keyed process functions: user Python code with keyed state, timers and side outputs.

A pipeline names a class with `process: "module:Class"`; the module is looked up next to the
pipeline file (then on `sys.path`) and shipped to Spark's workers. Example::

    from streamer.operators.process import KeyedProcessFunction, ValueState

    class LargeAfterSmall(KeyedProcessFunction):
        output_schema = "account string, amount double, alert string"

        def open(self, ctx):
            self.small = ctx.get_state(ValueState("small_seen"))

        def process_element(self, row, ctx):
            if self.small.value() and row["amount"] > 500:
                yield {"account": row["account"], "amount": row["amount"], "alert": "fraud"}
            if row["amount"] < 1:
                self.small.update(True)
                ctx.register_event_timer(ctx.timestamp + 60_000)

        def on_timer(self, timestamp, ctx):
            self.small.clear()
            return []

Per epoch and subtask, timers due at the watermark carried into the epoch fire first (in time
order), then the epoch's records are processed in event-time order per key. State handles
are bound to the key being processed, as in Flink. With a `broadcast:` input, its records of
the epoch go to every subtask's `process_broadcast_element` after the timers and before the
keyed records, in (event time, arrival) order, so every subtask's broadcast state
(`ctx.broadcast_state(MapState(...))`, read-only elsewhere) is the same. Rows are dicts;
outputs are dicts with the columns of `output_schema` (Spark DDL); `ctx.output(name, row)`
sends a row to the side output `name`, which the pipeline maps to a sink with
`side_outputs: {name: sink_id}` (its columns are declared in the class's
`side_output_schemas`).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from streamer.columns import (
    BROADCAST,
    EVENT_TIME,
    EVENT_TIME_MS,
    KEY_GROUP,
    OUT,
    ROW_KIND,
    ROW_META,
    SEQUENCE,
    SIDE,
    SIDE_OUTPUT,
)
from streamer.exceptions import StreamerError
from streamer.operators.contract import (
    EVERY_RECORD,
    KeyedKind,
    Logic,
    Planning,
    records_as_they_are,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructField, StructType

    from streamer.operators.keyed_config import KeyedConfig
    from streamer.pipeline.spec import OperatorSpec


class ProcessFunctionError(StreamerError):
    """Raised when a `process:` class cannot be found or is not a `KeyedProcessFunction`;
    the message names the operator and what to fix."""


@dataclass(frozen=True)
class ValueState:
    """One value per key; `ttl_ms` expires it that long after its last update."""

    name: str
    ttl_ms: int | None = None


@dataclass(frozen=True)
class ListState:
    """A list of values per key."""

    name: str
    ttl_ms: int | None = None


@dataclass(frozen=True)
class MapState:
    """A map per key; user keys are strings."""

    name: str
    ttl_ms: int | None = None


Descriptor = ValueState | ListState | MapState


class KeyedProcessFunction:
    """Base class of user keyed process functions; override what you need."""

    #: Spark DDL of the main output, e.g. "account string, amount double".
    output_schema: ClassVar[str] = ""
    #: Side output name -> Spark DDL of its rows.
    side_output_schemas: ClassVar[dict[str, str]] = {}

    def open(self, ctx: Context) -> None:
        """Called once per task before any record or timer: get state handles here."""

    def process_element(self, row: dict[str, Any], ctx: Context) -> Iterable[dict[str, Any]]:
        """Handle one record of the current key (`ctx.key`); return or yield output rows."""
        return ()

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[dict[str, Any]]:
        """A timer of the current key fired at `timestamp` (ms); return or yield rows."""
        return ()

    def process_broadcast_element(self, row: dict[str, Any], ctx: Context
                                  ) -> Iterable[dict[str, Any]]:
        """Handle one record of the `broadcast:` input; every subtask gets every such record,
        in the same order, and may change `ctx.broadcast_state(...)` here (and only here).
        There is no current key: keyed state and timers are not available. Rows returned
        are emitted by every subtask (one copy each)."""
        return ()


def load_function_class(spec: str, base_dir: str, operator: str) -> type[KeyedProcessFunction]:
    """Import `module:Class`, looking next to the pipeline file first."""
    module_name, _, class_name = spec.partition(":")
    if base_dir and base_dir not in sys.path:
        sys.path.insert(0, base_dir)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        msg = (f"operator {operator!r}: cannot import module {module_name!r} for process "
               f"{spec!r} ({type(exc).__name__}: {exc}); put {module_name}.py next to the "
               "pipeline file or on PYTHONPATH")
        raise ProcessFunctionError(msg) from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        import difflib

        classes = sorted(n for n, v in vars(module).items() if isinstance(v, type)
                         and issubclass(v, KeyedProcessFunction) and v is not KeyedProcessFunction)
        close = difflib.get_close_matches(class_name, classes, n=1)
        hint = (f"did you mean {module_name}:{close[0]}?" if close else
                f"its process functions: {', '.join(classes)}" if classes else
                "it defines no subclass of KeyedProcessFunction")
        msg = (f"operator {operator!r}: module {module_name!r} ({module_file(spec)}) has no "
               f"class {class_name!r}; {hint}")
        raise ProcessFunctionError(msg)
    if not (isinstance(cls, type) and issubclass(cls, KeyedProcessFunction)):
        msg = (f"operator {operator!r}: {spec!r} must name a subclass of "
               "streamer.operators.process.KeyedProcessFunction")
        raise ProcessFunctionError(msg)
    if not cls.output_schema:
        msg = (f"operator {operator!r}: {spec!r} must set output_schema, e.g. "
               "output_schema = \"account string, amount double\"")
        raise ProcessFunctionError(msg)
    return cls


def module_file(spec: str) -> str | None:
    """The file (or package directory) of the module of `module:Class`, once imported."""
    module = sys.modules.get(spec.partition(":")[0])
    path = getattr(module, "__file__", None)
    if not path:
        return None
    if os.path.basename(path) == "__init__.py":
        return os.path.dirname(path)
    return path


class _Handle:
    """A state handle bound to the context's current key."""

    def __init__(self, ctx: Context, descriptor: Descriptor) -> None:
        self.ctx = ctx
        self.name = f"user.{descriptor.name}"
        self.ttl_ms = descriptor.ttl_ms

    def _cell(self) -> tuple[int, bytes, bytes]:
        if self.ctx.in_broadcast:
            msg = (f"keyed state {self.name.removeprefix('user.')!r} is not available in "
                   "process_broadcast_element (no current key); use ctx.broadcast_state")
            raise ProcessFunctionError(msg)
        return self.ctx.key_group, self.ctx.key_bytes, b""

    def _expiry(self) -> int | None:
        return self.ctx.processing_time + self.ttl_ms if self.ttl_ms else None


class ValueHandle(_Handle):
    """`value()`, `update(v)`, `clear()`."""

    def value(self) -> Any:
        """The key's value, or None."""
        return self.ctx.backend.get(self.name, *self._cell(), now_ms=self.ctx.processing_time)

    def update(self, value: Any) -> None:
        """Set the key's value (None clears it)."""
        self.ctx.backend.put(self.name, *self._cell(), value, expires_at_ms=self._expiry())

    def clear(self) -> None:
        """Remove the key's value."""
        self.ctx.backend.delete(self.name, *self._cell())


class ListHandle(_Handle):
    """`get()`, `add(v)`, `update(list)`, `clear()`."""

    def get(self) -> list[Any]:
        """The key's list (empty if none)."""
        return self.ctx.backend.get(self.name, *self._cell(),
                                    now_ms=self.ctx.processing_time) or []

    def add(self, value: Any) -> None:
        """Append to the key's list."""
        self.ctx.backend.append(self.name, *self._cell(), value, expires_at_ms=self._expiry(),
                                now_ms=self.ctx.processing_time)

    def update(self, values: list[Any]) -> None:
        """Replace the key's list."""
        self.ctx.backend.put(self.name, *self._cell(), list(values),
                             expires_at_ms=self._expiry())

    def clear(self) -> None:
        """Remove the key's list."""
        self.ctx.backend.delete(self.name, *self._cell())


class MapHandle(_Handle):
    """`get(k)`, `put(k, v)`, `remove(k)`, `items()`, `clear()`; user keys are strings."""

    def get(self, user_key: str) -> Any:
        """The value under `user_key`, or None."""
        return self.ctx.backend.map_get(self.name, *self._cell(), user_key.encode(),
                                        now_ms=self.ctx.processing_time)

    def put(self, user_key: str, value: Any) -> None:
        """Set `user_key`."""
        self.ctx.backend.map_put(self.name, *self._cell(), user_key.encode(), value,
                                 expires_at_ms=self._expiry())

    def remove(self, user_key: str) -> None:
        """Remove `user_key`."""
        self.ctx.backend.map_delete(self.name, *self._cell(), user_key.encode())

    def items(self) -> list[tuple[str, Any]]:
        """All entries, sorted by user key."""
        return [(k.decode(), v) for k, v in self.ctx.backend.map_items(
            self.name, *self._cell(), now_ms=self.ctx.processing_time)]

    def clear(self) -> None:
        """Remove every entry."""
        self.ctx.backend.map_delete_many(self.name, [(*self._cell(), k.encode())
                                                     for k, _ in self.items()])


class BroadcastMapHandle(MapHandle):
    """Broadcast state: a map every subtask holds a full copy of (`get(k)`, `items()`, and
    in `process_broadcast_element` only: `put(k, v)`, `remove(k)`, `clear()`)."""

    def __init__(self, ctx: Context, descriptor: Descriptor) -> None:
        super().__init__(ctx, descriptor)
        from streamer.state.base import BROADCAST_STATE_PREFIX

        self.name = f"{BROADCAST_STATE_PREFIX}{descriptor.name}"
        self.ttl_ms = None

    def _cell(self) -> tuple[int, bytes, bytes]:
        return self.ctx.backend.key_groups.start, b"", b""

    def _writable(self) -> None:
        if not self.ctx.in_broadcast:
            msg = (f"broadcast state {self.name.partition('.')[2]!r} is read-only in "
                   "process_element and on_timer; change it in process_broadcast_element, "
                   "which every subtask runs alike")
            raise ProcessFunctionError(msg)

    def put(self, user_key: str, value: Any) -> None:
        """Set `user_key` (process_broadcast_element only)."""
        self._writable()
        super().put(user_key, value)

    def remove(self, user_key: str) -> None:
        """Remove `user_key` (process_broadcast_element only)."""
        self._writable()
        super().remove(user_key)

    def clear(self) -> None:
        """Remove every entry (process_broadcast_element only)."""
        self._writable()
        super().clear()


class Context:
    """What a process function sees: the current key and time, state, timers, side outputs."""

    def __init__(self, backend: Any, watermark: int, processing_time: int,
                 side_outputs: dict[str, list[dict[str, Any]]]) -> None:
        self.backend = backend
        self.watermark = watermark
        self.processing_time = processing_time
        self.key: tuple[Any, ...] = ()
        self.key_group = 0
        self.key_bytes = b""
        #: Event time (ms) of the current record or timer.
        self.timestamp: int | None = None
        #: True while `process_broadcast_element` runs (broadcast state is writable).
        self.in_broadcast = False
        self._side = side_outputs

    def get_state(self, descriptor: Descriptor) -> Any:
        """A handle for `descriptor`, bound to whatever key is current when it is used."""
        from streamer.state import StateDescriptor, StateKind

        kind = {ValueState: StateKind.VALUE, ListState: StateKind.LIST,
                MapState: StateKind.MAP}[type(descriptor)]
        self.backend.declare(StateDescriptor(f"user.{descriptor.name}", kind))
        handle = {ValueState: ValueHandle, ListState: ListHandle, MapState: MapHandle}
        return handle[type(descriptor)](self, descriptor)

    def broadcast_state(self, descriptor: MapState) -> BroadcastMapHandle:
        """The broadcast state `descriptor` (a `MapState`, no TTL): the same on every
        subtask; writable only in `process_broadcast_element`."""
        from streamer.state import StateDescriptor, StateKind
        from streamer.state.base import BROADCAST_STATE_PREFIX

        if type(descriptor) is not MapState or descriptor.ttl_ms is not None:
            msg = (f"broadcast state {getattr(descriptor, 'name', descriptor)!r} must be a "
                   "MapState without ttl_ms")
            raise ProcessFunctionError(msg)
        self.backend.declare(StateDescriptor(f"{BROADCAST_STATE_PREFIX}{descriptor.name}",
                                             StateKind.MAP))
        return BroadcastMapHandle(self, descriptor)

    def register_event_timer(self, time_ms: int) -> None:
        """Call `on_timer` for this key once the watermark reaches `time_ms`."""
        self.backend.add_timer("event", self.key_group, int(time_ms), self.key_bytes, b"")

    def register_processing_timer(self, time_ms: int) -> None:
        """Call `on_timer` for this key once the wall clock reaches `time_ms`."""
        self.backend.add_timer("processing", self.key_group, int(time_ms), self.key_bytes, b"")

    def delete_event_timer(self, time_ms: int) -> None:
        """Cancel an event-time timer of this key."""
        self.backend.delete_timer("event", self.key_group, int(time_ms), self.key_bytes, b"")

    def delete_processing_timer(self, time_ms: int) -> None:
        """Cancel a processing-time timer of this key."""
        self.backend.delete_timer("processing", self.key_group, int(time_ms), self.key_bytes,
                                  b"")

    def output(self, name: str, row: dict[str, Any]) -> None:
        """Send `row` to the side output `name`."""
        if name not in self._side:
            msg = f"unknown side output {name!r}; declare it in side_output_schemas"
            raise KeyError(msg)
        self._side[name].append(row)


def run_process(fn_class: type[KeyedProcessFunction], keys: tuple[str, ...],
                record_columns: tuple[str, ...], rows: list[dict[str, Any]], backend: Any,
                fire_event_up_to: int, now_ms: int) -> Iterator[dict[str, Any]]:
    """Run one epoch of a process function for one subtask; yields output rows with
    `__kind` 'out' or 'side' (side rows carry `__side` and the row as JSON in `__meta`)."""
    from streamer.state.codec import decode_key, encode_key

    side: dict[str, list[dict[str, Any]]] = {n: [] for n in fn_class.side_output_schemas}
    ctx = Context(backend, fire_event_up_to, now_ms, side)
    fn = fn_class()
    fn.open(ctx)

    def emit(produced: Iterable[dict[str, Any]] | None, ts: int | None) -> Iterator[dict]:
        for row in produced or ():
            yield {ROW_KIND: OUT, ROW_META: None, SIDE_OUTPUT: None,
                   EVENT_TIME: ts * 1000 if ts is not None else None, **row}
        for name, items in side.items():
            for row in items:
                yield {ROW_KIND: SIDE, SIDE_OUTPUT: name, ROW_META: json.dumps(row, default=str)}
            items.clear()

    timers = sorted([*backend.due_timers("event", fire_event_up_to, remove=True),
                     *backend.due_timers("processing", now_ms, remove=True)])
    for timer in timers:
        ctx.key_group, ctx.key_bytes = timer.key_group, timer.key
        ctx.key, ctx.timestamp = decode_key(timer.key), timer.time_ms
        yield from emit(fn.on_timer(timer.time_ms, ctx), timer.time_ms)
    broadcast = [r for r in rows if r.get(BROADCAST) is not None]
    if broadcast:  # every subtask: the same records in the same order
        rows = [r for r in rows if r.get(BROADCAST) is None]
        broadcast.sort(key=lambda r: (r[EVENT_TIME_MS], r[SEQUENCE]))
        ctx.key, ctx.key_group, ctx.key_bytes, ctx.in_broadcast = (), 0, b"", True
        for row in broadcast:
            ctx.timestamp = row[EVENT_TIME_MS]
            yield from emit(fn.process_broadcast_element(dict(row[BROADCAST]), ctx),
                            row[EVENT_TIME_MS])
        ctx.in_broadcast = False
    rows.sort(key=lambda r: (r[KEY_GROUP], encode_key(tuple(r[k] for k in keys)), r[EVENT_TIME_MS],
                             r[SEQUENCE]))
    for row in rows:
        ctx.key_group = row[KEY_GROUP]
        ctx.key = tuple(row[k] for k in keys)
        ctx.key_bytes = encode_key(ctx.key)
        ctx.timestamp = row[EVENT_TIME_MS]
        record = {c: row[c] for c in record_columns}
        yield from emit(fn.process_element(record, ctx), row[EVENT_TIME_MS])


class ProcessKind(KeyedKind):
    """The user's keyed process function (`process:`): every record, row by row."""

    name = "process"
    capabilities = frozenset({EVERY_RECORD})

    def prepare(self, plan: Planning, df: DataFrame, group: list[Any], epoch: int,
                watermark: int, prerouted: bool) -> tuple[DataFrame, DataFrame | None, Any]:
        """Every record as it is (the function decides what is late)."""
        return records_as_they_are(plan, df, group, epoch, watermark, prerouted)

    def output_fields(self, spark: Any, op: OperatorSpec, input_schema: StructType
                      ) -> list[StructField]:
        """`__side` (a side output's name), the function's declared `output_schema`, and
        `__ts` (the record's or the timer's time)."""
        from pyspark.sql.types import StringType, StructField, StructType, TimestampType

        del spark, input_schema
        assert op.process is not None
        fn = load_function_class(op.process, "", op.id)
        declared = StructType.fromDDL(fn.output_schema)
        assert isinstance(declared, StructType)
        return [StructField(SIDE_OUTPUT, StringType()), *declared.fields,
                StructField(EVENT_TIME, TimestampType())]

    def logic(self, cfg: KeyedConfig) -> Logic:
        """`run_process`, with an error in the user's code told with the user's frames."""
        return _process


def _process(cfg: KeyedConfig, backend: Any, rows: list[dict[str, Any]], out: Any) -> None:
    from streamer.user_errors import user_error

    try:
        out.rows.extend(run_process(cfg.fn_class, cfg.keys, cfg.record_columns, rows,
                                    backend, cfg.fire_up_to, cfg.now_ms))
    except Exception as exc:  # the user's code: told with the user's frames
        fn = cfg.fn_class
        found = user_error(exc, f"operator {cfg.uid!r} ({fn.__module__}:{fn.__name__})")
        if found is None:
            raise
        raise found from exc
