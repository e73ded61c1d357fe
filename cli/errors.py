"""The CLI's one error boundary and its exit codes.

| code | meaning                                                        |
|------|----------------------------------------------------------------|
| 0    | success                                                        |
| 1    | invalid pipeline, failed job, or a `streamer test` mismatch    |
| 2    | invalid command line                                           |
| 3    | Java 17+ is missing                                            |
| 70   | internal error (a bug in streamer; `--debug` shows the trace)  |
| 130  | cancelled with Ctrl-C                                          |
| 143  | cancelled by SIGTERM (a second one, or past job.shutdown_timeout) |
"""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console

from streamer.exceptions import StreamerError
from streamer.pipeline.exceptions import PipelineError

EXIT_INTERNAL = 70
EXIT_CANCELLED = 130

F = TypeVar("F", bound=Callable[..., Any])

#: Set by the global `--debug` option.
state = {"debug": False}


def err_console() -> Console:
    """A console on stderr (created per call so test runners can capture it)."""
    return Console(stderr=True, highlight=False, soft_wrap=True)


def print_error(exc: StreamerError) -> None:
    """One short red message per problem."""
    console = err_console()
    if isinstance(exc, PipelineError):
        for problem in exc.problems:
            console.print(f"[red]error[/red] {problem}", markup=True, highlight=False)
        n = len(exc.problems)
        console.print(f"[red]{n} problem{'s' if n != 1 else ''}[/red]")
    else:
        console.print(f"[red]error[/red] {exc}", markup=True, highlight=False)


def boundary(func: F) -> F:
    """Wrap a command: known errors print one message and exit with their code; anything
    else is an internal error, shown with a traceback only under `--debug`.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except StreamerError as exc:
            if state["debug"]:
                traceback.print_exc()
            print_error(exc)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt as exc:  # runtime's JobTerminatedError carries 143
            err_console().print(f"[yellow]cancelled[/yellow]{f' ({exc})' if str(exc) else ''}")
            raise typer.Exit(getattr(exc, "exit_code", EXIT_CANCELLED)) from None
        except Exception as exc:
            if state["debug"]:
                traceback.print_exc(file=sys.stderr)
            err_console().print(f"[red]internal error[/red] {type(exc).__name__}: {exc}\n"
                                "This is a bug in streamer; run again with --debug for the "
                                "traceback and report it.", markup=True, highlight=False)
            raise typer.Exit(EXIT_INTERNAL) from None

    return wrapper  # type: ignore[return-value]
