"""Running a loaded pipeline in this process with the CLI's reporters, shared by `run`
(cli/main.py) and `restore` (cli/jobs.py): main.py imports jobs.py to register its commands,
so jobs.py cannot import main.py back.
"""

from __future__ import annotations

import contextlib
import sys
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from rich.console import Console

from streamer.cli.errors import err_console

if TYPE_CHECKING:
    from streamer.runtime.observe.metrics import LiveReporter


def parse_conf(conf: list[str] | None) -> dict[str, str]:
    """`--conf KEY=VALUE` items as a dict, or a clear error."""
    extra = {}
    for item in conf or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            from streamer.exceptions import ConfigError

            msg = (f"--conf {item!r} must be KEY=VALUE, e.g. "
                   "--conf spark.sql.shuffle.partitions=4")
            raise ConfigError(msg)
        extra[key.strip()] = value
    return extra


def run_job(spec: object, *, quiet: bool = False, json_lines: bool = False,
            master: str | None = None, conf: list[str] | None = None,
            max_epochs: int | None = None, no_ui: bool = False,
            from_checkpoint: str | None = None, fresh: bool = False,
            no_checkpoints: bool = False, storage: str | None = None,
            from_savepoint: str | None = None, allow_non_restored_state: bool = False,
            metrics_port: int | None = None) -> None:
    """Run a loaded pipeline with the CLI's reporters (shared by `run` and `restore`). The
    live display is up before pyspark is imported, so it shows Spark starting from the first
    second (a cold start takes a minute on a loaded machine)."""
    from streamer.runtime.observe.metrics import JsonReporter, LiveReporter, QuietReporter, Reporter

    extra = parse_conf(conf)
    if sum(map(bool, (fresh, from_checkpoint, from_savepoint))) > 1:
        from streamer.exceptions import ConfigError

        msg = ("--fresh, --from-checkpoint and --from-savepoint contradict each other; give "
               "one of them")
        raise ConfigError(msg)
    from streamer.runtime.exceptions import JobFinishedError
    from streamer.runtime.job.preflight import PreflightOptions, preflight

    try:
        preflight(spec, PreflightOptions(  # type: ignore[arg-type]
            storage=storage, from_savepoint=from_savepoint, from_checkpoint=from_checkpoint,
            fresh=fresh, checkpoints=not no_checkpoints), warn=warn)
    except JobFinishedError as exc:
        from rich.text import Text

        err_console().print(Text(str(exc), style="green"))
        return
    reporter: Reporter
    display: AbstractContextManager[object] = contextlib.nullcontext()
    # Where console sinks print: stdout, or, when stdout and the live display share the
    # terminal, the display's console, which prints them above the display (rich does not
    # let one Console's output pass through another's Live).
    sinks_console: Console | None = None
    if quiet:
        reporter = QuietReporter()
    elif json_lines:
        reporter = JsonReporter()
    else:
        reporter = display = _live_reporter(LiveReporter)(Console(stderr=True, highlight=False))
        shared = sys.stdout.isatty() and reporter.console.is_terminal
        sinks_console = reporter.console if shared else Console(stderr=False, highlight=False)
    with display:
        from streamer.runtime.job.coordinator import JobRunner, RunOptions

        options = RunOptions(
            master=master, spark_conf=extra, ui=not no_ui, max_epochs=max_epochs,
            console=sinks_console,
            checkpoints=not no_checkpoints, from_checkpoint=from_checkpoint, fresh=fresh,
            storage=storage, from_savepoint=from_savepoint,
            allow_non_restored_state=allow_non_restored_state, metrics_port=metrics_port)
        JobRunner(spec, options, reporter=reporter).run()  # type: ignore[arg-type]


def warn(message: str) -> None:
    """One yellow line on stderr."""
    err_console().print(f"[yellow]warning[/yellow] {message}", soft_wrap=True)


def _live_reporter(base: type[LiveReporter]) -> type[LiveReporter]:
    """The live display, whose end line leaves a failure's reason to the CLI's error
    boundary: it prints the error once, after the display."""

    class FailureOnce(base):  # type: ignore[valid-type,misc]
        def finished(self, summary: dict[str, Any]) -> None:
            if summary.get("status") not in ("finished", "stopped"):
                summary = {**summary, "reason": "(the error follows)"}
            super().finished(summary)

    return FailureOnce
