"""Per-epoch metrics and how they are shown: a live rich table, JSON lines, or nothing."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text


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
    #: Bad records sent to an `on_error` sink (undecodable, or without event time).
    dead_letters: int = 0
    #: Late records of windows: sent to a `late:` output, or dropped by a window without one.
    late: int = 0
    #: Records that filter operators removed.
    filtered: int = 0
    #: Per operator id, what the epoch counted of it without a job of its own
    #: (`runtime.epoch.operator_counts`): `in`, `out` and `filtered` for a filter, `out`
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
    #: Keyed operators whose subtasks read the epoch's files themselves (runtime/keyed.py
    #: `direct_plan`), not through a Spark scan and shuffle.
    direct: list[str] = field(default_factory=list)
    #: Sources read, keyed operators run and sinks written as a local epoch
    #: (`runtime.local`: evaluated on the driver, a keyed operator in one plain RDD job).
    local: list[str] = field(default_factory=list)
    #: Keyed operators whose subtasks read their input from the local parquet files Spark
    #: staged for them this epoch (`job.execution.staged_input`).
    staged: list[str] = field(default_factory=list)
    #: Source id -> files Arrow tasks decoded for its keyed stage (`job.execution.
    #: arrow_input`); file -> why one was left to Spark.
    arrow_decoded: dict[str, int] = field(default_factory=dict)
    arrow_refused: dict[str, str] = field(default_factory=dict)
    #: `<sink id> subtask <n>` -> why a keyed task writing a jsonl sink left its remaining
    #: rows to Spark's writer (`connectors.arrow_json_writer`).
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

    def started(self, info: dict[str, Any]) -> None:
        """The job is about to run its first epoch."""

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

    def started(self, info: dict[str, Any]) -> None:
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

    def started(self, info: dict[str, Any]) -> None:
        """Emit a `started` event."""
        self._emit({"event": "started", **info})

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

    def started(self, info: dict[str, Any]) -> None:
        """Pass it on."""
        for r in self.reporters:
            r.started(info)

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


def _time(ms: int | None) -> str:
    """A watermark for people: ISO UTC, or -/+inf at the ends."""
    import datetime as dt

    if ms is None or ms <= -(2**61):
        return "-"
    if ms >= 2**61:
        return "+inf"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")


class LiveReporter:
    """A live table of recent epochs with totals, redrawn in place (the default display)."""

    KEEP = 8

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.recent: list[EpochMetrics] = []
        self.totals = {"in": 0, "out": 0, "dead": 0, "epochs": 0}
        self.started_at = time.monotonic()
        self.header = Text("")
        self.live: Live | None = None
        self.last_checkpoint = ""

    def _render(self) -> Group:
        table = Table(title=None, expand=False, box=None, header_style="bold")
        for col in ("epoch", "in", "out", "dead letters", "rate/s", "epoch ms", "lag",
                    "watermark"):
            table.add_column(col, justify="right")
        for m in self.recent[-self.KEEP:]:
            lag = ", ".join(f"{k}={v:,}" for k, v in m.lag.items() if v is not None) or "-"
            table.add_row(str(m.epoch), _num(m.total_in), _num(m.total_out),
                          _num(m.dead_letters), _num(m.rate), _num(m.duration_ms), lag,
                          _time(m.watermark))
        elapsed = time.monotonic() - self.started_at
        t = self.totals
        footer = Text(f"{t['epochs']} epochs · {t['in']:,} in · {t['out']:,} out · "
                      f"{t['dead']:,} dead letters · {elapsed:,.1f}s", style="dim")
        if self.last_checkpoint:
            return Group(self.header, table, footer, Text(self.last_checkpoint, style="dim"))
        return Group(self.header, table, footer)

    def started(self, info: dict[str, Any]) -> None:
        """Show the job header and start the live display."""
        self.header = Text.assemble(("▶ ", "green"), (str(info.get("job")), "bold"),
                                    f"  master {info.get('master')}  ",
                                    (f"Spark UI {info['ui']}" if info.get("ui") else "", "cyan"),
                                    (f"  metrics {info['metrics']}" if info.get("metrics")
                                     else "", "cyan"))
        self.live = Live(self._render(), console=self.console, refresh_per_second=4,
                         transient=False)
        self.live.start()

    def epoch(self, m: EpochMetrics) -> None:
        """Add an epoch to the table."""
        self.recent.append(m)
        self.recent = self.recent[-self.KEEP:]
        self.totals["in"] += m.total_in
        self.totals["out"] += m.total_out
        self.totals["dead"] += m.dead_letters
        self.totals["epochs"] += 1
        if self.live:
            self.live.update(self._render())

    def message(self, text: str) -> None:
        """Print a line above the live table."""
        self.console.print(text)

    def checkpoint(self, info: dict[str, Any]) -> None:
        """Show the latest checkpoint under the table; a failed one as a line above it."""
        if info.get("status") == "completed":
            self.last_checkpoint = (
                f"checkpoint {info['id']} at epoch {info['epoch']} · "
                f"{info['duration_ms']:,.0f} ms · {info['uploaded_bytes']:,} B uploaded of "
                f"{info['state_size']:,} B state")
            if self.live:
                self.live.update(self._render())
        else:
            self.console.print(Text(f"checkpoint {info.get('id')} failed: "
                                    f"{info.get('reason')}", style="yellow"))

    def finished(self, summary: dict[str, Any]) -> None:
        """Stop the live display and print how the job ended."""
        if self.live:
            self.live.update(self._render())
            self.live.stop()
            if not self.console.is_terminal:  # a redirected Live leaves no final newline
                self.console.line()
        style = "green" if summary.get("status") in ("finished", "stopped") else "red"
        self.console.print(Text(f"{summary.get('status')}: {summary.get('reason', '')}",
                                style=style))
