"""Prometheus metrics (docs/metrics.md): a real `streamer run` serves them, scraped with
urllib while it runs and checked against the same run's `--json` epoch lines; the keys are
validated; a port in use is one clear message."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from streamer_process import SCRUBBED, STREAMER, quick_jvm
from typer.testing import CliRunner

from streamer.cli.main import app
from streamer.pipeline.exceptions import PipelineError
from streamer.pipeline.validate import load_pipeline_text

PIPELINE = """
name: metered
job:
  epoch: 500ms
  checkpoint: {{interval: 1ms}}
  metrics: {{prometheus: {{port: {port}}}}}
sources:
  - id: ticks
    type: datagen
    splits: 2
    rows_per_second: 40
    fields:
      n: offset
      parity: offset % 2
      ts: timestamp_millis(1767225600000 + offset * 1000)
    event_time: ts
operators:
  - id: odd
    input: ticks
    filter: "n % 2 = 1"
  - id: per_10s
    input: odd
    key_by: [parity]
    window: {{tumbling: 10s}}
    aggregate: {{c: count()}}
sinks:
  - id: out
    type: files
    input: odd
    path: {root}/out
    format: jsonl
  - id: counts
    type: files
    input: per_10s
    path: {root}/counts
    format: jsonl
""" + quick_jvm().replace("{", "{{").replace("}", "}}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one scrape: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"job_name": "metered", **labels}.items())))]


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_a_running_job_serves_the_counts_of_its_json_epoch_lines(tmp_path: Path) -> None:
    port = free_port()
    pipeline = tmp_path / "job.yaml"
    pipeline.write_text(PIPELINE.format(port=port, root=tmp_path))
    out, err = tmp_path / "run.jsonl", tmp_path / "run.stderr"
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([str(STREAMER), "run", str(pipeline), "--json", "--no-ui",
                                 "--storage", str(tmp_path / "storage")], stdout=stdout,
                                stderr=stderr, cwd=tmp_path, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 240
        samples: dict[Any, float] = {}
        while True:  # until the scrape shows 3 epochs (Spark starts first)
            assert proc.poll() is None, err.read_text()[-3000:]
            assert time.monotonic() < deadline, err.read_text()[-3000:]
            try:
                samples = scrape(url)
            except OSError:  # not serving yet
                samples = {}
            if samples and value(samples, "streamer_last_epoch") >= 3:
                break
            time.sleep(0.3)
        last = int(value(samples, "streamer_last_epoch"))
        while not any(e["event"] == "epoch" and e["epoch"] == last for e in events(out)):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        started = next(e for e in events(out) if e["event"] == "started")
        assert started["metrics"] == url
        epochs = [e for e in events(out) if e["event"] == "epoch" and e["epoch"] <= last]
        assert [e["epoch"] for e in epochs] == list(range(1, last + 1))
        # One scrape is one epoch boundary: every count is the sum of epochs 1..last.
        records_in = sum(e["records_in"].get("ticks", 0) for e in epochs)
        assert records_in > 0
        assert value(samples, "streamer_records_in_total", source="ticks") == records_in
        assert value(samples, "streamer_records_out_total", sink="out") == sum(
            e["records_out"].get("out", 0) for e in epochs)
        assert value(samples, "streamer_filtered_records_total") == sum(
            e["filtered"] for e in epochs) > 0
        # Per operator, the sums of the epoch lines' `operators`.
        def summed(op: str, what: str) -> int:
            return sum(e["operators"].get(op, {}).get(what, 0) for e in epochs)

        for what, metric in (("in", "records_in"), ("out", "records_out"),
                             ("filtered", "filtered_records")):
            assert value(samples, f"streamer_operator_{metric}_total",
                         operator="odd") == summed("odd", what)
        assert summed("odd", "in") == records_in
        assert summed("odd", "filtered") == value(samples, "streamer_filtered_records_total")
        assert value(samples, "streamer_operator_records_out_total",
                     operator="per_10s") == summed("per_10s", "out") == sum(
            e["records_out"].get("counts", 0) for e in epochs) > 0
        assert value(samples, "streamer_operator_late_records_total", operator="per_10s") == 0
        assert ("streamer_operator_records_in_total", (("job_name", "metered"),
                                                       ("operator", "per_10s"))) not in samples
        assert value(samples, "streamer_dead_letters_total") == 0
        assert value(samples, "streamer_late_records_total") == 0
        assert value(samples, "streamer_restarts_total") == 0
        assert value(samples, "streamer_epoch_duration_seconds_count") == last
        assert value(samples, "streamer_epoch_duration_seconds_sum") == pytest.approx(
            sum(e["duration_ms"] for e in epochs) / 1000)
        final = epochs[-1]
        assert value(samples, "streamer_watermark_seconds") == final["watermark"] / 1000
        for split in ("0", "1"):
            assert value(samples, "streamer_source_lag_records", source="ticks",
                         split=split) == final["split_lag"]["ticks"][split]
        assert sum(final["split_lag"]["ticks"].values()) == final["lag"]["ticks"]
        # Checkpoints complete inside an epoch, before it is reported: the scrape may
        # already count the next epoch's.
        done = [e for e in events(out) if e["event"] == "checkpoint"
                and e["status"] == "completed"]
        counted = value(samples, "streamer_checkpoints_total", status="completed")
        assert len([e for e in done if e["epoch"] <= last]) <= counted
        assert counted <= len([e for e in done if e["epoch"] <= last + 1])
        assert value(samples, "streamer_checkpoint_duration_seconds_count") == counted
        assert value(samples, "streamer_last_checkpoint") in {e["id"] for e in done}
    finally:
        proc.send_signal(signal.SIGTERM)  # the driver only: a graceful stop at the boundary
        try:
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert code == 0, err.read_text()[-3000:]
    with pytest.raises(OSError):  # the endpoint ends with the run
        scrape(url)


def test_a_port_in_use_is_one_message_not_a_traceback(tmp_path: Path) -> None:
    pipeline = tmp_path / "job.yaml"
    pipeline.write_text(PIPELINE.format(port=1, root=tmp_path))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["run", str(pipeline), "--metrics-port", str(port),
                                          "--no-ui"])
    assert result.exit_code == 2, result.output  # a configuration error
    assert (f"cannot serve Prometheus metrics on 127.0.0.1:{port}: Address already in use; "
            "choose a free port (job.metrics.prometheus.port or --metrics-port)"
            in " ".join(result.output.split()))
    assert "Traceback" not in result.output


def test_the_metrics_keys_are_validated() -> None:
    def problems(block: str) -> list[str]:
        text = textwrap.dedent("""\
            name: p
            job:
              metrics:
            {block}
            sources: [{{id: s, type: datagen, fields: {{n: offset}}}}]
            sinks: [{{id: o, type: console, input: s}}]
            """).format(block=textwrap.indent(block, "    "))
        with pytest.raises(PipelineError) as info:
            load_pipeline_text(text, file="p.yaml", env={})
        return [str(p) for p in info.value.problems]

    assert problems("prometheus: {port: 0}") == [
        "p.yaml:4:24: 'port' must be at least 1, got 0"]
    assert problems("prometheus: {prot: 9249}") == [
        "p.yaml:4:17: 'prometheus' is missing required key 'port'",
        "p.yaml:4:18: unknown key 'prot' in 'prometheus'; did you mean 'port'?"]
    assert problems("statsd: {}") == [
        "p.yaml:4:5: unknown key 'statsd' in 'metrics'; valid keys: prometheus"]
    spec = load_pipeline_text(textwrap.dedent("""\
        name: p
        job: {metrics: {prometheus: {port: 9249, host: 0.0.0.0}}}
        sources: [{id: s, type: datagen, fields: {n: offset}}]
        sinks: [{id: o, type: console, input: s}]
        """), file="p.yaml", env={})
    assert (spec.job.metrics.prometheus_port, spec.job.metrics.prometheus_host) == (
        9249, "0.0.0.0")


def test_files_lag_is_in_files_and_the_watermark_ends_are_infinite() -> None:
    """The exporter's own arithmetic, fed the reports a run would give (no Spark)."""
    from streamer.runtime.observe.metrics import EpochMetrics
    from streamer.runtime.observe.prometheus import JobCollector, PrometheusExporter
    from streamer.runtime.watermarks import MAX_WATERMARK, MIN_WATERMARK

    exporter = PrometheusExporter("metered", free_port())
    exporter.started({"lag_units": {"logs": "files", "ticks": "records"}})
    collector: JobCollector = exporter.collector
    for epoch, watermark in ((1, MIN_WATERMARK), (2, 1767225600500), (3, MAX_WATERMARK)):
        exporter.epoch(EpochMetrics(epoch=epoch, started_at=0, duration_ms=10,
                                    lag={"logs": 4 - epoch, "ticks": 7},
                                    watermark=watermark))
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in collector.collect() for s in f.samples}
        assert value(samples, "streamer_source_lag_files", source="logs") == 4 - epoch
        # A source that gives no per-split lag is one series with an empty split.
        assert value(samples, "streamer_source_lag_records", source="ticks", split="") == 7
        assert ("streamer_source_lag_records", (("job_name", "metered"), ("source", "logs"),
                                                ("split", ""))) not in samples
        assert value(samples, "streamer_watermark_seconds") == {
            1: float("-inf"), 2: 1767225600.5, 3: float("inf")}[epoch]


