"""Invalid pipeline files: every problem is reported at its exact `file:line:col` with a message
the user can act on (STYLE.md rule 9).

Most cases are data: tests/pipeline/invalid/<section>/<id>.yaml is the pipeline text, and
<id>.expected beside it holds the exact `str(problem)` lines the validator must report, in
location order (invalid/README.md says how to add one). A case whose .expected starts with
`# bug: <reason>` is a known validator bug: it holds the output the validator should give, so it
is a strict xfail that turns into a failure once the bug is fixed.

The cases below the data-driven tests stay Python: they pin a location and words rather than
a whole message, build their text (alias bombs, deep nesting) or time the loader.
"""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest

from streamer.pipeline.exceptions import PipelineError
from streamer.pipeline.validate import load_pipeline_text
from streamer.pipeline.yaml_loader import MAX_VALUES

INVALID = Path(__file__).parent / "invalid"
BUG = "# bug: "
TOP_KEYS = ("description, job, name, operators, sinks, sources, spark, storage, "
            "storage_options, tests")


def problems_of(text: str) -> list[str]:
    """The `str(problem)` lines for `text`, which must be invalid."""
    with pytest.raises(PipelineError) as info:
        load_pipeline_text(textwrap.dedent(text), file="p.yaml", env={})
    lines = [str(p) for p in info.value.problems]
    assert str(info.value) == "\n".join(lines)
    return lines


def golden_lines(expected: Path) -> tuple[str | None, list[str]]:
    """The bug reason (None for a plain case) and the expected lines of an .expected file."""
    lines = expected.read_text(encoding="utf-8").splitlines() if expected.exists() else []
    if lines and lines[0].startswith(BUG):
        return lines[0].removeprefix(BUG), lines[1:]
    return None, lines


def invalid_cases(*, bugs: bool = True) -> list[object]:
    """One param per tests/pipeline/invalid/**/<id>.yaml, with id <id>; a bug is a strict
    xfail (or left out, with `bugs=False`)."""
    params = []
    for path in sorted(INVALID.rglob("*.yaml")):
        reason, _ = golden_lines(path.with_suffix(".expected"))
        if reason is not None and not bugs:
            continue
        marks = ([pytest.mark.xfail(strict=True, reason=f"validator bug: {reason}")]
                 if reason is not None else [])
        params.append(pytest.param(path, id=path.stem, marks=marks))
    return params


def test_invalid_cases_are_complete() -> None:
    """Each case is a .yaml and an .expected with a name no other case has."""
    yamls = sorted(INVALID.rglob("*.yaml"))
    expected = sorted(INVALID.rglob("*.expected"))
    assert len(yamls) > 100
    assert [p.with_suffix("") for p in yamls] == [p.with_suffix("") for p in expected]
    names = [p.stem for p in yamls]
    assert len(names) == len(set(names)), "two cases share a name (the test id)"
    assert all(golden_lines(p)[1] for p in expected), "an .expected file has no lines"


@pytest.mark.parametrize("path", invalid_cases())
def test_invalid_pipeline_reports_every_problem_at_its_location(path: Path) -> None:
    lines = problems_of(path.read_text(encoding="utf-8"))
    expected = path.with_suffix(".expected")
    reason, golden = golden_lines(expected)
    if os.environ.get("STREAMER_TEST_UPDATE_GOLDEN") and reason is None:
        expected.write_text("\n".join(lines) + "\n", encoding="utf-8")
        golden = lines
    assert expected.exists(), (f"{expected} is missing; STREAMER_TEST_UPDATE_GOLDEN=1 writes "
                               "it from the validator's output, to review")
    assert lines == golden, f"differs from {expected}"


@pytest.mark.parametrize("path", invalid_cases(bugs=False))
def test_problems_are_in_location_order(path: Path) -> None:
    """Problems come sorted by (line, col), so the output reads top to bottom."""
    with pytest.raises(PipelineError) as info:
        load_pipeline_text(path.read_text(encoding="utf-8"), file="p.yaml", env={})
    where = [(p.location.line, p.location.col) for p in info.value.problems]
    assert where == sorted(where)
    assert all(p.location.file == "p.yaml" for p in info.value.problems)


