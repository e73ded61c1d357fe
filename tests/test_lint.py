"""ruff and mypy over the whole package, as part of the test run (CI runs one command)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
#: mypy's incremental cache, kept where the machine keeps streamer's other downloads and builds
#: (CI's too): a warm run takes under a second instead of ~20 s on 2 busy cores. mypy checks
#: each module's hash against it, so a changed file is checked again; the cache only saves work.
MYPY_CACHE = Path(os.environ.get("STREAMER_CACHE") or Path.home() / ".cache" / "streamer") / "mypy"


def test_ruff_is_clean() -> None:
    out = subprocess.run([str(BIN / "ruff"), "check", "."], cwd=REPO, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_is_clean(tmp_path: Path) -> None:
    (tmp_path / "streamer").symlink_to(REPO, target_is_directory=True)
    env = {**os.environ, "MYPYPATH": str(tmp_path)}
    out = subprocess.run([str(BIN / "mypy"), "--config-file", str(REPO / "pyproject.toml"),
                          "--cache-dir", str(MYPY_CACHE), "-p", "streamer"],
                         cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
