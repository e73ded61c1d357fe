"""Fuzzing the pipeline files: every non-Kafka example, mutated, through the real CLI.

`streamer validate --no-spark` must answer every mutant with exit 0 or 1 (never 70, never a
traceback), and an exit 1 must say what is wrong (`file:line:col: message` or one error line).
A smaller set goes through `streamer run --max-epochs 1` on the session's Spark.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from streamer.cli.main import app

REPO = Path(__file__).resolve().parents[2]
PIPELINES = sorted(p for p in (REPO / "pipelines").glob("*.yaml")
                   if not p.name.startswith("kafka_"))
runner = CliRunner()
LOCATED = re.compile(r"^(error )?\S.*:\d+:\d+: \S", re.MULTILINE)
ERROR_LINE = re.compile(r"^error \S", re.MULTILINE)

# ------------------------------------------------------------------- mutations of the data
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
    st.text(max_size=20), st.sampled_from(["", "0", "-1s", "1m", "${NOPE}", "${X:-3}", "on",
                                           "count()", "a b", "rocksdb", "files", "jsonl",
                                           "key_by", "nan", ".inf", "~", "[", "{"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6)
OPS = st.sampled_from(["drop", "rename", "retype", "swap", "alias", "merge", "dup_item"])
MUTATION = st.tuples(OPS, st.integers(0, 10_000), st.integers(0, 10_000), VALUES,
                     st.text(max_size=10))


def _paths(node: Any, path: tuple[Any, ...] = (),
           above: frozenset[int] = frozenset()) -> list[tuple[Any, ...]]:
    """Every path into `node`; a value that contains itself (through `alias`) is not entered
    again, and yaml.dump writes it as a recursive alias."""
    out = [path]
    if id(node) in above:
        return out
    above = above | {id(node)}
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*path, k), above)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*path, i), above)
    return out


def _get(root: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        root = root[part]
    return root


def mutate(data: Any, mutations: list[tuple[str, int, int, Any, str]]) -> Any:
    """Apply each (op, where, other, value, name) to a deep copy of the loaded pipeline."""
    data = copy.deepcopy(data)
    for op, where, other, value, name in mutations:
        paths = [p for p in _paths(data) if p]
        if not paths:
            return value
        path = paths[where % len(paths)]
        other_path = paths[other % len(paths)]
        parent = _get(data, path[:-1])
        last = path[-1]
        if op == "drop":
            del parent[last]
        elif op == "rename" and isinstance(parent, dict):
            parent[name or last.upper()] = parent.pop(last)
        elif op == "swap":
            if other_path[:len(path)] == path or path[:len(other_path)] == other_path:
                continue  # one contains the other
            other_parent = _get(data, other_path[:-1])
            parent[last], other_parent[other_path[-1]] = (
                other_parent[other_path[-1]], parent[last])
        elif op == "alias":  # the same object twice: yaml.dump writes an anchor and an alias
            target = _get(data, other_path)
            if isinstance(target, dict | list) and path[:len(other_path)] != other_path:
                parent[last] = target
        elif op == "merge" and isinstance(parent[last], dict):
            target = _get(data, other_path)
            if isinstance(target, dict) and path[:len(other_path)] != other_path:
                parent[last]["<<"] = target
        elif op == "dup_item" and isinstance(parent, list):
            parent.insert(last, copy.deepcopy(parent[last]))
        else:
            parent[last] = value
    return data


def dump(data: Any) -> str:
    """YAML text for mutated data; a `<<` key becomes a real merge key."""
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return text.replace("'<<':", "<<:")


# ------------------------------------------------------------------- mutations of the text
TEXT_OPS = st.lists(st.tuples(
    st.sampled_from(["indent", "dedent", "tab", "delete", "duplicate", "bytes", "truncate",
                     "dup_key"]),
    st.integers(0, 10_000), st.integers(1, 8),
    st.binary(min_size=1, max_size=4)), min_size=1, max_size=4)


def mutate_text(raw: bytes, ops: list[tuple[str, int, int, bytes]]) -> bytes:
    """Line-level damage: wrong indentation, tabs, lost or repeated lines, stray bytes."""
    for op, where, n, junk in ops:
        lines = raw.split(b"\n")
        i = where % len(lines)
        if op == "indent":
            lines[i] = b" " * n + lines[i]
        elif op == "dedent":
            lines[i] = lines[i][min(n, len(lines[i]) - len(lines[i].lstrip(b" "))):]
        elif op == "tab":
            lines[i] = b"\t" + lines[i].lstrip(b" ")
        elif op == "delete":
            del lines[i]
        elif op in ("duplicate", "dup_key"):
            lines.insert(i, lines[i])
        elif op == "bytes":
            pos = where % (len(raw) + 1)
            raw = raw[:pos] + junk + raw[pos:]
            continue
        elif op == "truncate":
            raw = raw[:where % (len(raw) + 1)]
            continue
        raw = b"\n".join(lines)
    return raw


# -------------------------------------------------------------------------------- checks
def check_validate(path: Path) -> None:
    """Exit 0 or 1, no traceback, and an exit 1 says where or what."""
    result = runner.invoke(app, ["validate", "--no-spark", str(path)])
    output = result.output
    assert "Traceback" not in output, output
    assert result.exit_code in (0, 1), (result.exit_code, output[-3000:],
                                        path.read_bytes()[:3000])
    if result.exit_code == 1:
        assert LOCATED.search(output) or ERROR_LINE.search(output), output[-3000:]


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


PIPELINE_NAMES = [p.name for p in PIPELINES]


@pytest.mark.parametrize("name", PIPELINE_NAMES)
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(mutations=st.lists(MUTATION, min_size=1, max_size=4))
@example(mutations=[("retype", 0, 0, None, "")])
def test_mutated_data_validates_or_is_reported(name: str, mutations: list[Any],
                                               tmp_path: Path) -> None:
    data = mutate(_load(REPO / "pipelines" / name), mutations)
    path = tmp_path / name
    path.write_text(dump(data))
    check_validate(path)


@pytest.mark.parametrize("name", PIPELINE_NAMES)
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=TEXT_OPS)
@example(ops=[("bytes", 0, 1, b"\xff\xfe")])
@example(ops=[("tab", 3, 1, b"x")])
@example(ops=[("truncate", 0, 1, b"x")])
def test_damaged_text_validates_or_is_reported(name: str, ops: list[Any],
                                               tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_bytes(mutate_text((REPO / "pipelines" / name).read_bytes(), ops))
    check_validate(path)


# ---------------------------------------------------------------------- hand-written files
SMALL = """\
name: small
sources:
  - &src {id: gen, type: datagen, limit: 5, fields: {n: "offset"}}
