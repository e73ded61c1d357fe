"""The docs site builds with `mkdocs build --strict` (so a broken link or anchor fails the test
run, and CI), its pipeline file reference is generated with every key, the quick-start
lines of the README and the docs stay the same, the files the docs cite exist, and five pages
look right in a real browser.

The browser: headless Chromium renders five pages at 1280 px, and a script in each page
measures what a reader would see: the page rendered (a title, its diagrams loaded), no element
sticks out of the text column, no code block needs a horizontal scrollbar, and in the pipeline
reference no key is broken across lines. Screenshots go to `$STREAMER_TEST_DOCS_SCREENSHOTS` when
it is set (to look at them), else to the test's temporary folder. Chromium comes from
Debian's `chromium` package (.ci/run installs it); without it those tests are skipped, saying
so.
"""

from __future__ import annotations

import functools
import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
    environment = (tmp_path / "site" / "reference" / "environment" / "index.html").read_text()
    assert "<code>STREAMER_STATE_DIR</code>" in environment
    assert "<code>STREAMER_LOG_DIR</code>" in environment
    for built in ("index.html", "concepts/epochs/index.html", "operations/kafka/index.html",
                  "performance/index.html", "latency/index.html", "architecture/index.html"):
        assert (tmp_path / "site" / built).exists(), built


@pytest.mark.slow
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


# ------------------------------------------------------------------ files the docs cite
#: A file name in running text or code: `runtime/observe/metrics.py`, `PIPELINE_SPEC.md`.
FILE_NAME = re.compile(r"(?<![\w/.-])((?:\.{1,2}/)*(?:[\w.-]+/)*[\w-]+"
                       r"\.(?:md|py|ya?ml|json|toml|properties|sh|svg|css))\b")
#: Pages the docs build generates (docs/hooks.py): cited, but not files in the repository.
GENERATED = ("reference/pipeline-file.md", "reference/pipeline-v1.schema.json",
             "reference/environment.md")


def cites_the_repository(name: str) -> bool:
    """Whether a file name in the docs names a file of this repository (not one of the
    user's, such as `pipeline.yaml` or `shop-metrics/README.md`): a path that starts at one
    of the repository's top-level entries, a module (`worker.py`), or a project document in
    capitals (`ARCHITECTURE.md`)."""
    path = name.removeprefix("./").removeprefix("streamer/")
    first = path.split("/")[0]
    return ((REPO / first).exists() and first not in ("docs", ".venv") and "/" in path) or \
        re.fullmatch(r"[A-Z][A-Z0-9_]*\.md", path) is not None or \
        ("/" not in path and path.endswith(".py")) or path.startswith("docs/")


@functools.cache
def modules() -> frozenset[str]:
    """The names of the repository's Python files (a bare `worker.py` cites one)."""
    found = set()
    for _top, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "site")]
        found.update(f for f in files if f.endswith(".py"))
    return frozenset(found)


def missing_citations(page: Path, docs: Path) -> list[str]:
    """The repository files `page` cites that do not exist."""
    missing = []
    for name in FILE_NAME.findall(page.read_text()):
        path = name.removeprefix("./").removeprefix("streamer/")
        if not cites_the_repository(name) and not name.startswith(".."):
            continue
        here = [REPO / path, page.parent / name, docs / path]
        if any(p.exists() for p in here) or path in modules() or any(
                (p.resolve() == (docs / g).resolve()) for p in here for g in GENERATED):
            continue
        missing.append(f"{page.relative_to(docs.parent)}: {name}")
    return missing


