"""Per-epoch metrics and how they are shown: a live rich table, JSON lines, or nothing."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Protocol

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from streamer.text import plural


@dataclass
class EpochMetrics:
    """What one epoch did. Times in milliseconds since the epoch start or as durations."""

    epoch: int
    started_at: float
    duration_ms: float
    #: Per source, the records it read that entered the dataflow (decoded, with an event
    #: time when it has one); per sink, the rows it received (of every kind below).
    records_in: dict[str, int] = field(default_factory=dict)
    records_out: dict[str, int] = field(default_factory=dict)
    #: Per sink, its rows by what they count as: `out` (the dataflow's output),
    #: `dead_letters` (from a source's `on_error`) and `late` (a window's `late:` output);
    #: only the kinds it received. `records_out` is their sum.
    sink_rows: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Bad records sent to an `on_error` sink (undecodable, or without event time).
    dead_letters: int = 0
    #: Late records of windows: sent to a `late:` output, or dropped by a window without one.
    late: int = 0
    #: Records that filter operators removed.
    filtered: int = 0
    #: Per operator id, what the epoch counted of it without a job of its own
    #: (`runtime.job.epoch.operator_counts`): `in`, `out` and `filtered` for a filter, `out`
    #: for a keyed operator, `late` for a window (or join) whose late records are counted.
    operators: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Per source, what is available but not read yet after the epoch (records, or files
    #: for a files source: `Source.lag_unit`), when the source can tell; and per split.
    lag: dict[str, int | None] = field(default_factory=dict)
    split_lag: dict[str, dict[str, int]] = field(default_factory=dict)
    plan_ms: float = 0.0
    run_ms: float = 0.0
    commit_ms: float = 0.0
    #: The job's event-time watermark after the epoch (epoch ms), None without event time.
    watermark: int | None = None
    #: The checkpoint this epoch completed, and how long completing it took (ms).
    checkpoint_id: int | None = None
    checkpoint_ms: float | None = None
    #: The slowest keyed subtask's own work (after its input arrived, before the snapshot),
    #: and the slowest subtask snapshot, inside `run_ms` (ms; None when none ran).
    keyed_ms: float | None = None
    snapshot_ms: float | None = None
    #: Whether the epoch ran in the small-epoch mode (interpreted, no adaptive execution).
    small: bool = False
    #: Keyed operators whose subtasks read the epoch's files themselves (runtime/plan/keyed_plan.py
    #: `direct_plan`), not through a Spark scan and shuffle.
    direct: list[str] = field(default_factory=list)
    #: Sources read, keyed operators run and sinks written as a local epoch
    #: (`runtime.plan.local`: evaluated on the driver, a keyed operator in one plain RDD job).
    local: list[str] = field(default_factory=list)
    #: Keyed operators whose subtasks read their input from the local parquet files Spark
    #: staged for them this epoch (`job.execution.staged_input`).
    staged: list[str] = field(default_factory=list)
    #: Source id -> files Arrow tasks decoded for its keyed stage (`job.execution.
    #: arrow_input`); file -> why one was left to Spark.
    arrow_decoded: dict[str, int] = field(default_factory=dict)
    arrow_refused: dict[str, str] = field(default_factory=dict)
    #: `<sink id> subtask <n>` -> why a keyed task writing a jsonl sink left its remaining
    #: rows to Spark's writer (`connectors.arrow.arrow_json_writer`).
    sink_refused: dict[str, str] = field(default_factory=dict)
    #: Keyed subtasks that ran on another executor than in the epoch before (on a cluster),
    #: subtasks that restored their state, and the slowest restore (ms).
    moves: int = 0
    restores: int = 0
    restore_ms: float = 0.0
    #: The executors that ran keyed subtasks (on a cluster).
    executors: list[str] = field(default_factory=list)

    @property
    def total_in(self) -> int:
        """Records read from all sources."""
        return sum(self.records_in.values())

    @property
    def total_out(self) -> int:
        """Records written to all sinks (dead letters included)."""
        return sum(self.records_out.values())

    @property
    def total_output(self) -> int:
        """Rows the sinks received as the dataflow's output (no dead letters, no late rows)."""
        return sum(kinds.get("out", 0) for kinds in self.sink_rows.values())

    @property
    def total_read(self) -> int:
        """Records the sources read, good or bad: records in plus dead letters."""
        return self.total_in + self.dead_letters

    @property
    def rate(self) -> float:
        """Records in per second of epoch time."""
        return self.total_in / (self.duration_ms / 1000) if self.duration_ms > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-able record (one line of `--json` output)."""
        out = asdict(self)
        out.update(event="epoch", records_in_total=self.total_in,
                   records_out_total=self.total_out, records_read_total=self.total_read,
                   rate=round(self.rate, 1))
        return out


class Reporter(Protocol):
    """Receives job events from the coordinator."""

    def starting(self, info: dict[str, Any]) -> None:
        """The job is claimed and Spark is starting (before the SparkSession exists: this
        can take a minute on a loaded machine)."""

    def started(self, info: dict[str, Any]) -> None:
        """The job is about to run its first epoch."""

    def epoch_started(self, epoch: int) -> None:
        """An epoch began to run."""

    def epoch(self, m: EpochMetrics) -> None:
        """An epoch committed."""

    def message(self, text: str) -> None:
        """Something the user should know (stop requested, resumed, ...)."""

    def checkpoint(self, info: dict[str, Any]) -> None:
        """A checkpoint completed or failed (`status`: completed | failed)."""

    def finished(self, summary: dict[str, Any]) -> None:
        """The job ended (bounded input, stop, or failure)."""


class QuietReporter:
    """Shows nothing (`--quiet`)."""

    def starting(self, info: dict[str, Any]) -> None:
        """Nothing."""

    def started(self, info: dict[str, Any]) -> None:
        """Nothing."""

    def epoch_started(self, epoch: int) -> None:
        """Nothing."""

    def epoch(self, m: EpochMetrics) -> None:
        """Nothing."""

    def message(self, text: str) -> None:
        """Nothing."""

    def checkpoint(self, info: dict[str, Any]) -> None:
        """Nothing."""

    def finished(self, summary: dict[str, Any]) -> None:
        """Nothing."""


class JsonReporter:
    """One JSON object per line on stdout (`--json`), for scripts."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout

    def _emit(self, record: dict[str, Any]) -> None:
        self.stream.write(json.dumps(record, default=str) + "\n")
        self.stream.flush()

    def starting(self, info: dict[str, Any]) -> None:
        """Nothing: scripts learn the job runs from `started` (the events are unchanged)."""

    def started(self, info: dict[str, Any]) -> None:
        """Emit a `started` event."""
        self._emit({"event": "started", **info})

    def epoch_started(self, epoch: int) -> None:
        """Nothing: the `epoch` event carries its start time (`started_at`)."""

    def epoch(self, m: EpochMetrics) -> None:
        """Emit an `epoch` event."""
        self._emit(m.to_json())

    def message(self, text: str) -> None:
        """Emit a `message` event."""
        self._emit({"event": "message", "text": text})

    def checkpoint(self, info: dict[str, Any]) -> None:
        """Emit a `checkpoint` event."""
        self._emit({"event": "checkpoint", **info})

    def finished(self, summary: dict[str, Any]) -> None:
        """Emit a `finished` event."""
        self._emit({"event": "finished", **summary})


