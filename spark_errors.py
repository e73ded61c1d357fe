"""Spark's errors as one line a user can read. A core module: connectors, the expression
analysis and the runtime all report Spark's errors, and connectors may not import runtime.
"""

from __future__ import annotations

import re


def spark_error_message(exc: BaseException) -> str:
    """The first meaningful line of a Spark error, without the JVM stack trace or plan."""
    text = str(exc)
    if "Traceback (most recent call last)" in text:  # a Python worker failed: its last line
        lines = [ln.strip() for ln in text.split("Traceback (most recent call last)")[-1]
                 .splitlines() if ln.strip() and not ln.startswith((" ", "\t"))]
        tail = [ln for ln in lines if not ln.startswith(("File ", "^", ":"))]
        if tail:
            return f"Python worker failed: {tail[-1]}"
    for marker in ("\n\tat ", "\nJVM stacktrace", "; line 1 pos", "\n'", "\n+-", "\n=="):
        cut = text.find(marker)
        if cut > 0:
            text = text[:cut]
    text = re.sub(r"\s*SQLSTATE: \w+\.?", "", text)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
