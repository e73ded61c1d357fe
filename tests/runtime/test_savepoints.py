"""Savepoints end to end on real Spark, RocksDB and files: trigger and stop through the
control channel, restore unchanged, rescale 2 -> 4 -> 1, switch backends, relocate, upgrade
(a filter added, an operator added or removed), refused changes and the dry run."""

from __future__ import annotations

import json
import shutil
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fragments import clicks, files_sink, job, section, totals, window

from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.control import ControlChannel
from streamer.runtime.job.coordinator import JobRunner, RunOptions
from streamer.runtime.observe.metrics import JsonReporter
from streamer.savepoint.savepoint_metadata import SavepointError, plan_restore, read_metadata

pytestmark = pytest.mark.spark

BASE_MS = 1767225600000

#: The job head of the pipelines these tests stop with a savepoint and restore (format
#: fields: storage, parallelism, backend, local).
JOB_HEAD = """\
storage: {storage}
job:
  parallelism: {parallelism}
  checkpoint: {{interval: 1h}}
  state: {{backend: {backend}, local_dir: {local}}}
"""

def committed(directory: Path, up_to_epoch: int | None = None) -> Counter[str]:
    rows: Counter[str] = Counter()
    for part in sorted(directory.glob("part-*.jsonl")):
        if up_to_epoch is not None and int(part.name.split("-")[1]) > up_to_epoch:
            continue
        for line in part.read_text().splitlines():
            if line.strip():
                rows[json.dumps(json.loads(line), sort_keys=True)] += 1
    return rows


class Job:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.storage = tmp / "storage"
        self.out = tmp / "out"
        self.local = tmp / "local"

    def text(self, *, parallelism: int = 2, backend: str = "rocksdb", filter_: str = "",
             extra_operator: bool = False, out: Path | None = None) -> str:
        """The clicks through 10-second windows (after `filter_`) into files (`out`, or the
        job's output); with `extra_operator`, also a rolling count per user into `totals`."""
        operators = [f'  - {{id: kept, input: clicks, filter: "{filter_}"}}\n'] if filter_ else []
        operators.append(window("per_window", "kept" if filter_ else "clicks", "10s",
                                uid="per-window-v1"))
        sinks = [files_sink("per_window", out or self.out)]
        if extra_operator:
            operators.append(totals("per_user", aggregate="{total: count()}", uid="per-user-v1"))
            sinks.append(files_sink("per_user", self.tmp / "totals", id="totals"))
        return (job("sp-test", storage=self.storage, parallelism=parallelism,
                    checkpoint="{interval: 1h}", backend=backend, local_dir=self.local)
                + section("sources", clicks(limit=3000, per_epoch=600))
                + section("operators", *operators) + section("sinks", *sinks))

    def run(self, spark: Any, text: str, *, request: dict[str, Any] | None = None,
            at_epoch: int = 2, **options: Any) -> tuple[Any, list[dict[str, Any]]]:
        """Run; with `request`, file that control request when epoch `at_epoch` is done."""
        spec = load_pipeline_text(textwrap.dedent(text))
        events: list[dict[str, Any]] = []
        filed: list[str] = []
        storage = str(self.storage)

        class Capture:
            def write(self, s: str) -> None:
                for line in s.splitlines():
                    if not line:
                        continue
                    event = json.loads(line)
                    events.append(event)
                    if (request and not filed and event["event"] == "epoch"
                            and event["epoch"] >= at_epoch):
                        filed.append(ControlChannel(storage, "sp-test").request(**request))

            def flush(self) -> None:
                pass

        runner = JobRunner(spec, RunOptions(ui=False, checkpoints=True, **options),
                           spark=spark, reporter=JsonReporter(Capture()))  # type: ignore[arg-type]
        result = runner.run()
        return result, events


def messages(events: list[dict[str, Any]]) -> list[str]:
    return [e["text"] for e in events if e["event"] == "message"]


