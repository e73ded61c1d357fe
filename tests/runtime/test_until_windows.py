"""`window: {until: column}`: a window per key and close time, emitted once when the
watermark passes the close time (Nexmark Q4, Q6). Its results equal a batch answer, and a
record whose close time is null is a bad record: a dead letter of its source with the reason
(its file and line), or, without `on_error`, a failed run that names the operator and the
record. It is never dropped, nor counted as late."""

from __future__ import annotations

import json
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest
from test_bad_records import committed, iso, run

from streamer.connectors.exceptions import DecodeError

pytestmark = [pytest.mark.spark, pytest.mark.slow]

BASE_MS = 1_767_225_600_000


def write_auctions(data: Path) -> list[dict]:
    """Bids on 6 auctions over 2 files; auction a closes at BASE + (a + 1) * 10 s, and every
    7th bid has no close time."""
    data.mkdir()
    records = []
    for i in range(300):
        a = i % 6
        close = None if i % 7 == 3 else iso(BASE_MS + (a + 1) * 10_000)
        records.append({"auction": a, "price": (i * 31) % 97, "expires": close,
                        "ts": iso(BASE_MS + i * 150)})
    for f in range(2):
        part = records[f * 150:(f + 1) * 150]
        (data / f"part-{f}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return records


def pipeline(data: Path, out: Path, dlq: Path | None) -> str:
    on_error = "on_error: dlq" if dlq else ""
    dlq_sink = (f"\n  - {{id: dlq, type: files, path: {dlq}, format: jsonl}}" if dlq else "")
    return textwrap.dedent(f"""\
        name: until
        job: {{parallelism: 2}}
        sources:
          - id: bids
            type: files
            path: {data}
            format: jsonl
            max_files_per_epoch: 1
            schema: {{auction: bigint, price: bigint, expires: timestamp, ts: timestamp}}
            event_time: ts
            watermark: {{max_out_of_orderness: 1s}}
            {on_error}
        operators:
          - id: winning
            input: bids
            key_by: [auction]
            window: {{until: expires}}
            aggregate: {{top: max(price), bids: count()}}
        sinks:
          - {{id: out, type: files, input: winning, path: {out}, format: jsonl}}""") + dlq_sink


def test_an_until_window_equals_the_batch_answer_and_null_close_times_are_dead_letters(
        spark, tmp_path: Path) -> None:
    data, out, dlq = tmp_path / "in", tmp_path / "out", tmp_path / "dlq"
    records = write_auctions(data)
    result = run(spark, pipeline(data, out, dlq))
    # Epoch 1 reads part-0 (bids 0-149), epoch 2 part-1, with the watermark of epoch 1's
    # newest bid - 1 s: an auction whose close time is behind it was emitted after epoch 1,
    # and its bids in epoch 2 are late.
    watermark = max(BASE_MS + i * 150 for i in range(150)) - 1_000
    expected: dict[int, list[int]] = defaultdict(list)
    late = 0
    for i, r in enumerate(records):
        if r["expires"] is None:
            continue
        close_ms = BASE_MS + (r["auction"] + 1) * 10_000
        if i >= 150 and close_ms - 1 <= watermark:
            late += 1
        else:
            expected[r["auction"]].append(r["price"])
    rows = committed(out)
    assert sorted((row["auction"], row["top"], row["bids"], row["window_end"]) for row in rows) \
        == sorted((a, max(p), len(p), iso(BASE_MS + (a + 1) * 10_000)[:-8] + "Z")
                  for a, p in expected.items())
    assert result.late == late > 0
    dead = committed(dlq)
    nulls = [r for r in records if r["expires"] is None]
    assert len(dead) == len(nulls) > 0
    assert sorted(json.loads(d["record"])["price"] for d in dead) == sorted(
        r["price"] for r in nulls)
    assert all(d["source"] == "bids" and "close time 'expires'" in d["error"]
               and "operator 'winning'" in d["error"] for d in dead), dead[:2]


def test_without_on_error_a_null_close_time_fails_the_run_naming_operator_and_record(
        spark, tmp_path: Path) -> None:
    data, out = tmp_path / "in", tmp_path / "out"
    write_auctions(data)
    with pytest.raises(DecodeError) as info:
        run(spark, pipeline(data, out, None))
    text = str(info.value)
    assert "operator 'winning'" in text and "close time 'expires'" in text, text
    assert '"expires":null' in text.replace(" ", "") and "on_error" in text, text
    assert not list(out.glob("part-*")), "a failed epoch must not commit"
