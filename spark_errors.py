"""Spark's errors as one line a user can read. A core module: connectors, the expression
analysis and the runtime all report Spark's errors, and connectors may not import runtime.
"""

from __future__ import annotations

import re

#: How a keyed subtask that reads parquet files itself names one it cannot decode
#: (operators/direct.py), as Spark's FAILED_READ_FILE error names it for its own scan.
UNREADABLE_FILE = "cannot read the parquet file "


def unreadable_file(text: str) -> tuple[str, str] | None:
    """(the file, why) when a Spark error says a file could not be read: Spark's
    `FAILED_READ_FILE` (why: its deepest cause, e.g. a damaged page header) or a keyed
    subtask's direct read (`UNREADABLE_FILE`). The file as a local path when it is one."""
    from urllib.parse import unquote, urlparse

    found = re.search(r"FAILED_READ_FILE[.\w]*\] Encountered error while reading file "
                      r"(\S+?)\.?\s", text)
    if found:
        causes = re.findall(r"Caused by: (?:[\w.$]+(?:Exception|Error): )?([^\n]*)", text)
        reason = next((c.strip() for c in reversed(causes) if c.strip()), "unreadable")
        url = found.group(1)
        return (unquote(urlparse(url).path) if url.startswith("file:") else url), reason
    found = re.search(re.escape(UNREADABLE_FILE) + r"'([^']+)': ([^\n]*)", text)
    if found:
        return found.group(1), found.group(2).strip()
    return None


def spark_error_message(exc: BaseException) -> str:
    """The first meaningful line of a Spark error, without the JVM stack trace or plan."""
    text = str(exc)
    if text.startswith("An error occurred while calling") and "\n" in text:
        # py4j's own first line says only which call failed; the error is the next one.
        text = re.sub(r"^:?\s*(?:[\w.$]+(?:Exception|Error): )?", "",
                      text.split("\n", 1)[1].lstrip())
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