# Bugs where the right location is clear but the wording of the fixed message is the fixer's
# choice: the test pins the location (or the acceptable locations) and the words the one-line
# message must contain.
LOOSE_CASES = [
    pytest.param(
        """\
        name: "p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        "p.yaml:1:7", ["YAML syntax error", "quot"],
        id="yaml-unclosed-quote",
    ),
    pytest.param(
        """\
        name: !!python/name:os.system
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        "p.yaml:1:7", ["python/name:os.system"],
        id="yaml-unsupported-tag",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: &f {x: offset, y: *f}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ("p.yaml:5:13", "p.yaml:5:30"), ["recursive"],
        id="yaml-recursive-alias",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - src
        sinks:
          - id: out
            type: console
            input: src
        """,
        "p.yaml:3:5", ["sources[0]", "must be a mapping", "'src'"],
        id="source-entry-not-a-mapping",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: [datagen]
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        "p.yaml:4:11", ["type", "datagen, files, kafka"],
        id="source-type-is-a-list",
    ),
    pytest.param(
        """\
        name: p
        job:
          epoch: 0.5ms
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        "p.yaml:3:10", ["'epoch'", "millisecond"],
        id="sub-millisecond-duration",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            <<: nope
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ("p.yaml:4:5", "p.yaml:4:9"), ["merge", "mapping"],
        id="merge-key-of-a-scalar",
    ),
]


@pytest.mark.parametrize(("text", "location", "words"), LOOSE_CASES)
def test_invalid_pipeline_reported_at_location(text: str, location: str | tuple[str, ...],
                                               words: list[str]) -> None:
    lines = problems_of(text)
    assert len(lines) == 1
    places = (location,) if isinstance(location, str) else location
    assert lines[0].startswith(tuple(f"{place}: " for place in places))
    assert "\n" not in lines[0]
    for word in words:
        assert word in lines[0]


def test_error_names_the_file_it_was_given() -> None:
    with pytest.raises(PipelineError) as info:
        load_pipeline_text("name: p\n", file="pipelines/clicks.yaml", env={})
    assert str(info.value).splitlines() == [
        "pipelines/clicks.yaml:1:1: the pipeline is missing required key 'sinks'",
        "pipelines/clicks.yaml:1:1: the pipeline is missing required key 'sources'",
    ]


# ----------------------------------------------------------- aliases, tags, odd YAML shapes

SINK_OF_SRC = """\
sinks:
  - id: out
    type: console
    input: src
"""
RECURSIVE = "this alias refers to a value that contains it; YAML aliases must not be recursive"


@pytest.mark.parametrize(("text", "places"), [
    pytest.param("name: p\nsources:\n  - id: src\n    type: datagen\n"
                 "    fields: &f {x: offset, y: *f}\n" + SINK_OF_SRC,
                 ("p.yaml:5:13", "p.yaml:5:30"), id="mapping-contains-itself"),
    pytest.param("name: p\nsources:\n  - id: src\n    type: datagen\n"
                 "    fields: &f {x: {y: [*f]}}\n" + SINK_OF_SRC,
                 ("p.yaml:5:13", "p.yaml:5:25"), id="nested-deeper"),
    pytest.param("name: p\nsources: &s\n  - *s\n" + SINK_OF_SRC,
                 ("p.yaml:2:10", "p.yaml:3:5"), id="list-contains-itself"),
    pytest.param("&top\nname: p\nsources:\n  - id: src\n    type: datagen\n"
                 "    fields: {x: offset}\n" + SINK_OF_SRC + "description: *top\n",
                 ("p.yaml:1:1", "p.yaml:11:14"), id="whole-file-contains-itself"),
])
def test_recursive_alias_is_reported_once_not_a_crash(text: str,
                                                      places: tuple[str, ...]) -> None:
    """A recursive alias is one problem at the anchor or the alias, not a RecursionError."""
    lines = problems_of(text)  # raises RecursionError if the loader recurses
    assert [line for line in lines if "recursive" in line] in (
        [f"{place}: {RECURSIVE}"] for place in places)