@pytest.fixture(scope="module")
def reference(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Counter[str]:
    job = Job(tmp_path_factory.mktemp("reference"))
    spec = load_pipeline_text(textwrap.dedent(job.text()))
    JobRunner(spec, RunOptions(ui=False), spark=spark).run()
    rows = committed(job.out)
    assert sum(rows.values()) > 100
    return rows


def stop_with_savepoint(job: Job, spark: Any, text: str, *, drain: bool = False,
                        at_epoch: int = 2, **options: Any) -> str:
    result, events = job.run(spark, text, request={"kind": "stop", "savepoint": True,
                                                   "drain": drain}, at_epoch=at_epoch,
                             **options)
    assert result.status == "stopped", result
    assert len(result.savepoints) == 1, messages(events)
    return result.savepoints[0]


@pytest.mark.slow
def test_trigger_keeps_the_job_running_and_restore_unchanged(
        spark: Any, tmp_path: Path, reference: Counter[str]) -> None:
    job = Job(tmp_path)
    result, events = job.run(spark, job.text(), request={"kind": "savepoint"})
    assert result.status == "finished" and len(result.savepoints) == 1
    assert committed(job.out) == reference  # the savepoint did not disturb the run
    path = result.savepoints[0]
    meta = read_metadata(path)
    assert meta.epoch >= 3 and meta.max_parallelism == 128
    op = meta.operators["per-window-v1"]
    assert op["definition"]["key_by"] == ["user"] and op["states"]
    # Restoring that savepoint into a fresh output reproduces the rest of the output.
    other = Job(tmp_path / "again")
    other.storage = job.storage
    _restored, events = other.run(spark, other.text(), from_savepoint=path)
    assert any(m.startswith("restoring savepoint") for m in messages(events))
    before = committed(job.out, up_to_epoch=meta.epoch)  # what the first run had committed
    assert committed(other.out) + before == reference


def _iso(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_stop_with_savepoint_then_restore_rescale_and_switch_backends(
        spark: Any, tmp_path: Path, reference: Counter[str]) -> None:
    """2 -> 4 -> 1 subtasks and rocksdb -> memory -> rocksdb, with a relocated savepoint."""
    job = Job(tmp_path)
    first = stop_with_savepoint(job, spark, job.text(parallelism=2, backend="rocksdb"))
    second = stop_with_savepoint(job, spark, job.text(parallelism=4, backend="memory"),
                                 at_epoch=read_metadata(first).epoch + 2, from_savepoint=first)
    assert read_metadata(second).operators["per-window-v1"]["parallelism"] == 4
    moved = tmp_path / "elsewhere" / "sp"
    shutil.copytree(second, moved)
    shutil.rmtree(second)  # relocated: the original is gone
    result, _events = job.run(spark, job.text(parallelism=1, backend="rocksdb"),
                             from_savepoint=str(moved))
    assert result.status == "finished"
    assert committed(job.out) == reference


@pytest.mark.slow  # 4 s each
@pytest.mark.parametrize("drain", [False, True])
def test_stop_with_savepoint_with_and_without_drain(
        spark: Any, tmp_path: Path, reference: Counter[str], drain: bool) -> None:
    job = Job(tmp_path)
    path = stop_with_savepoint(job, spark, job.text(), drain=drain)
    meta = read_metadata(path)
    assert meta.drained is drain
    stopped = committed(job.out)
    if drain:  # every window fired before the savepoint: the open ones too, early
        assert sum(meta.operators["per-window-v1"]["keys"].values()) == 0
        assert len(stopped) > len([r for r in reference
                                   if json.loads(r)["window_end"] <= _iso(
                                       meta.watermark["current"])])
    else:
        assert sum(meta.operators["per-window-v1"]["keys"].values()) > 0
        job.run(spark, job.text(), from_savepoint=path)
        assert committed(job.out) == reference


@pytest.mark.slow
def test_added_filter_changes_output_only_where_it_applies(
        spark: Any, tmp_path: Path, reference: Counter[str]) -> None:
    job = Job(tmp_path)
    path = stop_with_savepoint(job, spark, job.text())
    cut = read_metadata(path).offsets["clicks"]
    upgraded = job.text(filter_="amount < 9")
    job.run(spark, upgraded, from_savepoint=path)
    final_ref = Job(tmp_path / "final-ref")
    JobRunner(load_pipeline_text(textwrap.dedent(final_ref.text(filter_="amount < 9"))),
              RunOptions(ui=False), spark=spark).run()
    filtered = committed(final_ref.out)
    # Records before the savepoint were counted unfiltered, later ones filtered.
    first_after = BASE_MS + min(int(v) for v in cut.values()) * 100
    last_before = BASE_MS + (max(int(v) for v in cut.values()) - 1) * 100
    got = committed(job.out)
    for row in got:
        w = json.loads(row)
        if w["window_end"] <= _iso(first_after):
            assert row in reference, row
        elif w["window_start"] > _iso(last_before):
            assert row in filtered, row
    assert got != reference and got != filtered


@pytest.mark.slow
def test_added_operator_starts_empty_and_removed_one_is_refused_unless_allowed(
        spark: Any, tmp_path: Path) -> None:
    job = Job(tmp_path)
    path = stop_with_savepoint(job, spark, job.text())
    meta = read_metadata(path)
    spec = load_pipeline_text(textwrap.dedent(job.text(extra_operator=True)))
    actions = {d.uid: d.action for d in plan_restore(meta, spec)}
    assert actions == {"per-window-v1": "restore", "per-user-v1": "start-empty"}
    result, _ = job.run(spark, job.text(extra_operator=True), from_savepoint=path)
    totals = [json.loads(x) for p in sorted((tmp_path / "totals").glob("part-*.jsonl"))
              for x in p.read_text().split("\n") if x.strip()]
    final = {}
    for row in totals:  # rolling count updates: the last per user is its total
        final[row["user"]] = row["total"]
    assert sum(final.values()) == result.records_in  # only what it saw after the savepoint
    # Now take a savepoint with both, and restore into the pipeline without per_user.
    both = stop_with_savepoint(job, spark, job.text(extra_operator=True), from_savepoint=path)
    with pytest.raises(SavepointError, match=r"per-user-v1.*--allow-non-restored-state"):
        job.run(spark, job.text(), from_savepoint=both)
    result, events = job.run(spark, job.text(), from_savepoint=both,
                             allow_non_restored_state=True)
    assert result.status == "finished"
    assert any("per_user: drop" in m for m in messages(events))


def test_changed_key_or_window_is_refused_naming_the_operator(
        spark: Any, tmp_path: Path) -> None:
    job = Job(tmp_path)
    path = stop_with_savepoint(job, spark, job.text())
    changed = job.text().replace("key_by: [user]", "key_by: [user, amount]")
    with pytest.raises(SavepointError, match=r"operator 'per_window' \(uid 'per-window-v1'\): "
                                             r"key_by changed from \[\"user\"\] to"):
        job.run(spark, changed, from_savepoint=path)
    window = job.text().replace("tumbling: 10s", "tumbling: 20s")
    decisions = plan_restore(read_metadata(path), load_pipeline_text(textwrap.dedent(window)))
    assert [d.action for d in decisions] == ["refuse"]
    assert "the window changed" in decisions[0].reason


def test_cancel_stops_without_a_final_checkpoint(spark: Any, tmp_path: Path) -> None:
    job = Job(tmp_path)
    result, _ = job.run(spark, job.text(), request={"kind": "cancel"})
    assert result.status == "cancelled"
    assert result.checkpoints == []
    assert not list(job.out.glob("part-*"))  # its staged output was never committed


def test_a_savepoint_asked_for_at_the_end_of_input_is_written(spark: Any, tmp_path: Path) -> None:
    job = Job(tmp_path)
    result, events = job.run(spark, job.text(), request={"kind": "savepoint"}, at_epoch=10)
    assert result.status == "finished"
    assert len(result.savepoints) == 1, messages(events)
    assert read_metadata(result.savepoints[0]).epoch == result.epochs
