"""How the CLI's commands print: a console for stdout, UTC times and byte sizes."""

from __future__ import annotations

import datetime as dt
import sys

from rich.console import Console


def stdout_console() -> Console:
    """stdout; wide when not a terminal, so piped tables keep every column."""
    return Console(highlight=False, soft_wrap=True,
                   width=None if sys.stdout.isatty() else 220)


def utc_time(seconds: float | None) -> str:
    """A Unix time as `YYYY-mm-dd HH:MM:SS` (UTC); `-` when there is none."""
    if not seconds:
        return "-"
    return dt.datetime.fromtimestamp(float(seconds), dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def human_size(n: int) -> str:
    """A byte count in B, KiB, MiB or GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{n} B"