def test_per_operator_counts_add_up_over_epochs() -> None:
    """The exporter's per-operator series, fed epochs with `operators` (no Spark): a
    series per operator and count it reported, summed over the epochs."""
    from streamer.runtime.observe.metrics import EpochMetrics
    from streamer.runtime.observe.prometheus import PrometheusExporter

    exporter = PrometheusExporter("metered", free_port())
    for epoch, (passed, late) in enumerate(((3, 0), (5, 2)), start=1):
        exporter.epoch(EpochMetrics(epoch=epoch, started_at=0, duration_ms=10, late=late,
                                    filtered=10 - passed, operators={
                                        "odd": {"in": 10, "out": passed,
                                                "filtered": 10 - passed},
                                        "per_10s": {"out": epoch, "late": late}}))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in exporter.collector.collect() for s in f.samples}
    got = {(name, dict(labels)["operator"]): v for (name, labels), v in samples.items()
           if name.startswith("streamer_operator_")}
    assert got == {
        ("streamer_operator_records_in_total", "odd"): 20,
        ("streamer_operator_records_out_total", "odd"): 8,
        ("streamer_operator_filtered_records_total", "odd"): 12,
        ("streamer_operator_records_out_total", "per_10s"): 3,
        ("streamer_operator_late_records_total", "per_10s"): 2}
    # The job-wide totals are as before.
    assert value(samples, "streamer_filtered_records_total") == 12
    assert value(samples, "streamer_late_records_total") == 2
