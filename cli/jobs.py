"""Job control commands: `streamer list`, `stop`, `cancel` and `restore`.

They act through the job's storage (registry `job.json`, `control/` requests), so they work
wherever the job runs as long as the storage is shared.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from streamer.cli.checkpoints import JsonOpt, StorageOpt, default_storage
from streamer.cli.errors import boundary
from streamer.cli.output import stdout_console, utc_time

JobArg = Annotated[str, typer.Argument(help="The job name (the pipeline's name:).",
                                       show_default=False)]
TimeoutOpt = Annotated[float, typer.Option(
    "--timeout", help="Seconds to wait for the job to answer.", min=0.0)]


def running_job(job: str, storage: str | None) -> tuple[str, dict[str, Any]]:
    """The storage URL and record of a job that is running now (clear errors otherwise)."""
    from streamer.runtime.job.control import JobControlError, JobRegistry, state_of

    url = default_storage(storage)
    record = JobRegistry(url, job).read()
    if record is None:
        msg = (f"no job {job!r} under {url}; `streamer list --storage URL` shows the jobs "
               "there")
        raise JobControlError(msg)
    state = state_of(record)
    if state != "running":
        msg = f"job {job!r} is not running (it is {state}, last run {record.get('run_id')})"
        raise JobControlError(msg)
    return url, record


def file_request(url: str, job: str, record: dict[str, Any], kind: str, **params: Any) -> str:
    """File a request to the run in `record` (a later run of the job refuses it, saying
    why, rather than acting on a request meant for an earlier one); its id."""
    from streamer.runtime.job.control import ControlChannel

    return ControlChannel(url, job).request(kind, generation=record.get("generation"),
                                            run_id=record.get("run_id"), **params)


def await_answer(url: str, job: str, rid: str, timeout: float, what: str) -> dict[str, Any]:
    """Wait for the job's answer, saying on stderr what the job is doing meanwhile."""
    from streamer.cli.errors import err_console
    from streamer.runtime.job.control import ControlChannel, JobControlError

    console = err_console()

    def progress(doing: str) -> None:
        console.print(f"job {job}: {doing}; waiting for it to take the {what}")

    answer = ControlChannel(url, job).wait(rid, timeout, progress=progress)
    if answer is None or answer.get("status") == "accepted":
        msg = (f"job {job!r} did not finish the {what} within {timeout:g} s (request {rid}; "
               f"`streamer savepoint status {rid} --job {job}` shows its progress)")
        raise JobControlError(msg)
    if answer.get("status") == "failed":
        msg = f"the {what} failed: {answer.get('reason')}"
        raise JobControlError(msg)
    return answer


