"""The root of every error streamer raises on purpose.

The CLI's error boundary prints any `StreamerError` as one short message and exits with its
`exit_code`; anything else is a bug in streamer and shows a traceback only with `--debug`.
"""

from __future__ import annotations


class StreamerError(Exception):
    """Raised for a problem the user can fix; the message says what happened and what to do."""

    exit_code = 1


class ArrowRefused(Exception):
    """Arrow's answer for these rows is not certainly Spark's, so Spark computes them instead
    (`connectors.arrow.arrow_json`, `connectors.arrow.arrow_json_writer`, `runtime.arrow.arrow_sql`,
    `runtime.arrow.arrow_input`). Never reaches a user: the caller leaves the file, range or rows to
    Spark's path."""


class ConfigError(StreamerError):
    """Raised for an invalid command-line option or setting; fix the option named in the message."""

    exit_code = 2