operators:
  - {id: op, input: gen, filter: "n > 1"}
sinks:
  - {id: out, type: console, input: op}
"""

ODD_FILES = {
    "empty": b"",
    "only a comment": b"# nothing\n",
    "whitespace": b"  \n\t\n",
    "a scalar": b"42\n",
    "a list": b"- a\n- b\n",
    "null document": b"~\n",
    "two documents": SMALL.encode() + b"---\n" + SMALL.encode(),
    "bom": b"\xef\xbb\xbf" + SMALL.encode(),
    "utf-16": SMALL.encode("utf-16"),
    "latin-1 byte": SMALL.replace("small", "sm\xe4ll").encode("latin-1"),
    "nul byte": SMALL.encode().replace(b"small", b"sm\x00ll"),
    "tabs for indentation": SMALL.replace("  - ", "\t- ").encode(),
    "duplicate top key": (SMALL + "name: again\n").encode(),
    "duplicate nested key": SMALL.replace('limit: 5,', 'limit: 5, limit: 6,').encode(),
    "alias of a source": SMALL.replace("sinks:", "extra: *src\nsinks:").encode(),
    "merge into operator": SMALL.replace("{id: op,", "{<<: *src, id: op,").encode(),
    "merge of a scalar": SMALL.replace("{id: op,", "{<<: 3, id: op,").encode(),
    "merge of a list": SMALL.replace("{id: op,", "{<<: [*src, 3], id: op,").encode(),
    "undefined alias": SMALL.replace("input: gen", "input: *nope").encode(),
    "recursive alias": b"name: &a [*a]\n",
    "self merge": b"a: &a {<<: *a}\n",
    "complex key": SMALL.replace("name: small", "? [a, b]\n: small").encode(),
    "explicit tags": SMALL.replace('"n > 1"', "!!python/name:os.system").encode(),
    "binary tag": SMALL.replace('"n > 1"', "!!binary aGVsbG8=").encode(),
    "set tag": SMALL.replace('"n > 1"', "!!set {a, b}").encode(),
    "timestamp value": SMALL.replace('"offset"', "2026-01-01").encode(),
    "int key": SMALL.replace('n: "offset"', '1: "offset"').encode(),
    "null key": SMALL.replace('n: "offset"', '~: "offset"').encode(),
    "bool key": SMALL.replace('n: "offset"', 'true: "offset"').encode(),
    "float key in sections": b"1.5: x\nsources: []\nsinks: []\n",
    "sections are mappings": b"name: x\nsources: {a: 1}\noperators: 3\nsinks: {}\n",
    "huge int": SMALL.replace("limit: 5", "limit: " + "9" * 5000).encode(),
    "deep nesting": b"name: " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "deep mapping": b"name: x\nsources:\n" + b"".join(
        b"  " * i + b"k:\n" for i in range(1, 3000)),
    "billion laughs": b"a: &a [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n".encode()
        for i in range(8)),
    "huge string": SMALL.replace('"n > 1"', '"' + "x" * 5_000_000 + '"').encode(),
    "unclosed quote": SMALL.replace('"n > 1"', '"n > 1').encode(),
    "cr line ends": SMALL.replace("\n", "\r").encode(),
    # regressions: each crashed `validate` with exit 70 before it was fixed
    "sink id is a list": SMALL.replace("{id: out,", "{id: [out],").encode(),
    "keyed operator id is a mapping": SMALL.replace(
        "{id: op, input: gen,", "{id: {a: 1}, uid: u, key_by: [n], aggregate: {c: count()},"
        " input: gen,").encode(),
}


@pytest.mark.parametrize("case", sorted(ODD_FILES))
def test_odd_files_are_reported(case: str, tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_bytes(ODD_FILES[case])
    check_validate(path)


@pytest.mark.slow
def test_ten_thousand_operators(tmp_path: Path) -> None:
    lines = ["name: big", "sources:", "  - {id: gen, type: datagen, limit: 5, "
             "fields: {n: \"offset\"}}", "operators:"]
    prev = "gen"
    for i in range(10_000):
        lines.append(f"  - {{id: op{i}, input: {prev}, filter: \"n > {i}\"}}")
        prev = f"op{i}"
    lines += ["sinks:", f"  - {{id: out, type: console, input: {prev}}}"]
    path = tmp_path / "big.yaml"
    path.write_text("\n".join(lines) + "\n")
    check_validate(path)
    # and 10k operators that all read one source, with one bad reference at the end
    wide = [*lines[:4], *(f"  - {{id: w{i}, input: gen, filter: \"n > 0\"}}"
                          for i in range(10_000)),
            "sinks:", "  - {id: out, type: console, input: [w1, nope]}"]
    path.write_text("\n".join(wide) + "\n")
    check_validate(path)


# ------------------------------------------------------------------- through `streamer run`
LEAF_OPS = st.sampled_from(["drop", "retype", "swap", "rename"])
RUN_VALUES = st.one_of(
    st.none(), st.integers(-3, 5), st.sampled_from(
        ["", "0", "1s", "x", "offset", "count()", "n > 1", "string", "cast(x as int)",
         "memory", "jsonl", "csv", "parquet", "1m", "-1", "[", "user"]),
    st.lists(st.sampled_from(["user", "n", "offset"]), max_size=2))
RUN_MUTATION = st.tuples(LEAF_OPS, st.integers(0, 10_000), st.integers(0, 10_000), RUN_VALUES,
                         st.sampled_from(["", "limit", "id", "uid"]))
#: Same-type changes of a leaf, which mostly still validate and so reach Spark.
LEAF_STRINGS = st.sampled_from(
    ["offset", "n > 1", "cast(offset as string)", "nope_column", "1/0", "null", "user",
     "concat(user, 1)", "timestamp_millis(offset)", "x'ff'", "", "1s", "0s", "999d"])
LEAF_CHANGE = st.tuples(st.integers(0, 10_000), LEAF_STRINGS, st.integers(-1, 7))


def change_leaves(data: Any, changes: list[tuple[int, str, int]]) -> Any:
    """Replace string leaves by other strings and int leaves by other ints."""
    data = copy.deepcopy(data)
    for where, text, number in changes:
        leaves = [p for p in _paths(data) if p and isinstance(_get(data, p), str | int)]
        path = leaves[where % len(leaves)]
        parent, old = _get(data, path[:-1]), _get(data, path)
        parent[path[-1]] = number if isinstance(old, int) and not isinstance(old, bool) else text
    return data


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory with the examples' data and modules, so relative paths resolve
    and their sinks write under the test's temp directory, not the repository."""
    work = tmp_path_factory.mktemp("fuzz-run")
    (work / "pipelines").mkdir()
    (work / "pipelines" / "data").symlink_to(REPO / "pipelines" / "data")
    for module in (REPO / "pipelines").glob("*.py"):
        (work / module.name).write_text(module.read_text())
    return work


@pytest.mark.slow
@pytest.mark.spark
@settings(max_examples=12, deadline=None, database=None, derandomize=True,
          # no shrinking: each example is a Spark run; the failing example is printed as is
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(PIPELINE_NAMES),
       mutations=st.lists(RUN_MUTATION, max_size=1),
       changes=st.lists(LEAF_CHANGE, min_size=1, max_size=2))
@example(name="wordcount.yaml", mutations=[("retype", 0, 0, None, "")], changes=[])
def test_mutated_pipelines_run_or_fail_cleanly(spark, run_dir: Path, name: str,
                                               mutations: list[Any], changes: list[Any],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(run_dir)
    data = change_leaves(mutate(_load(REPO / "pipelines" / name), mutations), changes)
    path = run_dir / name
    path.write_text(dump(data))
    result = runner.invoke(app, ["run", str(path), "--max-epochs", "1", "--no-checkpoints",
                                 "--no-ui", "--quiet"])
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit), (result.exception, result.output[-3000:])
    assert "Traceback" not in result.output, result.output[-3000:]
    assert result.exit_code in (0, 1), (result.exit_code, result.output[-3000:], dump(data))
