"""The Prometheus exporter's own cost (docs/metrics.md): reporting an epoch to it, and a scrape.

    .venv/bin/python -m bench.prometheus [--epochs 20000] [--scrapes 200] [--operators 8]

No Spark: the exporter is fed `EpochMetrics` of 4 sources with 16 splits each, 4 sinks and
`--operators` operators (half filters with in/out/filtered, half windows with out/late),
then scraped with urllib on 127.0.0.1, as Prometheus would.
"""

from __future__ import annotations

import argparse
import socket
import time
import urllib.request

from streamer.runtime.observe.metrics import EpochMetrics
from streamer.runtime.observe.prometheus import PrometheusExporter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20000)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--operators", type=int, default=8)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    exporter = PrometheusExporter("bench", port).start()
    exporter.started({"lag_units": {}})
    m = EpochMetrics(epoch=1, started_at=0, duration_ms=120,
                     records_in={f"s{i}": 1000 for i in range(4)},
                     records_out={f"k{i}": 900 for i in range(4)},
                     lag={f"s{i}": 16 for i in range(4)},
                     split_lag={f"s{i}": {str(j): 1 for j in range(16)} for i in range(4)},
                     watermark=1767225600000,
                     operators={f"o{i}": ({"in": 1000, "out": 900, "filtered": 100}
                                          if i % 2 == 0 else {"out": 90, "late": 1})
                                for i in range(args.operators)})
    t = time.perf_counter()
    for i in range(args.epochs):
        m.epoch = i + 1
        exporter.epoch(m)
    per_epoch_us = (time.perf_counter() - t) / args.epochs * 1e6
    times = []
    body = b""
    for _ in range(args.scrapes):
        t = time.perf_counter()
        with urllib.request.urlopen(exporter.url) as response:
            body = response.read()
        times.append((time.perf_counter() - t) * 1000)
    exporter.stop()
    times.sort()
    print(f"report one epoch: {per_epoch_us:.1f} us")
    print(f"scrape: median {times[len(times) // 2]:.2f} ms, "
          f"p99 {times[int(len(times) * 0.99) - 1]:.2f} ms, {len(body):,} bytes")


if __name__ == "__main__":
    main()