def register_job_commands(app: typer.Typer) -> None:
    """Add `list`, `stop`, `cancel` and `restore` to the CLI."""

    @app.command("list")
    @boundary
    def list_cmd(storage: StorageOpt = None, as_json: JsonOpt = False) -> None:
        """The jobs under the storage: running, finished, stopped, failed, cancelled, or dead
        (its heartbeat stopped), with key figures."""
        from streamer.runtime.job.control import list_jobs

        jobs = sorted(list_jobs(default_storage(storage)),
                      key=lambda j: -float(j.get("started_at", 0)))
        if as_json:
            sys.stdout.write(json.dumps(jobs, indent=2, default=str) + "\n")
            return
        table = Table(box=None, header_style="bold")
        for col in ("job", "state", "run", "started (UTC)", "heartbeat", "epoch",
                    "last checkpoint", "records in", "host/pid"):
            table.add_column(col)
        now = time.time()
        for j in jobs:
            beat = now - float(j.get("heartbeat_at", now))
            table.add_row(str(j.get("job")), str(j.get("state")), str(j.get("run_id")),
                          utc_time(j.get("started_at")), f"{beat:,.0f} s ago",
                          str(j.get("epoch", "-")), str(j.get("last_checkpoint", "-")),
                          f"{int(j.get('records_in') or 0):,}",
                          f"{j.get('host')}/{j.get('pid')}")
        console = stdout_console()
        if not jobs:
            console.print(f"no jobs under {default_storage(storage)}")
            return
        console.print(table)

    @app.command("stop")
    @boundary
    def stop_cmd(job: JobArg, savepoint: Annotated[bool, typer.Option(
            "--savepoint", help="Take a savepoint as the job stops; prints its path.")] = False,
            drain: Annotated[bool, typer.Option(
                "--drain", help="With --savepoint: first advance the watermark to the end, "
                "so every window and event-time timer fires (nothing pending is saved).")
            ] = False,
            target: Annotated[str | None, typer.Option(
                "--target", help="Directory (URL) to create the savepoint under.")] = None,
            storage: StorageOpt = None, timeout: TimeoutOpt = 600.0) -> None:
        """Stop a running job at its next epoch boundary, after a final checkpoint (and with
        --savepoint, a savepoint)."""
        from streamer.exceptions import ConfigError

        if drain and not savepoint:
            msg = "--drain goes with --savepoint"
            raise ConfigError(msg)
        url, record = running_job(job, storage)
        rid = file_request(url, job, record, "stop", savepoint=savepoint, drain=drain,
                       target=target)
        if not savepoint:
            await_answer(url, job, rid, timeout, "stop request")
            stdout_console().print(f"job {job} is stopping at its next epoch boundary")
            return
        answer = await_answer(url, job, rid, timeout, "stop with savepoint")
        sys.stdout.write(f"{answer['path']}\n")

    @app.command("cancel")
    @boundary
    def cancel_cmd(job: JobArg, storage: StorageOpt = None,
                   timeout: TimeoutOpt = 600.0) -> None:
        """Cancel a running job at its next epoch boundary, without a final checkpoint (the
        next run resumes from its last checkpoint)."""
        url, record = running_job(job, storage)
        rid = file_request(url, job, record, "cancel")
        await_answer(url, job, rid, timeout, "cancel request")
        stdout_console().print(f"job {job} is cancelled")

    @app.command("restore")
    @boundary
    def restore_cmd(
        savepoint: Annotated[str, typer.Argument(help="The savepoint directory (path or URL).",
                                                 show_default=False)],
        file: Annotated[Path, typer.Argument(help="The pipeline YAML file.",
                                             show_default=False)],
        parallelism: Annotated[int | None, typer.Option(
            "--parallelism", help="Run the keyed operators at this parallelism (key groups "
            "are redistributed).", min=1)] = None,
        allow_non_restored_state: Annotated[bool, typer.Option(
            "--allow-non-restored-state", help="Drop state whose operator uid is no longer "
            "in the pipeline instead of refusing.")] = False,
        dry_run: Annotated[bool, typer.Option(
            "--dry-run", help="Only say, per operator, whether its state would be restored, "
            "started empty, dropped or refused; exit 1 if anything would fail.")] = False,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")
                         ] = False,
        json_lines: Annotated[bool, typer.Option("--json", help="JSON lines, as for run.")
                              ] = False,
        max_epochs: Annotated[int | None, typer.Option(
            help="Stop after this many epochs that read data.", min=1)] = None,
        no_ui: Annotated[bool, typer.Option("--no-ui", help="Do not start Spark's web UI.")
                         ] = False,
        storage: Annotated[str | None, typer.Option(
            help="Storage URL for the job's checkpoints (default: the file's storage:).")
        ] = None,
        metrics_port: Annotated[int | None, typer.Option(
            "--metrics-port", min=1, max=65535, help="Serve Prometheus metrics on this port, "
            "as for run.")] = None,
    ) -> None:
        """Start a pipeline from a savepoint: state maps by operator uid (new operators start
        empty), sources resume at the savepoint's offsets, parallelism and state backend may
        differ from the savepoint's."""
        from dataclasses import replace

        from streamer.cli.launch import run_job
        from streamer.pipeline.validate import load_pipeline

        spec = load_pipeline(str(file))
        if parallelism is not None:
            spec = replace(spec, job=replace(spec.job, parallelism=parallelism))
        if dry_run:
            _dry_run(savepoint, spec, allow_non_restored_state, as_json=json_lines)
            return
        run_job(spec, quiet=quiet, json_lines=json_lines, max_epochs=max_epochs, no_ui=no_ui,
                storage=storage, from_savepoint=savepoint,
                allow_non_restored_state=allow_non_restored_state, metrics_port=metrics_port)


def _dry_run(savepoint: str, spec: Any, allow: bool, *, as_json: bool) -> None:
    from streamer.savepoint.savepoint_metadata import SavepointError, plan_restore, read_metadata

    meta = read_metadata(savepoint)
    decisions = plan_restore(meta, spec, allow_non_restored=allow)
    refused = [d for d in decisions if d.action == "refuse"]
    if as_json:
        sys.stdout.write(json.dumps({"savepoint": savepoint, "ok": not refused, "operators": [
            d.__dict__ for d in decisions]}, indent=2) + "\n")
    else:
        table = Table(box=None, header_style="bold")
        for col in ("operator", "uid", "state", "why"):
            table.add_column(col)
        style = {"restore": "green", "start-empty": "cyan", "drop": "yellow", "refuse": "red"}
        for d in decisions:
            table.add_row(d.operator, d.uid, f"[{style[d.action]}]{d.action}[/]", d.reason)
        console = stdout_console()
        console.print(f"savepoint {savepoint} (epoch {meta.epoch}) into {spec.file}:")
        console.print(table if decisions else "  no keyed state on either side")
    if refused:
        msg = (f"restoring would fail: {len(refused)} operator"
               f"{'s' if len(refused) != 1 else ''} refused ("
               + ", ".join(d.operator for d in refused) + ")")
        raise SavepointError(msg)
