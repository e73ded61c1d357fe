"""The seconds each test module took in a whole run, which `pytest -n` starts longest first
(tests/conftest.py): `durations.json` beside this file.

    .venv/bin/pytest --junitxml=/tmp/junit.xml            # a whole run, in one process
    .venv/bin/python tests/durations.py /tmp/junit.xml     # writes tests/durations.json

Stale numbers only change the order the modules start in, never what a test does.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

FILE = Path(__file__).with_name("durations.json")
ROOT = Path(__file__).resolve().parents[1]


def module_of(classname: str) -> str:
    """The module path of a JUnit test case's class name (`tests.a.test_b`, or
    `tests.a.test_b.TestClass` for a test class's method)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (ROOT / path).is_file():
            return path
    return "/".join(parts) + ".py"


def module_seconds(junit: Path) -> dict[str, int]:
    """Each module's seconds (its path under the repository, as pytest's node ids give it),
    from a JUnit XML report."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        seconds[module_of(case.get("classname", ""))] += float(case.get("time") or 0)
    return {module: round(s) for module, s in sorted(seconds.items())}


if __name__ == "__main__":
    FILE.write_text(json.dumps(module_seconds(Path(sys.argv[1])), indent=1) + "\n")
    print(f"wrote {FILE}")