class TeeReporter:
    """Hands every report to several reporters (the display and the Prometheus exporter)."""

    def __init__(self, *reporters: Reporter) -> None:
        self.reporters = reporters

    def starting(self, info: dict[str, Any]) -> None:
        """Pass it on."""
        for r in self.reporters:
            r.starting(info)

    def started(self, info: dict[str, Any]) -> None:
        """Pass it on."""
        for r in self.reporters:
            r.started(info)

    def epoch_started(self, epoch: int) -> None:
        """Pass it on."""
        for r in self.reporters:
            r.epoch_started(epoch)

    def epoch(self, m: EpochMetrics) -> None:
        """Pass it on."""
        for r in self.reporters:
            r.epoch(m)

    def message(self, text: str) -> None:
        """Pass it on."""
        for r in self.reporters:
            r.message(text)

    def checkpoint(self, info: dict[str, Any]) -> None:
        """Pass it on."""
        for r in self.reporters:
            r.checkpoint(info)

    def finished(self, summary: dict[str, Any]) -> None:
        """Pass it on."""
        for r in self.reporters:
            r.finished(summary)


def _num(n: float) -> str:
    return f"{n:,.0f}"


def watermark_time(ms: int | None) -> str:
    """A watermark for people: ISO UTC, or -/+inf at the ends."""
    import datetime as dt

    if ms is None or ms <= -(2**61):
        return "-"
    if ms >= 2**61:
        return "+inf"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _seconds(s: float) -> str:
    """An elapsed time for the display: `4.2s`, `1m 05s`, `2h 03m`."""
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m {int(s % 60):02d}s"
    return f"{int(s // 3600)}h {int(s % 3600 // 60):02d}m"


