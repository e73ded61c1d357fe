"""Nexmark (issue 40): the generator's model (the 1:3:46 ratio, event-time order within the
disorder bound, ids that bids and auctions reference), every runnable query's `tests:` block
run as `streamer test` runs it, and each query's streamer output on 5,000 generated events
equal to its batch oracle's (bench/nexmark/queries.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from bench.nexmark import run
from bench.nexmark.generator import BASE_MS, Config, generate, read, write
from bench.nexmark.queries import PIPELINES, QUERIES
from streamer.pipeline.validate import load_pipeline
from streamer.runtime.job.testing import run_case

RUNNABLE = [q for q in QUERIES if not q.pending]


def _ms(table, column: str = "date_time") -> np.ndarray:
    return pc.cast(table.column(column), "int64").to_numpy()


def test_the_generator_keeps_nexmarks_ratio_order_and_ids(tmp_path: Path) -> None:
    cfg = Config(events=50_000, disorder_events=500, files=5)
    counts = write(cfg, tmp_path)
    assert counts == {"person": 1000, "auction": 3000, "bid": 46000}  # 1:3:46
    for kind in counts:
        ts = _ms(read(tmp_path, kind))
        behind = np.maximum.accumulate(ts) - ts  # how far each event is behind the latest
        assert behind.max() > 0, f"{kind}: no disorder at all"
        assert behind.max() < cfg.disorder_ms, f"{kind}: {behind.max()} ms behind"
        assert ts.min() >= BASE_MS
        assert len(list((tmp_path / kind).glob("part-*.parquet"))) == cfg.files
    persons, auctions, bids = (read(tmp_path, k) for k in ("person", "auction", "bid"))
    assert sorted(persons.column("id").to_pylist()) == list(range(1000, 2000))
    assert sorted(auctions.column("id").to_pylist()) == list(range(1000, 4000))
    # bids reference recent auctions (hot ones half the time) and at most 10 not yet created
    assert pc.max(bids.column("auction")).as_py() <= 3999 + 10
    auction = bids.column("auction").to_numpy()
    assert ((auction - 1000) % 100 == 0).mean() > 0.5  # the first of the last 100 auctions
    bidder = bids.column("bidder").to_numpy()
    assert ((bidder - 1000) % 100 == 1).mean() > 0.7  # hot bidders: 3 in 4
    expires, starts = _ms(auctions, "expires"), _ms(auctions)
    assert (expires > starts).all()
    assert set(pc.unique(auctions.column("category")).to_pylist()) == {10, 11, 12, 13, 14}
    channels = bids.column("channel").to_pylist()
    big = sum(c in ("Google", "Facebook", "Baidu", "Apple") for c in channels) / len(channels)
    assert 0.45 < big < 0.55
    # deterministic: the same seed gives the same events
    again = generate(cfg)["bid"]
    assert again.column("price").to_pylist() == bids.column("price").to_pylist()


def test_every_query_has_a_pipeline_and_pending_ones_say_why() -> None:
    assert [q.name for q in QUERIES] == [f"q{i}" for i in range(23)]
    for q in QUERIES:
        assert q.path.exists(), q.path
        assert (q.path.parent.name == "pending") == bool(q.pending)
    readme = (PIPELINES / "README.md").read_text()
    for q in QUERIES:
        assert f"| {q.name.upper()} " in readme, q.name
    for path in PIPELINES.rglob("*.yaml"):
        assert "process:" not in path.read_text(), f"{path.name} uses a process function"


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("query", RUNNABLE, ids=[q.name for q in RUNNABLE])
def test_the_pipelines_tests_block_passes(spark, query) -> None:
    spec = load_pipeline(str(query.path))
    assert spec.tests, f"{query.path.name} has no tests: block"
    for case in spec.tests:
        result = run_case(spec, case, spark)
        assert result.passed, (result.missing, result.unexpected)


@pytest.fixture(scope="module")
def small_data(spark, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nexmark") / "data"
    write(Config(events=5_000, files=2), root)
    run.batch_views(spark, root)
    return root


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("query", RUNNABLE, ids=[q.name for q in RUNNABLE])
def test_streamer_output_equals_the_batch_oracle(spark, small_data: Path, tmp_path: Path,
                                                  query) -> None:
    run.batch_views(spark, small_data)
    result = run.run_streamer(spark, query, small_data, tmp_path, files_per_epoch=1,
                              backend="memory")
    verdict = run.check(spark, query, result, sss=False)
    assert verdict.startswith("yes"), verdict