def test_the_docs_cite_only_files_that_exist() -> None:
    """A page that cites `PIPELINE_SPEC.md` or `runtime/gone.py` sends the reader after a
    file that is not in the repository."""
    pages = [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md"]
    missing = [m for page in pages for m in missing_citations(page, REPO / "docs")]
    assert missing == []


def test_a_cited_file_that_does_not_exist_is_found(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "guide").mkdir(parents=True)
    page = docs / "guide" / "page.md"
    page.write_text("The contract is `PIPELINE_SPEC.md`; see runtime/observe/metrics.py, "
                    "runtime/gone.py, `pipeline.yaml`, [this](../reference/pipeline-file.md) "
                    "and [that](../no-such-page.md).\n")
    assert missing_citations(page, docs) == [
        "docs/guide/page.md: PIPELINE_SPEC.md", "docs/guide/page.md: runtime/gone.py",
        "docs/guide/page.md: ../no-such-page.md"]



#: A docs page or a project document cited by the code: `docs/concepts/epochs.md`, `README.md`.
CITED_DOC = re.compile(r"(?<![\w/.-])((?:docs/[\w/.-]+|[A-Z][A-Z0-9_]*)\.md)\b")


def test_the_code_cites_only_docs_that_exist() -> None:
    """Twelve modules cited `ARCHITECTURE.md §5` and the like, a file that is not in the
    repository; a module of the package, or pyproject.toml, that names a page names one that
    exists."""
    sources = [p for p in sorted(REPO.rglob("*.py"))
               if not any(part.startswith(".") or part in ("build", "site", "tests", "bench",
                                                            "scripts")
                          for part in p.relative_to(REPO).parts)]
    missing = [f"{p.relative_to(REPO)}: {name}"
               for p in [*sources, REPO / "pyproject.toml"]
               for name in CITED_DOC.findall(p.read_text()) if not (REPO / name).is_file()]
    assert missing == []

# ------------------------------------------------------------------ in a browser

#: The pages, what each must show (a diagram: an <img> of docs/img/; or the reference), and
#: where its screenshot looks.
PAGES = {
    "index.html": ("diagram", ""),
    "getting-started/index.html": ("", "#your-first-own-pipeline"),
    "guide/pipeline-file/index.html": ("", "#what-a-window-emits"),
    "concepts/checkpoints/index.html": ("diagram", ""),
    "reference/pipeline-file/index.html": ("reference", "#sources-type-files"),
}
WIDTH, HEIGHT = 1280, 1600

#: Runs when the page has loaded; writes its measurements into the DOM as JSON, for
#: `--dump-dom` to print.
MEASURE = """
<script>
window.addEventListener("load", () => setTimeout(() => {
  const column = document.querySelector("article.md-content__inner");
  const edge = column.getBoundingClientRect().right + 1;
  const name = (el) => el.tagName.toLowerCase() + (el.className ? "." + el.className : "") +
    ": " + (el.textContent || "").trim().slice(0, 60);
  const out = {
    title: (document.querySelector("article h1") || {}).textContent || "",
    page_width: document.documentElement.scrollWidth,
    // (Material's table and code wrappers reach 0.8rem past the column by design)
    sticking_out: [...column.querySelectorAll("*")]
      .filter((el) => !el.parentElement.closest(".md-typeset__scrollwrap, pre, .highlight"))
      .filter((el) => el.getBoundingClientRect().right > edge + 20).map(name).slice(0, 20),
    scrolling_code: [...column.querySelectorAll("pre > code")]
      .filter((el) => el.scrollWidth > el.clientWidth + 1).map(name).slice(0, 20),
    scrolling_tables: [...column.querySelectorAll(".md-typeset__scrollwrap")]
      .filter((el) => el.scrollWidth > el.clientWidth + 1).map(name).slice(0, 20),
    broken_keys: [...column.querySelectorAll("dl dt code")]
      .filter((el) => el.getClientRects().length > 1).map(name),
    keys: column.querySelectorAll("dl dt code").length,
    diagrams: [...column.querySelectorAll("img")].map((img) => ({
      src: img.getAttribute("src"), loaded: img.complete && img.naturalWidth > 0,
      width: Math.round(img.getBoundingClientRect().width)})),
  };
  const pre = document.createElement("pre");
  pre.id = "streamer-measurements";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 300));
</script>
"""


def chromium() -> str | None:
    """Debian's `chromium`, or another Chromium or Chrome on the PATH."""
    return next((found for name in ("chromium", "chromium-browser", "google-chrome")
                 if (found := shutil.which(name))), None)


def run_browser(browser: str, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}",
                           "--virtual-time-budget=4000", *args, url],
                          capture_output=True, text=True, timeout=120, check=False)


def at_section(page: Path, anchor: str) -> Path:
    """A copy of `page` that starts at the heading `anchor` (what comes before it removed):
    headless Chromium's screenshot after scrolling to a fragment comes out blank."""
    if not anchor:
        return page
    shown = page.with_name(page.stem + ".at-section.html")
    target = json.dumps(anchor.lstrip("#"))
    script = (f"<script>(() => {{ const el = document.getElementById({target}); "
              "while (el.previousElementSibling) el.previousElementSibling.remove(); })();"
              "</script>")
    shown.write_text(page.read_text().replace("</body>", script + "</body>"))
    return shown


def measure(browser: str, page: Path) -> dict[str, object]:
    """The measurements MEASURE writes into `page` once Chromium loaded it."""
    measured = page.with_name(page.stem + ".measured.html")
    measured.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    out = run_browser(browser, measured.as_uri(), "--dump-dom")
    found = re.search(r'<pre id="streamer-measurements">(.*?)</pre>', out.stdout, re.S)
    assert found, f"no measurements from {page}: {out.stderr[-2000:]}"
    return dict(json.loads(html.unescape(found.group(1))))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs") / "site"
    out = build(REPO / "mkdocs.yml", root)
    assert out.returncode == 0, out.stdout + out.stderr
    return root


@pytest.mark.slow
@pytest.mark.parametrize("page", list(PAGES))
def test_page_in_chromium_at_1280px(site: Path, page: str, tmp_path: Path) -> None:
    browser = chromium()
    if browser is None:
        pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run does)")
    shots = Path(os.environ.get("STREAMER_TEST_DOCS_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / (page.replace("/index.html", "").replace("/", "-").replace(".html", "")
                    + ".png")
    kind, where = PAGES[page]
    out = run_browser(browser, at_section(site / page, where).as_uri(), f"--screenshot={shot}")
    assert shot.exists() and shot.stat().st_size > 20_000, out.stderr[-2000:]

    m = measure(browser, site / page)
    assert m["title"], m
    assert m["page_width"] == WIDTH, m  # nothing widens the page past the window
    assert m["sticking_out"] == [], m
    assert m["scrolling_code"] == [], m  # code blocks wrap (docs/stylesheets/extra.css)
    if kind == "diagram":
        diagrams = m["diagrams"]
        assert isinstance(diagrams, list)
        assert diagrams and all(d["loaded"] and d["width"] > 300 for d in diagrams), m
    assert m["scrolling_tables"] == [], m  # no table hides a column behind a scrollbar
    if kind == "reference":
        assert isinstance(m["keys"], int) and m["keys"] > 100, m
        assert m["broken_keys"] == [], m  # a key's path is never split across lines
