"""The docs site builds with `mkdocs build --strict` (so a broken link or anchor fails the test
run, and CI), its pipeline file reference is generated with every key, and the quick-start
lines of the README and the docs stay the same.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from streamer.pipeline.reference import key_paths
from streamer.pipeline.schema import json_schema

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
#: The three lines users and .ci/run rely on, exactly as the README gives them.
QUICK_START = (
    "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]'   # 1. set up",
    ".venv/bin/streamer run pipelines/clickstream.yaml               # 2. run the main example",
    ".venv/bin/pytest -q                                             # 3. run the tests "
    "(what CI runs)",
)


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of `config` into `site`."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "--config-file",
                           str(config), "--site-dir", str(site)],
                          cwd=config.parent, capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def test_docs_build_strict_with_the_generated_reference(tmp_path: Path) -> None:
    out = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert out.returncode == 0, out.stdout + out.stderr
    page = (tmp_path / "site" / "reference" / "pipeline-file" / "index.html").read_text()
    missing = [p for p in key_paths(json_schema())
               if f"<code>{html.escape(p, quote=False)}</code>" not in page]
    assert missing == []
    assert (tmp_path / "site" / "reference" / "pipeline-v1.schema.json").exists()
    for built in ("index.html", "concepts/epochs/index.html", "operations/kafka/index.html",
                  "performance/index.html", "latency/index.html", "architecture/index.html"):
        assert (tmp_path / "site" / built).exists(), built


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    page = tmp_path / "docs" / "concepts" / "epochs.md"
    original = page.read_text()
    page.write_text(original + "\nSee [nowhere](../no-such-page.md).\n")
    out = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert out.returncode != 0
    assert "no-such-page.md" in out.stdout + out.stderr
    page.write_text(original + "\nSee [the key](../reference/pipeline-file.md#no-such-key).\n")
    out = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert out.returncode != 0
    assert "no-such-key" in out.stdout + out.stderr


def test_quick_start_lines_are_the_same_everywhere() -> None:
    for doc in ("README.md", "docs/index.md", "docs/getting-started.md"):
        text = (REPO / doc).read_text()
        assert all(line in text.splitlines() for line in QUICK_START), doc


def test_readme_links_point_at_docs_pages() -> None:
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert links
    for link in links:
        assert (REPO / link).is_file(), link
