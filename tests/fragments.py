"""Pieces of pipeline YAML that tests and benchmarks put together, so that the jobs they share
are written once: test_crash.py's clicks (a datagen source) through 5-second tumbling windows
into files, the JSON-lines files source of the staged and Arrow tests, a Kafka topic in and
out. Each function returns block YAML with its values filled in (no `str.format` fields, so
no doubled braces): `job` the top of a pipeline, the others one list item of `sources:`,
`operators:` or `sinks:` (indented by two), which `section` puts under its key.

    text = (job("crash", root, backend="rocksdb", attempts=0)
            + section("sources", clicks(limit=600, per_epoch=120))
            + section("operators", window("per_window", "clicks", "5s", CRASH_AGGREGATE))
            + section("sinks", files_sink("per_window", root / "out")))

Importable from every test (tests/ is on `sys.path`: pytest puts the folder of the root
conftest.py there) and from bench/ (whose modules put tests/ there themselves).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: 2026-01-01T00:00:00Z, the event time the generated records start at.
BASE_MS = 1767225600000
#: A checkpoint after every epoch, the last two kept.
EVERY_EPOCH = "{interval: 1ms, retain: 2}"
#: The aggregate of test_crash.py's windows (and of the jobs that copy its output).
CRASH_AGGREGATE = "{n: count(), spent: sum(amount), first: min(ts), last: max(ts)}"
#: The aggregate most windows over clicks compute.
SPENT = "{n: count(), spent: sum(amount)}"
#: The aggregate of the windows over the events of the benchmarks and the plan tests.
TOTAL = "{n: count(), total: sum(amount)}"
#: The columns of the JSON events `test_staged.json_events` writes.
EVENTS_SCHEMA = "{user: string, grp: int, ts: timestamp, amount: double, qty: bigint}"
#: test_crash.py's clicks as Kafka records: the event time is the `ts` column, in ms.
CLICKS_SCHEMA = "{user: string, amount: double, ts: bigint}"


def keys(indent: str, **values: object) -> str:
    """`key: value` lines at `indent`, in order, for the values that are not None."""
    return "".join(f"{indent}{key}: {value}\n" for key, value in values.items()
                   if value is not None)


def write_pipeline(root: Path, text: str) -> Path:
    """The pipeline file `<root>/job.yaml` holding `text` (`root` made if it is not there)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "job.yaml"
    path.write_text(text)
    return path


def job(name: str, root: Path | str | None = None, *, storage: Path | str | None = None,
        parallelism: int | str = 2, max_parallelism: int | None = None,
        epoch: str | None = None, checkpoint: str | None = EVERY_EPOCH,
        backend: str | None = None, local_dir: Path | str | None = None,
        attempts: int | None = None, execution: str | None = None,
        storage_options: dict[str, str] | None = None) -> str:
    """The pipeline's `name:`, `storage:` (`<root>/storage` by default, reached with
    `storage_options`) and `job:` block. The state backend keeps its local files in
    `local_dir` (`<root>/local` by default, the backend's default without a root); a
    `restart:` is written when `attempts` is given (with no delay between attempts)."""
    if storage is None and root is not None:
        storage = f"{root}/storage"
    local = local_dir if local_dir is not None else f"{root}/local" if root is not None else None
    state = f"{{backend: {backend}" + (f", local_dir: {local}}}" if local else "}")
    return f"name: {name}\n" + keys("", storage=storage) + (
        "storage_options:\n" + keys("  ", **storage_options) if storage_options else ""
    ) + "job:\n" + keys(
        "  ", parallelism=parallelism, max_parallelism=max_parallelism, epoch=epoch,
        checkpoint=checkpoint,
        state=state if backend is not None else None,
        restart=f"{{attempts: {attempts}, delay: 0s}}" if attempts is not None else None,
        execution=execution)


def section(key: str, *items: str) -> str:
    """`key:` (sources, operators or sinks) with its list items."""
    return f"{key}:\n" + "".join(items)