class LiveReporter:
    """The default display: what the job is doing now, with a spinner and a clock that
    ticks; a table of the recent epochs, with each sink's output apart from the dead
    letters, late and filtered records; and the totals.

    It is a rich `Live` over this object's `__rich__`, refreshed by rich's own thread
    (`auto_refresh`), so the clock moves while Spark starts and while an epoch runs, not
    only when one ends. The CLI enters it before it imports pyspark (`with LiveReporter()`),
    so "starting Spark" shows from the first second.
    """

    KEEP = 8
    #: Columns of counts that follow the sinks' columns, with the epoch's attribute each shows.
    COUNTS = (("filtered", "filtered"), ("late", "late"), ("dead letters", "dead_letters"))

    def __init__(self, console: Console | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console or Console(stderr=True)
        self.clock = clock
        self.lock = threading.RLock()
        self.recent: list[EpochMetrics] = []
        self.totals = {"in": 0, "out": 0, "filtered": 0, "late": 0, "dead_letters": 0,
                       "epochs": 0, "checkpoints": 0}
        self.started_at = clock()
        self.header = Text("")
        #: The sinks that get a column: those with an input in the dataflow (a sink fed only
        #: dead letters or late rows has none), then any other that received output.
        self.sinks: list[str] = []
        #: What the job is doing now and since when (None once it ended).
        self.phase: str | None = "starting Spark…"
        self.phase_at = self.started_at
        self.last_checkpoint = ""
        self.live: Live | None = None
        self.spinner = Spinner("dots", style="cyan")

    # ------------------------------------------------------------------ rendering
    def render(self, now: float | None = None) -> Group:
        """The display at `now` (the clock's time): header, status, table, totals."""
        now = self.clock() if now is None else now
        with self.lock:
            parts: list[RenderableType] = []
            if self.header.plain:
                parts.append(self.header)
            if self.phase is not None:
                status = Text.assemble((self.phase, "bold"),
                                       (f"  {_seconds(now - self.phase_at)}", "cyan"))
                self.spinner.update(text=status)
                parts.append(self.spinner)
            if self.recent:
                parts.append(self.table())
            if self.header.plain or self.recent:
                parts.append(self.footer(now))
            if self.last_checkpoint:
                parts.append(Text(self.last_checkpoint, style="dim"))
            return Group(*parts)

    def __rich__(self) -> Group:
        """What rich's Live shows at each refresh: the display at this moment."""
        return self.render()

    def table(self) -> Table:
        """The recent epochs: records in, each sink's output, what was filtered, late or
        sent to dead letters, the rate, the epoch's duration, the lag and the watermark."""
        table = Table(box=None, header_style="bold", pad_edge=False)
        sinks = self.sinks + sorted({s for m in self.recent for s, k in m.sink_rows.items()
                                     if k.get("out") and s not in self.sinks})
        for col in ("epoch", "in", *(f"→ {s}" for s in sinks),
                    *(name for name, _ in self.COUNTS), "rate/s", "epoch ms", "lag",
                    "watermark"):
            table.add_column(col, justify="right", no_wrap=True)
        for m in self.recent[-self.KEEP:]:
            lag = ", ".join(f"{k}={v:,}" for k, v in m.lag.items() if v is not None) or "-"
            table.add_row(str(m.epoch), _num(m.total_in),
                          *(_num(m.sink_rows.get(s, {}).get("out", 0)) for s in sinks),
                          *(_num(getattr(m, attr)) for _, attr in self.COUNTS),
                          _num(m.rate), _num(m.duration_ms), lag, watermark_time(m.watermark))
        return table

    def footer(self, now: float) -> Text:
        """The totals since the display started, with the time since then."""
        t = self.totals
        return Text(" · ".join([
            plural(t["epochs"], "epoch"), f"{t['in']:,} in", f"{t['out']:,} out",
            f"{t['filtered']:,} filtered", f"{t['late']:,} late",
            plural(t["dead_letters"], "dead letter"),
            *([plural(t["checkpoints"], "checkpoint")] if t["checkpoints"] else []),
            _seconds(now - self.started_at)]), style="dim")

    def _phase(self, text: str | None) -> None:
        with self.lock:
            self.phase = text
            self.phase_at = self.clock()

    # ------------------------------------------------------------------ the live display
    def __enter__(self) -> LiveReporter:
        """Start the display: it shows "starting Spark…" and its clock from now on."""
        # Output on stdout (a console sink) goes above the display when both share the
        # terminal; when stdout is redirected it stays there.
        self.live = Live(self, console=self.console, auto_refresh=True,
                         refresh_per_second=4, transient=False,
                         redirect_stdout=sys.stdout.isatty())
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the display (after `finished`, or when the run failed before it began)."""
        self.stop()

    def stop(self) -> None:
        """Show the last state and stop refreshing."""
        if self.live is None:
            return
        live, self.live = self.live, None
        live.stop()
        if not self.console.is_terminal:  # a redirected Live leaves no final newline
            self.console.line()

    # ------------------------------------------------------------------ the Reporter side
    def starting(self, info: dict[str, Any]) -> None:
        """Spark is starting (the display says so from the time the CLI entered it)."""
        if self.live is None:
            self.__enter__()

    def started(self, info: dict[str, Any]) -> None:
        """Show the job header; the sinks with an input get a column each."""
        with self.lock:
            self.header = Text.assemble(
                ("▶ ", "green"), (str(info.get("job")), "bold"),
                f"  master {info.get('master')}  ",
                (f"Spark UI {info['ui']}" if info.get("ui") else "", "cyan"),
                (f"  metrics {info['metrics']}" if info.get("metrics") else "", "cyan"))
            self.sinks = list(info.get("outputs") or [])
        self._phase("preparing the first epoch…")
        if self.live is None:
            self.__enter__()

    def epoch_started(self, epoch: int) -> None:
        """An epoch runs: the status line shows it and how long it has been running."""
        self._phase(f"epoch {epoch} running")

    def epoch(self, m: EpochMetrics) -> None:
        """Add an epoch to the table and the totals."""
        with self.lock:
            self.recent = [*self.recent, m][-self.KEEP:]
            t = self.totals
            t["in"] += m.total_in
            t["out"] += m.total_output
            t["filtered"] += m.filtered
            t["late"] += m.late
            t["dead_letters"] += m.dead_letters
            t["epochs"] += 1
        self._phase(f"waiting for epoch {m.epoch + 1}")

    def message(self, text: str) -> None:
        """Print a line above the live display."""
        self.console.print(text)

    def checkpoint(self, info: dict[str, Any]) -> None:
        """Show the latest checkpoint under the table; a failed one as a line above it."""
        if info.get("status") == "completed":
            with self.lock:
                self.totals["checkpoints"] += 1
                self.last_checkpoint = (
                    f"checkpoint {info['id']} at epoch {info['epoch']} · "
                    f"{info['duration_ms']:,.0f} ms · {info['uploaded_bytes']:,} B uploaded "
                    f"of {info['state_size']:,} B state")
        else:
            self.console.print(Text(f"checkpoint {info.get('id')} failed: "
                                    f"{info.get('reason')}", style="yellow"))

    def finished(self, summary: dict[str, Any]) -> None:
        """Stop the live display and print how the job ended."""
        self._phase(None)
        self.stop()
        style = "green" if summary.get("status") in ("finished", "stopped") else "red"
        self.console.print(Text(f"{summary.get('status')}: {summary.get('reason', '')}",
                                style=style))
