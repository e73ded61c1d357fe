"""`streamer checkpoint list|inspect <job>`: a job's checkpoints on its storage."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from streamer.cli.errors import boundary
from streamer.cli.output import human_size, stdout_console, utc_time

if TYPE_CHECKING:
    from streamer.checkpoint.checkpoint_metadata import CheckpointMetadata, CheckpointStore, Listed

checkpoint_app = typer.Typer(help="List and inspect a job's checkpoints.", no_args_is_help=True,
                             rich_markup_mode=None)

JobArg = Annotated[str, typer.Argument(help="The job name (the pipeline's name:).",
                                       show_default=False)]
StorageOpt = Annotated[str | None, typer.Option(
    "--storage", help="Storage URL holding the job (default: $STREAMER_STORAGE, else "
    "./.streamer).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def default_storage(storage: str | None) -> str:
    """`--storage`, else `$STREAMER_STORAGE`, else `./.streamer` (what pipelines default to)."""
    return storage or os.environ.get("STREAMER_STORAGE") or "./.streamer"


def open_store(job: str, storage: str | None) -> CheckpointStore:
    """The job's checkpoint store; a clear error if the storage holds no such job."""
    from streamer.checkpoint.checkpoint_metadata import CheckpointError, CheckpointStore
    from streamer.storage import Storage

    url = default_storage(storage)
    store = CheckpointStore(url, job)
    if not store.ids():
        root = Storage(url)
        jobs = [name for name in root.ls("") if root.exists(f"{name}/checkpoints")]
        where = f"under {root.url}"
        hint = f"; jobs with checkpoints there: {', '.join(jobs)}" if jobs else (
            "; give the storage with --storage or $STREAMER_STORAGE")
        msg = f"job {job!r} has no checkpoints {where}{hint}"
        raise CheckpointError(msg)
    return store


def _offsets(meta: CheckpointMetadata) -> str:
    from streamer.runtime.job.recovery import offsets_summary as _offsets_summary

    return _offsets_summary(meta)


def _listed_json(item: Listed) -> dict[str, Any]:
    meta = item.meta
    out: dict[str, Any] = {"id": item.checkpoint_id,
                           "status": "completed" if item.complete else (
                               "incomplete" if meta is None and (item.problem or "").startswith(
                                   "incomplete") else "corrupt"),
                           "problem": item.problem}
    if meta is not None:
        out.update(time=utc_time(meta.created_at), created_at=meta.created_at, epoch=meta.epoch,
                   state_size=meta.state_size, incremental_size=meta.uploaded_bytes,
                   duration_ms=meta.duration_ms, mode=meta.mode, offsets=meta.offsets,
                   run_id=meta.run_id)
    return out


@checkpoint_app.command("list")
@boundary
def list_cmd(job: JobArg, storage: StorageOpt = None, as_json: JsonOpt = False) -> None:
    """The job's checkpoints, newest first: id, time, epoch, state size, incremental
    (uploaded) size, duration, offsets; incomplete and corrupt ones are marked."""
    store = open_store(job, storage)
    listed = store.list()
    if as_json:
        sys.stdout.write(json.dumps([_listed_json(i) for i in listed], indent=2) + "\n")
        return
    table = Table(box=None, header_style="bold")
    for col, justify in (("id", "right"), ("time (UTC)", "left"), ("epoch", "right"),
                         ("size", "right"), ("incremental", "right"),
                         ("duration", "right"), ("offsets", "left"), ("status", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for item in listed:
        meta = item.meta
        status = "completed" if item.complete else f"[red]{item.problem}[/red]"
        if meta is None:
            table.add_row(str(item.checkpoint_id), "-", "-", "-", "-", "-", "-", status)
            continue
        table.add_row(str(item.checkpoint_id), utc_time(meta.created_at), str(meta.epoch),
                      human_size(meta.state_size), human_size(meta.uploaded_bytes),
                      f"{meta.duration_ms:,.0f} ms", _offsets(meta), status)
    console = stdout_console()
    console.print(f"job [bold]{job}[/bold]  {store.url}")
    console.print(table)


@checkpoint_app.command("inspect")
@boundary
def inspect_cmd(job: JobArg, checkpoint: Annotated[str, typer.Argument(
        help="The checkpoint: its number, or its chk-<n> path.", show_default=False)],
        storage: StorageOpt = None, as_json: JsonOpt = False) -> None:
    """One checkpoint: offsets, watermark, and per keyed operator its subtasks with key
    groups, files (shared and private), sizes and key counts; pending sink commits."""
    store = open_store(job, storage)
    meta = store.resolve(checkpoint) if not checkpoint.isdigit() else store.read(int(checkpoint))
    problem = store.check_files(meta)
    if as_json:
        body = meta.to_json()
        body.update(status="completed" if problem is None else "corrupt", problem=problem,
                    state_size=meta.state_size, incremental_size=meta.uploaded_bytes,
                    path=store.storage.path(store.dir_of(meta.checkpoint_id)))
        sys.stdout.write(json.dumps(body, indent=2, default=str) + "\n")
        return
    from streamer.runtime.observe.metrics import watermark_time

    console = stdout_console()
    console.print(f"checkpoint [bold]{meta.checkpoint_id}[/bold] of job [bold]{job}[/bold]  "
                  f"{store.storage.path(store.dir_of(meta.checkpoint_id))}")
    console.print(f"  taken {utc_time(meta.created_at)} UTC by run {meta.run_id}, epoch "
                  f"{meta.epoch}, mode {meta.mode}, {meta.duration_ms:,.0f} ms")
    console.print(f"  watermark {watermark_time(meta.watermark.get('current'))}  ·  state "
                  f"{human_size(meta.state_size)}, {human_size(meta.uploaded_bytes)} uploaded "
                  "by this checkpoint")
    if problem:
        console.print(f"  [red]not usable: {problem}[/red]")
    console.print("[bold]sources[/bold]")
    for uid, offsets in sorted(meta.offsets.items()):
        for split, value in sorted(offsets.items()):
            shown = f"{len(value)} files, last {value[-1]}" if isinstance(value, list) and value \
                else json.dumps(value)
            console.print(f"  {uid} split {split}: {shown}")
    for uid, op in sorted(meta.operators.items()):
        console.print(f"[bold]operator {op.node}[/bold] (uid {uid}, {op.backend}, parallelism "
                      f"{op.parallelism}, {op.max_parallelism} key groups)")
        table = Table(box=None, header_style="bold")
        for col in ("subtask", "key groups", "version", "files", "shared", "size", "uploaded",
                    "keys"):
            table.add_column(col, justify="right")
        for h in op.subtasks:
            files = h.get("files", [])
            lo, hi = h.get("key_groups", [0, 0])
            keys = ", ".join(f"{k}={v:,}" for k, v in sorted(h.get("keys", {}).items()))
            table.add_row(str(h.get("subtask")), f"{lo}-{hi - 1}", str(h.get("version")),
                          str(len(files)), str(sum(1 for f in files if f.get("shared"))),
                          human_size(int(h.get("state_size", 0))),
                          human_size(int(h.get("uploaded_bytes", 0))), keys or "-")
        console.print(table)
    if meta.sinks:
        console.print("[bold]sink output committed by this checkpoint[/bold]")
        for sink_id, items in sorted(meta.sinks.items()):
            console.print(f"  {sink_id}: epochs {', '.join(str(e) for e, _ in items)}")