def clicks(*, limit: int | str, per_epoch: int | str, id: str = "clicks", splits: int = 2,
           base_ms: int | str = BASE_MS, uid: str | None = None, rate: int | None = None,
           out_of_orderness: str = "1s") -> str:
    """test_crash.py's datagen source: per split, `limit` clicks 100 ms apart from `base_ms`,
    of the 13 users u0-u12 (offset * 7 + split), amounts 0-9 (at most `rate` a second)."""
    return f"""\
  - id: {id}
""" + (f"    uid: {uid}\n" if uid else "") + f"""\
    type: datagen
    splits: {splits}
""" + (f"    rows_per_second: {rate}\n" if rate is not None else "") + f"""\
    limit: {limit}
    max_records_per_epoch: {per_epoch}
    fields:
      user: "concat('u', cast((offset * 7 + split) % 13 as string))"
      amount: "cast(offset % 10 as double)"
      ts: "timestamp_millis({base_ms} + offset * 100)"
    event_time: ts
    watermark: {{max_out_of_orderness: {out_of_orderness}}}
"""


def click_records(per_partition: int, partitions: int = 2) -> list[tuple[None, dict[str, Any],
                                                                       int]]:
    """The records `clicks` generates, for a Kafka topic (`(key, value, partition)` for the
    test broker's `produce`): per partition p and offset o, what the datagen generates for
    split p, in order within the partition."""
    return [(None, {"user": f"u{(o * 7 + p) % 13}", "amount": float(o % 10),
                    "ts": BASE_MS + o * 100}, p)
            for o in range(per_partition) for p in range(partitions)]


def files_source(path: Path | str, fmt: str = "jsonl", *, id: str = "events",
                 schema: str | None = EVENTS_SCHEMA, files_per_epoch: int | None = 1,
                 event_time: str | None = "ts", out_of_orderness: str | None = "5s",
                 on_error: str | None = None) -> str:
    """A files source (one file an epoch by default) of the JSON events of
    `test_staged.json_events`, event time `ts`."""
    watermark = f"{{max_out_of_orderness: {out_of_orderness}}}" if out_of_orderness else None
    return f"  - id: {id}\n" + keys("    ", type="files", path=path, format=fmt, schema=schema,
                                    max_files_per_epoch=files_per_epoch, event_time=event_time,
                                    watermark=watermark, on_error=on_error)


def kafka_source(bootstrap: str, topic: str, *, per_epoch: int | str | None,
                 id: str = "clicks", uid: str | None = None, schema: str = CLICKS_SCHEMA,
                 out_of_orderness: str | None = "1s", client: str | None = None,
                 on_error: str | None = None, bounded: bool = True) -> str:
    """A Kafka source (bounded by default) of JSON records whose event time is their `ts` in
    ms, `per_epoch` records an epoch at most (None: no bound)."""
    watermark = f"{{max_out_of_orderness: {out_of_orderness}}}" if out_of_orderness else None
    return f"  - id: {id}\n" + keys(
        "    ", uid=uid, client=client, type="kafka", bootstrap_servers=bootstrap, topic=topic,
        bounded=str(bounded).lower(), max_records_per_epoch=per_epoch, schema=schema,
        event_time="timestamp_millis(ts)", watermark=watermark, on_error=on_error)


#: The filter and derived columns of the staged and Arrow tests' JSON events (`KEEP` reads
#: `events`; `derive` reads `keep`).
KEEP = '  - {id: keep, input: events, filter: "qty >= 0 or amount is null"}\n'


def derive(columns: str) -> str:
    """The stateless `derive` after `KEEP`, adding or replacing `columns` (a flow mapping)."""
    return f"  - {{id: derive, input: keep, with_columns: {columns}}}\n"


def window(id: str, input: str, size: str, aggregate: str = SPENT, *, key_by: str = "[user]",
           uid: str | None = None, emit: str | None = None) -> str:
    """A keyed tumbling window of `size` (`emit: updates` with `emit`)."""
    spec = f"{{tumbling: {size}, emit: {emit}}}" if emit else f"{{tumbling: {size}}}"
    return f"  - id: {id}\n" + (f"    uid: {uid}\n" if uid else "") + f"""\
    input: {input}
    key_by: {key_by}
    window: {spec}
    aggregate: {aggregate}
"""


def totals(id: str = "totals", input: str = "clicks",
           aggregate: str = "{n: count(), spent: sum(amount), last: max(ts)}", *,
           uid: str | None = None) -> str:
    """A rolling aggregate per user (an update stream: `aggregate:` without a window)."""
    return f"  - id: {id}\n" + (f"    uid: {uid}\n" if uid else "") + f"""\
    input: {input}
    key_by: [user]
    aggregate: {aggregate}
"""


