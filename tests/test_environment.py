"""Every `STREAMER_` environment variable is in the generated table, or is test-only.

The package's code (and the docs and README that users read) may name a `STREAMER_` variable
only if `streamer.environment` registers it (the docs' table is rendered from that registry)
or if it starts with `STREAMER_TEST_` (read by the test suite only).
"""

from __future__ import annotations

import re
from pathlib import Path

from streamer.environment import TEST_PREFIX, reference_markdown, variables

REPO = Path(__file__).resolve().parents[1]
#: Folders of the repository that are not the package (they may set product variables, and
#: name test-only ones freely).
NOT_PACKAGE = {"tests", "bench", "scripts", "build", "dist"}
NAME = re.compile(r"\bSTREAMER_[A-Z0-9_]*[A-Z0-9]\b")


def _package_files() -> list[Path]:
    return [p for p in sorted(REPO.rglob("*.py"))
            if not (set(p.relative_to(REPO).parts[:-1]) & NOT_PACKAGE)
            and not any(part.startswith(".") for part in p.relative_to(REPO).parts)]


def _names_in(paths: list[Path]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in NAME.findall(line):
                found.setdefault(name, []).append(f"{path.relative_to(REPO)}:{number}")
    return found


REGISTERED = {v.name for v in variables()}


def test_the_scan_sees_the_variables_the_code_reads() -> None:
    """The scan is not vacuous: it finds the reads it must (a file moved out of its reach
    would make the other tests pass for nothing)."""
    names = _names_in(_package_files())
    assert {"STREAMER_STATE_DIR", "STREAMER_LOG_DIR", "STREAMER_STORAGE",
            "STREAMER_LOCAL_ROWS"} <= set(names)


def test_every_variable_the_package_names_is_documented_or_test_only() -> None:
    names = _names_in(_package_files())
    undocumented = {name: where for name, where in names.items()
                    if name not in REGISTERED and not name.startswith(TEST_PREFIX)}
    assert not undocumented, (
        "register these in streamer/environment.py (the docs' table), or rename them "
        f"{TEST_PREFIX}* if only tests read them: {undocumented}")


def test_every_registered_variable_is_read_by_the_package() -> None:
    names = _names_in([p for p in _package_files() if p.name != "environment.py"])
    assert not REGISTERED - set(names), "registered but never read: remove them"


def test_the_docs_name_only_documented_or_test_only_variables() -> None:
    pages = [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md"]
    names = _names_in(pages)
    unknown = {name: where for name, where in names.items()
               if name not in REGISTERED and not name.startswith(TEST_PREFIX)}
    assert not unknown


def test_the_table_lists_every_variable_once() -> None:
    page = reference_markdown()
    for name in REGISTERED:
        assert page.count(f"| `{name}` |") == 1, name
    assert {"STREAMER_STATE_DIR", "STREAMER_LOG_DIR"} <= REGISTERED
