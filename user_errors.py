"""Errors in user code (a process function, a loader), told in the user's terms: the
operator, the user's own frames as `file.py:line in function` and the exception, without
streamer's, PySpark's or the JVM's frames (`--debug` shows them all).

The task that ran the user's code raises `UserCodeError`; its message travels inside
Spark's error text after `USER_ERROR_MARKER` (as a JSON string), and the driver finds
it there (`user_error_message`) and reports it instead of the stage that happened to fail.
"""

from __future__ import annotations

import json
import os
import traceback

from streamer.exceptions import StreamerError

USER_ERROR_MARKER = "streamer-user-error: "

_ROOT = os.path.dirname(os.path.abspath(__file__))
_STDLIB = os.path.dirname(os.path.abspath(traceback.__file__)) + os.sep


class UserCodeError(StreamerError):
    """Raised when user code (a process function, a loader) raised an exception; the
    message names the operator and shows the user's frames. Fix the user code (the last
    frame shown is where the exception was raised), or run with --debug for every frame."""


def _streamers(path: str) -> bool:
    """Whether `path` is a module of streamer (a top-level module or one of a package:
    examples and tests beside them are not)."""
    rel = os.path.relpath(path, _ROOT)
    if rel.startswith(".."):
        return False
    top = rel.split(os.sep)[0]
    package = top != "tests" and os.path.isfile(os.path.join(_ROOT, top, "__init__.py"))
    return top.endswith(".py") or package


def _users(filename: str) -> bool:
    path = os.path.abspath(filename)
    return not (filename.startswith("<") or _streamers(path) or path.startswith(_STDLIB)
                or "site-packages" in path or f"{os.sep}pyspark{os.sep}" in path)


def _shown(filename: str) -> str:
    """A user file as the user knows it: relative to the working directory when under it;
    a copy Spark shipped to its workers (`addPyFile`) by its name."""
    parts = os.path.abspath(filename).split(os.sep)
    if any(p.startswith("userFiles-") for p in parts):
        return parts[-1]
    rel = os.path.relpath(filename)
    return filename if rel.startswith("..") else rel


def describe(exc: BaseException, owner: str) -> str:
    """`owner` failed in user code: the user's frames, then `Type: message`."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _users(f.filename)]
    lines = [f"{owner} failed in user code:"]
    for f in frames:
        where = _shown(f.filename)
        lines.append(f"  {where}:{f.lineno} in {f.name}")
        if f.line:
            lines.append(f"    {f.line.strip()}")
    detail = str(exc)
    lines.append(f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__)
    return "\n".join(lines)


def user_error(exc: BaseException, owner: str) -> UserCodeError | None:
    """The `UserCodeError` to raise for `exc` (raised while user code ran for `owner`), its
    message marked so that the driver finds it in Spark's error text; None when no frame
    of its traceback is the user's (streamer's own failure: raise it as it is)."""
    if not any(_users(f.filename) for f in traceback.extract_tb(exc.__traceback__)):
        return None
    return UserCodeError(USER_ERROR_MARKER + json.dumps(describe(exc, owner)))


def user_error_message(text: str) -> str | None:
    """The user-code failure a (Spark) error's text carries, or None."""
    at = text.find(USER_ERROR_MARKER)
    if at < 0:
        return None
    try:
        found, _ = json.JSONDecoder().raw_decode(text, at + len(USER_ERROR_MARKER))
    except ValueError:
        return None
    return found if isinstance(found, str) else None
