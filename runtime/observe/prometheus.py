"""Prometheus metrics of a running job (docs/metrics.md): an HTTP endpoint fed by the same
reports as the live table and `--json` (a `Reporter`), served from the job's own
`CollectorRegistry`, never prometheus-client's global one.

Every value is kept here and turned into metric families under one lock when Prometheus
scrapes, so a scrape never sees half an epoch: all its values are those of one epoch boundary.
"""

from __future__ import annotations

import errno
import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamer.exceptions import ConfigError

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from streamer.runtime.observe.metrics import EpochMetrics

#: Epoch durations (seconds): a near-empty epoch takes tens of milliseconds, a large one
#: seconds to minutes.
EPOCH_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
#: Checkpoint durations (seconds): tens of milliseconds for RocksDB, seconds for large
#: memory state.
CHECKPOINT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Per-operator counters: the key in `EpochMetrics.operators`, the metric, its help.
_OPERATOR_COUNTS = (
    ("in", "streamer_operator_records_in", "Records that entered a filter operator."),
    ("out", "streamer_operator_records_out", "Records a filter passed on, or rows a keyed "
     "operator emitted."),
    ("filtered", "streamer_operator_filtered_records", "Records a filter operator removed."),
    ("late", "streamer_operator_late_records", "Late records of a window or join (sent to "
     "its late: output, or dropped)."),
)
#: A watermark at or beyond these (epoch ms) is -inf / +inf (no event yet / end of input).
_INF_MS = 2**61


@dataclass
class _Histogram:
    """A histogram's cumulative state: per upper bound the observations at or below it."""

    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.n += 1

    def buckets(self) -> list[tuple[str, float]]:
        counts = self.counts or [0] * len(self.bounds)
        return [*((_bound(b), float(c)) for b, c in zip(self.bounds, counts, strict=True)),
                ("+Inf", float(self.n))]


def _bound(value: float) -> str:
    return repr(float(value))


def watermark_seconds(watermark_ms: int) -> float:
    """A watermark (epoch ms) in seconds, with the ends as -inf and +inf."""
    if watermark_ms <= -_INF_MS:
        return -math.inf
    if watermark_ms >= _INF_MS:
        return math.inf
    return watermark_ms / 1000


