"""`streamer savepoint trigger|status|list|inspect|dispose|export`."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.table import Table

from streamer.cli.checkpoints import JsonOpt, StorageOpt, default_storage
from streamer.cli.errors import boundary
from streamer.cli.output import human_size, stdout_console, utc_time

savepoint_app = typer.Typer(help="Trigger, list, inspect, export and dispose of savepoints.",
                            no_args_is_help=True, rich_markup_mode=None)

JobArg = Annotated[str, typer.Argument(help="The job name (the pipeline's name:).",
                                       show_default=False)]
PathArg = Annotated[str, typer.Argument(help="The savepoint directory (path or URL).",
                                        show_default=False)]


@savepoint_app.command("trigger")
@boundary
def trigger(job: JobArg, target: Annotated[str | None, typer.Option(
        "--target", help="Directory (URL) to create the savepoint under (default "
        "<storage>/<job>/savepoints).")] = None,
        detach: Annotated[bool, typer.Option(
            "--detach", help="Return at once with the request id.")] = False,
        storage: StorageOpt = None,
        timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait.", min=0.0)
                           ] = 600.0) -> None:
    """Ask a running (or starting) job for a savepoint at its next epoch boundary; wait,
    saying what the job is doing, and print its path. The job keeps running."""
    from streamer.cli.jobs import await_answer, file_request, running_job

    url, record = running_job(job, storage)
    rid = file_request(url, job, record, "savepoint", target=target)
    if detach:
        sys.stdout.write(f"{rid}\n")
        return
    answer = await_answer(url, job, rid, timeout, "savepoint")
    sys.stdout.write(f"{answer['path']}\n")


@savepoint_app.command("status")
@boundary
def status(request: Annotated[str, typer.Argument(help="The request id from --detach.",
                                                  show_default=False)],
           job: Annotated[str | None, typer.Option(
               "--job", help="The job (default: searched under the storage).")] = None,
           storage: StorageOpt = None, as_json: JsonOpt = False) -> None:
    """The state of a savepoint request: pending, accepted (being written), completed (with
    its path) or failed (with why)."""
    from streamer.runtime.job.control import ControlChannel, JobControlError
    from streamer.storage import Storage

    url = default_storage(storage)
    jobs = [job] if job else Storage(url).ls("")
    for name in jobs:
        channel = ControlChannel(url, name)
        if channel.find(request) is None:
            continue
        answer = channel.response(request) or {"status": "pending"}
        answer = {"id": request, "job": name, **answer}
        if as_json:
            sys.stdout.write(json.dumps(answer, indent=2) + "\n")
        else:
            extra = answer.get("path") or ""
            if answer.get("reason"):
                extra = f"{extra} {answer['reason']}".strip()
            stdout_console().print(f"{request} ({name}): {answer['status']} {extra}".rstrip())
        return
    msg = f"no savepoint request {request!r} under {url}"
    raise JobControlError(msg)


@savepoint_app.command("list")
@boundary
def list_cmd(job: JobArg, storage: StorageOpt = None, as_json: JsonOpt = False) -> None:
    """The job's savepoints under `<storage>/<job>/savepoints`, newest first."""
    from streamer.savepoint.savepoint_metadata import list_savepoints

    found = list_savepoints(default_storage(storage), job)
    if as_json:
        sys.stdout.write(json.dumps([
            {"path": url, "ok": meta is not None, "problem": problem,
             **({"created_at": meta.created_at, "epoch": meta.epoch, "size": meta.size,
                 "operators": sorted(meta.operators)} if meta else {})}
            for url, meta, problem in found], indent=2) + "\n")
        return

    table = Table(box=None, header_style="bold")
    for col in ("path", "created (UTC)", "epoch", "size", "operators"):
        table.add_column(col)
    for url, meta, problem in found:
        if meta is None:
            table.add_row(url, "-", "-", "-", f"[red]{problem}[/red]")
        else:
            table.add_row(url, utc_time(meta.created_at), str(meta.epoch), human_size(meta.size),
                          ", ".join(sorted(meta.operators)) or "-")
    console = stdout_console()
    console.print(table if found else f"no savepoints of job {job!r}")