def delta_sink(input: str, path: Path | str, *, id: str, merge_key: str | None = None) -> str:
    """A Delta table sink: appended to, or merged into by `merge_key`."""
    merge = f"    mode: merge\n    key: {merge_key}\n" if merge_key else ""
    return f"""\
  - id: {id}
    type: delta
    input: {input}
    path: {path}
""" + merge


def files_sink(input: str | None, path: Path | str, fmt: str = "jsonl", *,
               id: str = "out") -> str:
    """A files sink of `input` into `path` (without `input`, a dead-letter output)."""
    return f"  - id: {id}\n    type: files\n" + (f"    input: {input}\n" if input else "") + \
        f"    path: {path}\n    format: {fmt}\n"


def kafka_sink(input: str, bootstrap: str, topic: str, *, id: str = "out",
               key: str = "user") -> str:
    """A Kafka sink of `input` into `topic`, keyed by `key`."""
    return f"""\
  - id: {id}
    type: kafka
    input: {input}
    bootstrap_servers: {bootstrap}
    topic: {topic}
    key: {key}
"""


def live_job(name: str, root: Path, *, epoch: str, rate: int,
             checkpoint: str | None = None) -> str:
    """A job that runs until it is stopped, for the job-control tests: a datagen of 11 users
    at `rate` records a second through 1-second windows (`per_second`, uid
    `per-second-v1`) into jsonl files in `<root>/out`, its state in `<root>/local`."""
    return (job(name, parallelism=2, epoch=epoch, checkpoint=checkpoint, backend="rocksdb",
                local_dir=root / "local")
            + section("sources", f"""\
  - id: gen
    type: datagen
    rows_per_second: {rate}
    fields:
      user: "concat('u', cast(offset % 11 as string))"
      ts: "timestamp_millis({BASE_MS} + offset * 50)"
    event_time: ts
""")
            + section("operators", window("per_second", "gen", "1s", "{n: count()}",
                                          uid="per-second-v1"))
            + section("sinks", files_sink("per_second", root / "out")))


def crash_job(name: str, root: Path | str, *, backend: str = "rocksdb", limit: int = 600,
              per_epoch: int = 120, attempts: int = 0, rate: int | None = None,
              extra_operators: str = "", **options: Any) -> str:
    """test_crash.py's job up to its sinks: the clicks (2 splits of `limit`, `per_epoch` an
    epoch over both, at most `rate` a second) through the 5-second windows `per_window`, at
    parallelism 2 with a checkpoint every epoch; `extra_operators` go after the windows,
    `options` to `job`."""
    return (job(name, root, backend=backend, attempts=attempts, **options)
            + section("sources", clicks(limit=limit, per_epoch=per_epoch, rate=rate))
            + section("operators", window("per_window", "clicks", "5s", CRASH_AGGREGATE),
                      extra_operators))


def parquet_kvts_job(name: str, storage: Path | str, data: Path | str, sink: Path | str, *,
                     mode: str, backend: str = "rocksdb", parallelism: int = 2,
                     execution: str = "", restart: str = "") -> str:
    """The continuous mode's files job (test_continuous_run.py, the cluster's): parquet
    (k, v, ts) files, a filter `v >= 0`, a 1 s tumbling window of count and sum(v) per k,
    checkpoints every 300 ms, a jsonl files sink; `execution` more keys of
    `job.execution`, `restart` a `job.restart` flow mapping."""
    restart_line = f"  restart: {restart}\n" if restart else ""
    return f"""\
name: {name}
storage: {storage}
job:
  parallelism: {parallelism}
  checkpoint: {{interval: 300ms}}
  state: {{backend: {backend}}}
{restart_line}  execution: {{mode: {mode}{', ' + execution if execution else ''}}}
sources:
  - id: events
    type: files
    path: {data}
    format: parquet
    schema: {{k: string, v: bigint, ts: timestamp}}
    event_time: ts
    watermark: {{max_out_of_orderness: 40ms}}
operators:
  - {{id: keep, input: events, filter: "v >= 0"}}
  - id: per_key
    input: keep
    key_by: [k]
    window: {{tumbling: 1s}}
    aggregate: {{n: count(), total: sum(v)}}
sinks:
  - {{id: out, type: files, input: per_key, path: {sink}, format: jsonl}}
"""