class JobCollector:
    """The job's metrics, kept as the reports arrive and collected on a scrape."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.lock = threading.Lock()
        self.records_in: dict[str, int] = {}
        self.records_out: dict[str, int] = {}
        #: Per operator id and count (`in`, `out`, `filtered`, `late`): the sum over epochs.
        self.operators: dict[str, dict[str, int]] = {}
        self.counts = {"dead_letters": 0, "late": 0, "filtered": 0, "restarts": 0}
        self.lag: dict[tuple[str, str], int] = {}   # (source, split) -> records
        self.lag_files: dict[str, int] = {}         # files sources: files not read yet
        self.lag_units: dict[str, str] = {}
        self.watermark: float | None = None
        self.last_epoch = 0
        self.epochs = _Histogram(EPOCH_BUCKETS)
        self.checkpoints = _Histogram(CHECKPOINT_BUCKETS)
        self.checkpoint_status = {"completed": 0, "failed": 0}
        self.checkpoint_size: int | None = None
        self.checkpoint_uploaded: int | None = None
        self.last_checkpoint: int | None = None
        self.started_at: float | None = None

    # ------------------------------------------------------------------ fed by the reports
    def epoch(self, m: EpochMetrics) -> None:
        """Count an epoch that committed."""
        with self.lock:
            for source, n in m.records_in.items():
                self.records_in[source] = self.records_in.get(source, 0) + n
            for sink, n in m.records_out.items():
                self.records_out[sink] = self.records_out.get(sink, 0) + n
            for op, counts in m.operators.items():
                summed = self.operators.setdefault(op, {})
                for what, n in counts.items():
                    summed[what] = summed.get(what, 0) + n
            self.counts["dead_letters"] += m.dead_letters
            self.counts["late"] += m.late
            self.counts["filtered"] += m.filtered
            for source, total in m.lag.items():
                if self.lag_units.get(source) == "files":
                    if total is not None:
                        self.lag_files[source] = total
                    continue
                splits = m.split_lag.get(source)
                if splits is not None:
                    for split, n in splits.items():
                        self.lag[(source, split)] = n
                elif total is not None:  # the source tells only its total
                    self.lag[(source, "")] = total
            if m.watermark is not None:
                self.watermark = watermark_seconds(m.watermark)
            self.last_epoch = m.epoch
            self.epochs.observe(m.duration_ms / 1000)

    def checkpoint(self, info: dict[str, Any]) -> None:
        """Count a completed or failed checkpoint."""
        with self.lock:
            status = "completed" if info.get("status") == "completed" else "failed"
            self.checkpoint_status[status] += 1
            if status == "completed":
                self.checkpoints.observe(float(info.get("duration_ms") or 0) / 1000)
                self.checkpoint_size = int(info.get("state_size") or 0)
                self.checkpoint_uploaded = int(info.get("uploaded_bytes") or 0)
                self.last_checkpoint = int(info["id"])

    def restarted(self) -> None:
        """Count an automatic restart from the last checkpoint."""
        with self.lock:
            self.counts["restarts"] += 1

    # ------------------------------------------------------------------ a scrape
    def collect(self) -> Iterator[Metric]:
        """The metric families, all from one moment (prometheus-client's Collector)."""
        with self.lock:
            families = list(self._families())
        yield from families

    def _families(self) -> Iterator[Metric]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
        )

        job = [self.job]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=["job_name"])
            family.add_metric(job, value)
            return family

        def gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["job_name"])
            if value is not None:
                family.add_metric(job, value)
            return family

        family = CounterMetricFamily("streamer_records_in", "Records that entered the "
                                     "dataflow from each source (decoded, with an event time).",
                                     labels=["job_name", "source"])
        for source, n in sorted(self.records_in.items()):
            family.add_metric([self.job, source], n)
        yield family
        family = CounterMetricFamily("streamer_records_out", "Rows each sink received "
                                     "(dead letters and late records included).",
                                     labels=["job_name", "sink"])
        for sink, n in sorted(self.records_out.items()):
            family.add_metric([self.job, sink], n)
        yield family
        yield from self._operator_families()
        yield counter("streamer_dead_letters", "Bad records sent to an on_error sink.",
                      self.counts["dead_letters"])
        yield counter("streamer_late_records", "Records sent to a window's late: output.",
                      self.counts["late"])
        yield counter("streamer_filtered_records", "Records removed by filter operators.",
                      self.counts["filtered"])
        yield counter("streamer_restarts", "Automatic restarts from the last checkpoint "
                      "(job.restart).", self.counts["restarts"])
        lag = GaugeMetricFamily("streamer_source_lag_records", "Records available in a "
                                "source split but not read yet, after the last epoch.",
                                labels=["job_name", "source", "split"])
        for (source, split), n in sorted(self.lag.items()):
            lag.add_metric([self.job, source, split], n)
        yield lag
        files = GaugeMetricFamily("streamer_source_lag_files", "Files present in a files "
                                  "source but not read yet, after the last epoch.",
                                  labels=["job_name", "source"])
        for source, n in sorted(self.lag_files.items()):
            files.add_metric([self.job, source], n)
        yield files
        yield gauge("streamer_watermark_seconds", "The job's event-time watermark (Unix "
                    "seconds) after the last epoch; +Inf once the input ended.", self.watermark)
        yield gauge("streamer_last_epoch", "The number of the last epoch that committed.",
                    self.last_epoch)
        yield from self._checkpoint_families(counter, gauge)
        yield self._histogram("streamer_epoch_duration_seconds", "How long each epoch took, "
                              "from planning its slices to committing.", self.epochs)
        yield self._histogram("streamer_checkpoint_duration_seconds", "How long each "
                              "completed checkpoint took.", self.checkpoints)
        if self.started_at is not None:
            yield gauge("streamer_start_time_seconds", "When the run started (Unix "
                        "seconds).", self.started_at)

    def _operator_families(self) -> Iterator[Metric]:
        """Per operator: the counts its epochs had (a filter's records in, out and filtered,
        a keyed operator's records out, a window's late records)."""
        from prometheus_client.core import CounterMetricFamily

        for what, name, doc in _OPERATOR_COUNTS:
            family = CounterMetricFamily(name, doc, labels=["job_name", "operator"])
            for op, counts in sorted(self.operators.items()):
                if what in counts:
                    family.add_metric([self.job, op], counts[what])
            yield family

    def _checkpoint_families(self, counter: Any, gauge: Any) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily("streamer_checkpoints", "Checkpoints by outcome.",
                                     labels=["job_name", "status"])
        for status, n in self.checkpoint_status.items():
            family.add_metric([self.job, status], n)
        yield family
        yield gauge("streamer_checkpoint_size_bytes", "The keyed state the last completed "
                    "checkpoint references.", self.checkpoint_size)
        yield gauge("streamer_checkpoint_uploaded_bytes", "What the last completed "
                    "checkpoint uploaded (incremental).", self.checkpoint_uploaded)
        yield gauge("streamer_last_checkpoint", "The id of the last completed checkpoint.",
                    self.last_checkpoint)

    def _histogram(self, name: str, doc: str, h: _Histogram) -> Metric:
        from prometheus_client.core import HistogramMetricFamily

        family = HistogramMetricFamily(name, doc, labels=["job_name"])
        family.add_metric([self.job], h.buckets(), h.total)
        return family


