"""Fuzzing the input records: damaged jsonl, csv and parquet files through a real run.

A files source with `on_error:` a dead-letter sink, straight into a files sink (no keyed
operator, no filter): the job must finish (exit 0) and account for every input record, each
either in the output or in the dead letters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from streamer.cli.main import app

runner = CliRunner()
pytestmark = pytest.mark.spark
SETTINGS = settings(max_examples=4, deadline=None, database=None, derandomize=True,
                    phases=[Phase.explicit, Phase.generate],  # each example is a Spark run
                    suppress_health_check=list(HealthCheck))
#: Damage to one line: random bytes (never a line break, nor only blanks, which readers
#: skip: Spark's CSV reader counts every byte up to the space as blank, so a line of only
#: control characters is an empty line to it, not a record), or the line cut short.
JUNK = st.binary(min_size=1, max_size=30).map(
    lambda b: b.replace(b"\n", b"?").replace(b"\r", b"?")).filter(
        lambda b: any(c > 0x20 for c in b))
DAMAGE = st.lists(st.tuples(st.integers(0, 10_000), st.one_of(JUNK, st.integers(0, 40))),
                  max_size=8)


def run_job(tmp_path: Path, fmt: str, files: dict[str, bytes]) -> tuple[list[Any], list[Any]]:
    """Write `files`, run the pipeline once, return (output rows, dead letters)."""
    data = tmp_path / "in"
    data.mkdir()
    for name, raw in files.items():
        (data / name).write_bytes(raw)
    pipeline = {
        "name": "fuzz-records",
        "sources": [{"id": "src", "type": "files", "path": str(data / f"*.{fmt}"),
                     "format": fmt, "schema": {"n": "bigint", "s": "string"},
                     "on_error": "dead"}],
        "sinks": [{"id": "out", "type": "files", "input": "src", "path": str(tmp_path / "out"),
                   "format": "jsonl"},
                  {"id": "dead", "type": "files", "path": str(tmp_path / "dead"),
                   "format": "jsonl"}]}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(pipeline, sort_keys=False))
    result = runner.invoke(app, ["run", str(path), "--no-checkpoints", "--no-ui", "--quiet"])
    assert result.exit_code == 0, result.output[-3000:]
    assert "Traceback" not in result.output

    def rows(sink: str) -> list[Any]:
        return [json.loads(line) for f in sorted((tmp_path / sink).glob("part-*"))
                # not splitlines(): it also breaks at U+0085 and U+2028, which JSON keeps raw
                for line in f.read_text().split("\n") if line]
    return rows("out"), rows("dead")


def damage_lines(lines: list[bytes], damage: list[tuple[int, Any]]) -> tuple[list[bytes], set[int]]:
    """Replace or truncate some lines; return the lines and the indexes touched."""
    lines, touched = list(lines), set()
    for where, what in damage:
        i = where % len(lines)
        lines[i] = what if isinstance(what, bytes) else lines[i][:what] or b"x"
        touched.add(i)
    return lines, touched


def good_lines(fmt: str, count: int) -> list[bytes]:
    if fmt == "jsonl":
        return [json.dumps({"n": i, "s": f"v{i}"}).encode() for i in range(count)]
    return [f"{i},v{i}".encode() for i in range(count)]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
@SETTINGS
@given(damage=DAMAGE)
@example(damage=[(3, b"\xff\xfe\x00garbage"), (5, 4), (7, b'{"n": "x"')])
@example(damage=[(2, b"a\xc2\x85b\xe2\x80\xa8c,\""), (4, b"n,s")])
@example(damage=[(26, b"\x96"), (39, b"\t\xf5\xba\x9f\xcfx\xf73\x86_@i\x82"), (9, 12),
                 (10, 22), (21, 0)])
def test_damaged_lines_are_output_or_dead_letters(spark: Any, fmt: str, damage: Any,
                                                  tmp_path_factory: pytest.TempPathFactory
                                                  ) -> None:
    tmp_path = tmp_path_factory.mktemp(fmt)
    lines, touched = damage_lines(good_lines(fmt, 40), damage)
    header = [b"n,s"] if fmt == "csv" else []
    files = {f"a.{fmt}": b"\n".join(header + lines[:20]) + b"\n",
             f"b.{fmt}": b"\n".join(header + lines[20:]) + b"\n"}
    out, dead = run_job(tmp_path, fmt, files)
    assert len(out) + len(dead) == len(lines), (len(out), len(dead), dead)
    undamaged = {i for i in range(len(lines)) if i not in touched}
    assert undamaged <= {r["n"] for r in out}  # every good record arrives
    assert all(d["source"] == "src" and d["error"] for d in dead)


def parquet_bytes(first: int, count: int) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"n": list(range(first, first + count)),
                             "s": [f"v{i}" for i in range(first, first + count)]}), sink)
    return sink.getvalue()


#: (A data page damaged behind a sound footer is not among them: the epoch that decodes it
#: fails, and it becomes a dead letter through a restart from a checkpoint, which these runs
#: do not take; tests/runtime/test_damaged_files.py.)
PARQUET_DAMAGE = st.sampled_from(["none", "truncate", "random", "empty", "head"])


@pytest.mark.slow
@SETTINGS
@given(damage=st.lists(PARQUET_DAMAGE, min_size=3, max_size=3), cut=st.integers(1, 10_000),
       junk=st.binary(min_size=1, max_size=64))
@example(damage=["truncate", "random", "none"], cut=100, junk=b"\x00" * 8)
@example(damage=["none", "empty", "head"], cut=60, junk=b"\xff" * 16)
def test_corrupt_parquet_files_are_dead_letters(spark: Any, damage: list[str], cut: int,
                                                junk: bytes,
                                                tmp_path_factory: pytest.TempPathFactory
                                                ) -> None:
    tmp_path = tmp_path_factory.mktemp("parquet")
    files, sizes = {}, {}
    for k, how in enumerate(damage):
        raw = parquet_bytes(k * 100, 50)
        if how == "truncate":
            raw = raw[:cut % len(raw)]
        elif how == "random":
            raw = (junk * (len(raw) // len(junk) + 1))[:len(raw)]
        elif how == "empty":
            raw = b""
        elif how == "head":  # only the magic number
            raw = b"PAR1"
        files[f"f{k}.parquet"] = raw
        sizes[f"f{k}.parquet"] = 50
    out, dead = run_job(tmp_path, "parquet", files)
    dead_files = {Path(d["split"]).name for d in dead}
    assert len(dead) == len(dead_files)  # one dead letter per file
    assert all(d["error"] for d in dead)
    for name, how in zip(sorted(files), damage, strict=True):
        if how == "none":
            assert name not in dead_files
    # nothing lost: a file's rows are all in the output, or the file is a dead letter
    assert len(out) == sum(n for name, n in sizes.items() if name not in dead_files)