@savepoint_app.command("inspect")
@boundary
def inspect(path: PathArg, as_json: JsonOpt = False) -> None:
    """A savepoint: job, epoch, offsets, watermark, and per operator its definition, state
    names and kinds, key counts and sizes."""
    from streamer.savepoint.savepoint_metadata import read_metadata

    meta = read_metadata(path)
    if as_json:
        body = meta.to_json()
        for op in body["operators"].values():
            op["file_count"] = len(op.get("files", []))
            op.pop("files", None)
        sys.stdout.write(json.dumps(body, indent=2, default=str) + "\n")
        return
    from streamer.runtime.observe.metrics import watermark_time

    console = stdout_console()
    console.print(f"savepoint of job [bold]{meta.job}[/bold] at epoch {meta.epoch}, "
                  f"{utc_time(meta.created_at)} UTC, streamer {meta.streamer_version}, "
                  f"{meta.max_parallelism} key groups"
                  + (", drained" if meta.drained else ""))
    console.print(f"  watermark {watermark_time(meta.watermark.get('current'))}, pipeline "
                  f"{meta.pipeline_fingerprint[:12]}, {human_size(meta.size)}")
    for uid, offsets in sorted(meta.offsets.items()):
        console.print(f"  source {uid}: {json.dumps(offsets)[:160]}")
    table = Table(box=None, header_style="bold")
    for col in ("operator", "uid", "kind", "states", "keys", "key groups", "size",
                "parallelism/backend when saved"):
        table.add_column(col)
    for uid, op in sorted(meta.operators.items()):
        definition = op.get("definition", {})
        states = ", ".join(f"{k} ({v})" for k, v in sorted(op.get("states", {}).items()))
        keys = ", ".join(f"{k}={v:,}" for k, v in sorted(op.get("keys", {}).items()))
        table.add_row(str(op.get("node")), uid, str(definition.get("kind")), states or "-",
                      keys or "0", str(len(op.get("files", []))),
                      human_size(int(op.get("bytes", 0))),
                      f"{op.get('parallelism')}/{op.get('backend')}")
    console.print(table)


@savepoint_app.command("dispose")
@boundary
def dispose_cmd(path: PathArg) -> None:
    """Delete a savepoint (savepoints never expire on their own)."""
    from streamer.savepoint.savepoint_metadata import dispose

    dispose(path)
    stdout_console().print(f"disposed of {path}")


@savepoint_app.command("export")
@boundary
def export(path: PathArg, operator: Annotated[str, typer.Option(
        "--operator", help="The operator uid whose keyed state to export.")],
        output: Annotated[str, typer.Option("--output", "-o", help="The file to write.")],
        fmt: Annotated[str, typer.Option("--format", help="parquet or jsonl.")] = "jsonl",
        ) -> None:
    """Write an operator's keyed state as Parquet or JSON lines: one row per state entry
    (and timer), keys and values decoded, for inspection and migration."""
    from streamer.exceptions import ConfigError
    from streamer.savepoint.export import export_operator
    from streamer.savepoint.savepoint_metadata import SavepointError, read_metadata

    if fmt not in ("parquet", "jsonl"):
        msg = f"--format {fmt!r}: use parquet or jsonl"
        raise ConfigError(msg)
    meta = read_metadata(path)
    if operator not in meta.operators:
        msg = (f"savepoint {path} has no operator uid {operator!r}; it has "
               f"{', '.join(sorted(meta.operators)) or 'none'}")
        raise SavepointError(msg)
    from streamer.storage import Storage

    export_operator(Storage(path).url, meta.operators[operator].get("files", []), output, fmt)
    stdout_console().print(f"wrote {output}")