class PrometheusExporter:
    """A `Reporter` that keeps the job's metrics and serves them on `host:port/metrics`."""

    def __init__(self, job: str, port: int, host: str = "127.0.0.1") -> None:
        from prometheus_client import CollectorRegistry

        self.port, self.host = port, host
        self.collector = JobCollector(job)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where Prometheus scrapes."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> PrometheusExporter:
        """Serve `/metrics` in a daemon thread; a port in use is a `ConfigError`."""
        from prometheus_client import start_http_server

        try:
            self._server, self._thread = start_http_server(self.port, self.host,
                                                           registry=self.registry)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            fix = ("choose a free port (job.metrics.prometheus.port or --metrics-port)"
                   if exc.errno == errno.EADDRINUSE else
                   "check job.metrics.prometheus.host and port")
            msg = f"cannot serve Prometheus metrics on {self.host}:{self.port}: {reason}; {fix}"
            raise ConfigError(msg) from exc
        return self

    def stop(self) -> None:
        """Stop serving (the run is over)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def restarted(self) -> None:
        """The job restarted from its last checkpoint."""
        self.collector.restarted()

    # ------------------------------------------------------------------ the Reporter side
    def starting(self, info: dict[str, Any]) -> None:
        """Nothing: the metrics start with the job (`started`)."""

    def epoch_started(self, epoch: int) -> None:
        """Nothing: an epoch is counted when it ends."""

    def started(self, info: dict[str, Any]) -> None:
        """Note the start time and the sources' lag units."""
        import time

        with self.collector.lock:
            self.collector.started_at = time.time()
            self.collector.lag_units.update(info.get("lag_units") or {})

    def epoch(self, m: EpochMetrics) -> None:
        """Count the epoch."""
        self.collector.epoch(m)

    def message(self, text: str) -> None:
        """Messages are not metrics."""

    def checkpoint(self, info: dict[str, Any]) -> None:
        """Count the checkpoint."""
        self.collector.checkpoint(info)

    def finished(self, summary: dict[str, Any]) -> None:
        """Nothing: the endpoint stops with the run."""