BOMB_LIST = "name: p\na0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 10))
BOMB_MAPPING = "name: p\na0: &a0 {" + ", ".join(f"k{j}: lol" for j in range(10)) + "}\n" + "".join(
    f"a{i}: &a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(10)) + "}\n"
    for i in range(1, 10))


@pytest.mark.parametrize(("text", "seconds"), [
    # The loader builds MAX_VALUES values before it gives up: about 0.3 s for lists and 0.7 s
    # for mappings on an idle machine, up to 1.5 s on a loaded 2-core one. The bounds leave
    # room for a loaded CI machine; a loader that expanded the 10**9 values would take hours.
    pytest.param(BOMB_LIST, 5.0, id="lists"),
    pytest.param(BOMB_MAPPING, 8.0, id="mappings"),
])
def test_alias_expansion_bomb_fails_fast(text: str, seconds: float) -> None:
    """'Billion laughs': 9 levels of 10 aliases each would expand to 10**9 values."""
    assert len(text) < 1000
    start = time.perf_counter()
    lines = problems_of(text)
    elapsed = time.perf_counter() - start
    assert lines == [f"p.yaml:1:1: the file expands to more than {MAX_VALUES:,} values through "
                     "aliases; a pipeline file should not need that many"]
    assert elapsed < seconds


def merge_bomb(levels: int) -> str:
    """x<i> merges 10 copies of x<i-1>; x0 (under `spark`) has 10 keys."""
    return ("name: p\nsources:\n  - id: src\n    type: datagen\n    fields: {x: offset}\n"
            "spark: &a0 {" + ", ".join(f"k{j}: '{j}'" for j in range(10)) + "}\n"
            + "".join(f"x{i}: &a{i} {{<<: [" + ", ".join([f"*a{i - 1}"] * 10) + "]}\n"
                      for i in range(1, levels + 1))
            + SINK_OF_SRC)


def test_merge_key_of_duplicates_is_just_the_merged_keys() -> None:
    # Merged keys do not duplicate each other (the first mapping in the list wins), so each
    # x<i> is just k0..k9: the only problems are the unknown top-level keys.
    assert problems_of(merge_bomb(3)) == [
        f"p.yaml:{6 + i}:1: unknown key 'x{i}' in the pipeline; valid keys: {TOP_KEYS}"
        for i in range(1, 4)]


def test_merge_key_bomb_fails_fast() -> None:
    """Merged values count toward MAX_VALUES: 7 levels of `<<: [*a, ...x10]` would merge
    10**8 pairs. The loader gives up after MAX_VALUES (about 0.3 s on an idle machine, up to
    1 s on a loaded 2-core one); the bound leaves room for a loaded CI machine, unbounded
    merging takes minutes."""
    text = merge_bomb(7)
    assert len(text) < 1000
    start = time.perf_counter()
    lines = problems_of(text)
    elapsed = time.perf_counter() - start
    assert lines == [f"p.yaml:1:1: the file expands to more than {MAX_VALUES:,} values through "
                     "aliases; a pipeline file should not need that many"]
    assert elapsed < 5.0


def test_deeply_nested_yaml_is_a_problem_not_a_crash() -> None:
    text = ("name: p\nsources:\n  - id: src\n    type: datagen\n    fields: {x: offset}\n"
            "    schema: " + "[" * 600 + "]" * 600 + "\n" + SINK_OF_SRC)
    assert problems_of(text) == [
        "p.yaml:1:1: the file nests lists or mappings too deeply to be a pipeline"]


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("name: !!python/name:os.system p\n",
                 "p.yaml:1:7: unsupported YAML tag 'tag:yaml.org,2002:python/name:os.system'",
                 id="python-tag"),
    pytest.param("name: p\nsources:\n  - id: src\n    type: datagen\n"
                 "    fields: {x: !env offset}\n" + SINK_OF_SRC,
                 "p.yaml:5:17: unsupported YAML tag '!env'", id="local-tag"),
])
def test_unsupported_tag_is_one_line_at_the_tag(text: str, expected: str) -> None:
    lines = problems_of(text)
    assert f"{expected}; pipeline files hold plain strings, numbers, booleans, lists and " \
           "mappings" in lines
    assert all("\n" not in line and "<unicode string>" not in line for line in lines)
