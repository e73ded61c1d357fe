"""The live display's rendering (runtime/observe/metrics.py `LiveReporter`), read back from rich's
own recording console: what a user sees at each moment of a run, with a clock we set."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from streamer.runtime.observe.metrics import EpochMetrics, LiveReporter
from streamer.text import plural


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def screen(reporter: LiveReporter) -> str:
    console = Console(record=True, width=160, color_system=None)
    console.print(reporter.render())
    return console.export_text()


def started(reporter: LiveReporter, **info: Any) -> None:
    reporter.started({"job": "shop", "master": "local[2]", "ui": None,
                      "outputs": ["out", "alerts"], **info})


def metrics(epoch: int, **kw: Any) -> EpochMetrics:
    base: dict[str, Any] = {"epoch": epoch, "started_at": 0.0, "duration_ms": 1500.0,
                            "records_in": {"events": 100}}
    return EpochMetrics(**{**base, **kw})


def test_plural() -> None:
    assert plural(0, "epoch") == "0 epochs"
    assert plural(1, "epoch") == "1 epoch"
    assert plural(2, "checkpoint") == "2 checkpoints"
    assert plural(1_000, "dead letter") == "1,000 dead letters"


def test_starting_spark_shows_and_its_clock_moves() -> None:
    clock = Clock()
    reporter = LiveReporter(Console(record=True), clock=clock)
    clock.now += 3.2
    first = screen(reporter)
    assert "starting Spark…" in first
    assert "3.2s" in first
    clock.now += 61
    assert "1m 04s" in screen(reporter)  # (it ticks without any event from the job)


def test_a_running_epoch_shows_how_long_it_has_been_running() -> None:
    clock = Clock()
    reporter = LiveReporter(Console(), clock=clock)
    started(reporter)
    assert "preparing the first epoch" in screen(reporter)
    clock.now += 5
    reporter.epoch_started(1)
    clock.now += 2.5
    shown = screen(reporter)
    assert "epoch 1 running  2.5s" in shown
    clock.now += 40
    assert "epoch 1 running  42.5s" in screen(reporter)


def test_sinks_get_a_column_each_and_dead_letters_late_and_filtered_apart() -> None:
    clock = Clock()
    reporter = LiveReporter(Console(), clock=clock)
    started(reporter)
    reporter.epoch_started(1)
    reporter.epoch(metrics(
        1, records_out={"out": 7, "alerts": 2, "bad": 3, "late_rows": 4},
        sink_rows={"out": {"out": 7}, "alerts": {"out": 2}, "bad": {"dead_letters": 3},
                   "late_rows": {"late": 4}},
        dead_letters=3, late=5, filtered=11))
    shown = screen(reporter)
    header = next(line for line in shown.splitlines() if "epoch ms" in line).split()
    assert header[:9] == ["epoch", "in", "→", "out", "→", "alerts", "filtered", "late", "dead"]
    assert "→ bad" not in shown and "→ late_rows" not in shown  # (no input: no column)
    row = next(line for line in shown.splitlines() if line.split()[:1] == ["1"]).split()
    assert row[:7] == ["1", "100", "7", "2", "11", "5", "3"]
    # the totals count output apart from dead letters and late rows, with right plurals
    assert "1 epoch · 100 in · 9 out · 11 filtered · 5 late · 3 dead letters" in shown
    assert "waiting for epoch 2" in shown
    reporter.epoch_started(2)
    reporter.epoch(metrics(2, sink_rows={"out": {"out": 1}}, dead_letters=1))
    shown = screen(reporter)
    assert "2 epochs · 200 in · 10 out · 11 filtered · 5 late · 4 dead letters" in shown
    assert "1 dead letter " not in shown


def test_a_sink_without_a_declared_input_that_got_output_gets_a_column() -> None:
    reporter = LiveReporter(Console(), clock=Clock())
    started(reporter, outputs=[])
    reporter.epoch(metrics(1, sink_rows={"side": {"out": 4}}))
    assert "→ side" in screen(reporter)


def test_checkpoints_are_counted_with_their_plural() -> None:
    reporter = LiveReporter(Console(), clock=Clock())
    started(reporter)
    reporter.epoch(metrics(1))
    info = {"status": "completed", "id": 1, "epoch": 1, "duration_ms": 120.0,
            "uploaded_bytes": 2048, "state_size": 4096}
    reporter.checkpoint(info)
    shown = screen(reporter)
    assert "· 1 checkpoint ·" in shown
    assert "checkpoint 1 at epoch 1 · 120 ms · 2,048 B uploaded of 4,096 B state" in shown
    reporter.checkpoint({**info, "id": 2})
    assert "· 2 checkpoints ·" in screen(reporter)


def test_finished_stops_the_display_and_says_how_the_job_ended() -> None:
    console = Console(record=True, width=160, color_system=None)
    clock = Clock()
    with LiveReporter(console, clock=clock) as reporter:
        started(reporter)
        reporter.epoch_started(1)
        reporter.epoch(metrics(1, sink_rows={"out": {"out": 7}}))
        reporter.finished({"status": "finished", "reason": "all sources are exhausted"})
        assert reporter.live is None
    text = console.export_text()
    assert "finished: all sources are exhausted" in text
    assert "1 epoch · 100 in · 7 out" in text
    assert "running" not in text.split("1 epoch ·")[-1]  # no spinner after the end
