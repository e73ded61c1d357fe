"""Invalid pipeline files: every problem is reported at its exact `file:line:col` with a message
the user can act on (STYLE.md rule 9).

Each case is a small YAML text and the exact `str(problem)` lines the validator must report, in
location order. Cases marked xfail are known validator bugs: they hold the output the validator
should give, so they start passing (and the strict xfail flips to a failure) once it is fixed.
"""

from __future__ import annotations

import textwrap
import time

import pytest

from streamer.pipeline.exceptions import PipelineError
from streamer.pipeline.validate import load_pipeline_text
from streamer.pipeline.yaml_loader import MAX_VALUES


def problems_of(text: str) -> list[str]:
    """The `str(problem)` lines for `text`, which must be invalid."""
    with pytest.raises(PipelineError) as info:
        load_pipeline_text(textwrap.dedent(text), file="p.yaml", env={})
    lines = [str(p) for p in info.value.problems]
    assert str(info.value) == "\n".join(lines)
    return lines


def bug(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=f"validator bug: {reason}")


SYNTAX = "; check the indentation and quoting on this line or the one before it"
DURATION = "a duration like '250ms', '10s', '5m', '2h' or '1d'"
TOP_KEYS = ("description, job, name, operators, sinks, sources, spark, storage, "
            "storage_options, tests")
UNUSED = "is not used; add a sink or operator with input: {0}, or remove the {1}"
NO_INPUT = "has no input; add input: <source or operator id>"
DUP_ID = ("duplicate id {0!r}; it is already the id of {1} — ids must be unique across "
          "sources, operators and sinks")
KINDS = "needs exactly one of filter, select, with_columns, key_by, join"
CYCLE = "; an operator can only read outputs upstream of it"
DUP_UID = ("uids identify state in checkpoints and savepoints and must be unique — set a "
           "distinct uid:")

CASES = [
    # ------------------------------------------------------------------- YAML and the file
    pytest.param(
        """\
        name: p
        sources:
          - id: src
             type: datagen
        sinks: []
        """,
        [f"p.yaml:4:10: YAML syntax error: mapping values are not allowed here{SYNTAX}"],
        id="yaml-bad-indentation",
    ),
    pytest.param(
        """\
        name: p
        sources: [a, b
        sinks: []
        """,
        [f"p.yaml:3:6: YAML syntax error: expected ',' or ']', but got ':'{SYNTAX}"],
        id="yaml-unclosed-bracket",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - {id: src, type: datagen
        sinks: []
        """,
        [f"p.yaml:4:6: YAML syntax error: expected ',' or '}}', but got ':'{SYNTAX}"],
        id="yaml-unclosed-flow-mapping",
    ),
    pytest.param(
        "name: p\nsources:\n\t- id: src\nsinks: []\n",
        ["p.yaml:3:1: YAML syntax error: found character '\\t' that cannot start any token"
         f"{SYNTAX}"],
        id="yaml-tab-indentation",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        name: q
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:6:1: duplicate key 'name'; it is already set at line 1"],
        id="duplicate-yaml-key",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            type: files
            fields: {x: offset, x: split}
        sinks:
          - id: out
            type: console
            input: src
            input: src
        """,
        ["p.yaml:5:5: duplicate key 'type'; it is already set at line 4",
         "p.yaml:6:25: duplicate key 'x'; it is already set at line 6",
         "p.yaml:11:5: duplicate key 'input'; it is already set at line 10"],
        id="duplicate-yaml-keys-nested-several",
    ),
    pytest.param(
        "",
        ["p.yaml:1:1: the file is empty; a pipeline needs at least name, sources and sinks"],
        id="empty-file",
    ),
    pytest.param(
        "# only a comment\n\n",
        ["p.yaml:1:1: the file is empty; a pipeline needs at least name, sources and sinks"],
        id="comments-only-file",
    ),
    pytest.param(
        """\
        - name: p
        - sources: []
        """,
        ["p.yaml:1:1: a pipeline file must be a mapping with name, sources and sinks at the "
         "top level"],
        id="top-level-list",
    ),
    pytest.param(
        "just some text\n",
        ["p.yaml:1:1: a pipeline file must be a mapping with name, sources and sinks at the "
         "top level"],
        id="top-level-scalar",
    ),
    pytest.param(
        """\
        name: p
        ? [a, b]
        : 1
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:2:3: mapping keys must be plain names, not lists or mappings"],
        id="non-scalar-mapping-key",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: !env {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:5:13: unsupported YAML tag '!env'; pipeline files hold plain strings, numbers, "
         "booleans, lists and mappings"],
        id="unsupported-tag-on-a-mapping",
    ),
    # ------------------------------------------------------------------------ top level
    pytest.param(
        """\
        description: nothing yet
        """,
        ["p.yaml:1:1: the pipeline is missing required key 'name'",
         "p.yaml:1:1: the pipeline is missing required key 'sinks'",
         "p.yaml:1:1: the pipeline is missing required key 'sources'"],
        id="missing-name-sources-sinks",
    ),
    pytest.param(
        """\
        name: p
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:1:1: the pipeline is missing required key 'sources'",
         "p.yaml:5:12: sink 'out' has input 'src', which is not a source or operator"],
        id="missing-sources",
    ),
    pytest.param(
        """\
        name: Clicks_Per_User
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:1:7: 'name' 'Clicks_Per_User' must be lowercase letters, digits and dashes, "
         "e.g. 'clicks-per-user'"],
        id="bad-job-name",
    ),
    pytest.param(
        """\
        name:
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:1:6: 'name' must be a string, got nothing (null)"],
        id="null-job-name",
    ),
    pytest.param(
        """\
        name: p
        sourcse:
          - id: src
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:2:1: unknown key 'sourcse' in the pipeline; did you mean 'sources'?"],
        id="unknown-top-level-key-suggested",
    ),
    pytest.param(
        """\
        version: 1
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        [f"p.yaml:1:1: unknown key 'version' in the pipeline; valid keys: {TOP_KEYS}"],
        id="unknown-top-level-key-no-close-match",
    ),
    pytest.param(
        """\
        name: p
        sources: []
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:2:10: 'sources' needs at least 1 entry",
         "p.yaml:6:12: sink 'out' has input 'src', which is not a source or operator"],
        id="zero-sources",
    ),
    pytest.param(
        """\
        name: p
        sources:
          id: src
          type: datagen
          fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:3:3: 'sources' must be a list, got a mapping"],
        id="mapping-where-list-expected",
    ),
    pytest.param(
        """\
        name: p
        job: [parallelism, 2]
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:2:6: 'job' must be a mapping, got a list"],
        id="list-where-mapping-expected",
    ),
    # ---------------------------------------------------------------------- unknown keys
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            feilds: {x: offset}
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:5:5: unknown key 'feilds' in source 'src'; did you mean 'fields'?"],
        id="unknown-key-in-source",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: f
            inputs: src
            filter: x > 1
        sinks:
          - id: out
            type: console
            input: f
        """,
        ["p.yaml:7:5: operator 'f' is missing required key 'input'",
         "p.yaml:8:5: unknown key 'inputs' in operator 'f'; did you mean 'input'?"],
        id="unknown-key-in-operator",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: files
            input: src
            path: /tmp/out
            fromat: jsonl
        """,
        ["p.yaml:7:5: sink 'out' is missing required key 'format'",
         "p.yaml:11:5: unknown key 'fromat' in sink 'out'; did you mean 'format'?"],
        id="unknown-key-in-sink",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: agg
            input: src
            key_by: [x]
            window: {tumbling: 1m, allowed_latness: 5s}
            aggregate: {n: count()}
        sinks:
          - id: out
            type: console
            input: agg
        """,
        ["p.yaml:10:28: unknown key 'allowed_latness' in 'window'; did you mean "
         "'allowed_lateness'?"],
        id="unknown-key-in-window",
    ),
    pytest.param(
        """\
        name: p
        job:
          paralellism: 2
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:3:3: unknown key 'paralellism' in 'job'; did you mean 'parallelism'?"],
        id="unknown-key-in-job",
    ),
    pytest.param(
        """\
        name: p
        job:
          checkpoint:
            intervall: 5s
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:5: unknown key 'intervall' in 'checkpoint'; did you mean 'interval'?"],
        id="unknown-key-in-checkpoint",
    ),
    pytest.param(
        """\
        name: p
        job:
          checkpoint:
            frobnicate: 5s
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:5: unknown key 'frobnicate' in 'checkpoint'; valid keys: interval, mode, "
         "retain, timeout"],
        id="unknown-key-no-close-match-lists-valid-keys",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset, ts: "timestamp_millis(offset)"}
            event_time: ts
            watermark: {max_out_of_orderness: 5s, idle: 1m}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:7:43: unknown key 'idle' in 'watermark'; valid keys: idle_timeout, "
         "max_out_of_orderness"],
        id="unknown-key-in-watermark",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        tests:
          - name: smoke
            inputs: {src: []}
            expected: {out: []}
        """,
        ["p.yaml:11:5: test 'smoke' is missing required key 'expect'",
         "p.yaml:13:5: unknown key 'expected' in test 'smoke'; did you mean 'expect'?"],
        id="unknown-key-in-test",
    ),
    # ----------------------------------------------------------------------- wrong types
    pytest.param(
        """\
        name: p
        job:
          parallelism: "2"
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:3:16: 'parallelism' must be a whole number, got '2'"],
        id="int-given-as-string",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            splits: true
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:5:13: 'splits' must be a whole number, got true (a boolean)"],
        id="bool-where-int-expected",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: files
            path: /tmp/in
            format: jsonl
            watch: "yes please"
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:7:12: 'watch' must be true or false, got 'yes please'"],
        id="string-where-bool-expected",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: files
            path: /tmp/in
            format: csv
            header: yes
        sinks:
          - id: out
            type: console
            input: src
        """,
        # YAML 1.2: only true/false are booleans; `yes`, `no`, `on`, `off` are strings.
        ["p.yaml:7:13: 'header' must be true or false, got 'yes'"],
        id="yaml-12-yes-is-not-a-boolean",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            rows_per_second: 0
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:5:22: 'rows_per_second' must be greater than 0, got 0"],
        id="zero-rate",
    ),
    pytest.param(
        """\
        name: p
        storage: ""
        spark:
          spark.sql.shuffle.partitions: {a: 1}
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: 5
        """,
        ["p.yaml:2:10: 'storage' must not be empty",
         "p.yaml:4:33: 'spark.sql.shuffle.partitions' must be a string, number or boolean, "
         "got a mapping",
         "p.yaml:12:12: 'input' must be a string, got 5"],
        id="several-type-errors-in-location-order",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: []
        """,
        ["p.yaml:9:12: 'input' must name at least one id"],
        id="empty-input-list",
    ),
    # ------------------------------------------------------------------------- durations
    pytest.param(
        """\
        name: p
        job:
          epoch: 10 seconds
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        [f"p.yaml:3:10: 'epoch' must be {DURATION}, got '10 seconds'"],
        id="duration-spelt-out",
    ),
    pytest.param(
        """\
        name: p
        job:
          epoch: 10
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        [f"p.yaml:3:10: 'epoch' must be {DURATION}, got 10"],
        id="duration-without-unit",
    ),
    pytest.param(
        """\
        name: p
        job:
          checkpoint:
            interval: 0s
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:15: 'interval' must be longer than 0"],
        id="zero-duration",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: d
            input: src
            key_by: [x]
            dedupe: {}
        sinks:
          - id: out
            type: console
            input: d
        """,
        ["p.yaml:10:13: 'dedupe' is missing required key 'within'"],
        id="dedupe-without-within",
    ),
    # ------------------------------------------------------------------------------ enums
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: files
            path: /tmp/in
            format: json
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:6:13: 'format' must be one of jsonl, csv, parquet, text; got 'json' (did you mean "
         "'jsonl'?)"],
        id="enum-format-json-suggests-jsonl",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: kafka
            bootstrap_servers: localhost:9092
            topic: t
            start: earlist
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:7:12: 'start' must be one of earliest, latest; got 'earlist' (did you mean "
         "'earliest'?)"],
        id="enum-kafka-start",
    ),
    pytest.param(
        """\
        name: p
        job:
          state:
            backend: 3
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:14: 'backend' must be one of rocksdb, memory; got 3"],
        id="enum-given-a-number",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: kafka
            input: src
            bootstrap_servers: broker:9092
            topic: t
            format: avro
        """,
        ["p.yaml:12:13: 'format' must be one of json; got 'avro'"],
        id="enum-kafka-sink-format",
    ),
    # ------------------------------------------------------------ source and sink types
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagn
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:11: unknown type 'datagn' for source 'src'; valid: datagen, files, kafka; "
         "did you mean 'datagen'?"],
        id="unknown-source-type-suggested",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: socket
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:11: unknown type 'socket' for source 'src'; valid: datagen, files, kafka"],
        id="unknown-source-type-no-close-match",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:3:5: source 'src' is missing required key 'type' (one of datagen, files, "
         "kafka)"],
        id="source-without-type",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: consle
            input: src
        """,
        ["p.yaml:8:11: unknown type 'consle' for sink 'out'; valid: console, delta, files, kafka, "
         "postgres; "
         "did you mean 'console'?"],
        id="unknown-sink-type-suggested",
    ),
    # --------------------------------------------------------------- ids and references
    pytest.param(
        """\
        name: p
        sources:
          - id: Src-1
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: Src-1
        """,
        ["p.yaml:3:9: 'id' 'Src-1' must be lowercase letters, digits and underscores, "
         "starting with a letter"],
        id="id-pattern-violation",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - input: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:3:5: sources[0] is missing required key 'id'",
         "p.yaml:3:5: unknown key 'input' in sources[0]; valid keys: event_time, fields, id, "
         "limit, max_records_per_epoch, on_error, rows_per_second, schema, splits, type, uid, "
         "watermark"],
        id="source-without-id",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: f
            input: src
            filter: x > 1
        sinks:
          - id: f
            type: console
            input: f
          - id: src
            type: console
            input: src
        """,
        ["p.yaml:11:9: " + DUP_ID.format("f", "an operator"),
         "p.yaml:14:9: " + DUP_ID.format("src", "a source")],
        id="duplicate-ids-across-sections",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: src
            input: src
            filter: x > 1
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:7:9: " + DUP_ID.format("src", "a source")],
        id="duplicate-id-operator-shadows-source",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: clicks
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: clikcs
        """,
        ["p.yaml:9:12: sink 'out' has input 'clikcs', which is not a source or operator; did "
         "you mean 'clicks'?"],
        id="unknown-input-suggested",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: f
            input: out
            filter: x > 1
        sinks:
          - id: out
            type: console
            input: src
          - id: out2
            type: console
            input: f
        """,
        ["p.yaml:8:12: operator 'f' has input 'out', which is a sink; a sink has no output "
         "to read"],
        id="input-names-a-sink",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: f
            input: [src, f]
            filter: x > 1
        sinks:
          - id: out
            type: console
            input: f
        """,
        ["p.yaml:8:18: operator 'f' reads its own output; remove it from input"],
        id="operator-reads-its-own-output",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: f
            input: [src, src]
            filter: x > 1
        sinks:
          - id: out
            type: console
            input: f
        """,
        ["p.yaml:8:18: operator 'f' lists input 'src' twice; list each input once"],
        id="operator-input-listed-twice",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
          - id: other
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input:
              - src
              - other
              - src
        """,
        ["p.yaml:15:9: sink 'out' lists input 'src' twice; list each input once"],
        id="sink-input-listed-twice",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: a
            input: b
            filter: x > 1
          - id: b
            input: a
            filter: x > 2
        sinks:
          - id: out
            type: console
            input: [src, b]
        """,
        [f"p.yaml:11:12: operators form a cycle: a -> b -> a{CYCLE}"],
        id="cycle-of-two-operators",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: a
            input: [src, c]
            filter: x > 1
          - id: b
            input: a
            filter: x > 2
          - id: c
            input: b
            filter: x > 3
        sinks:
          - id: out
            type: console
            input: c
        """,
        [f"p.yaml:11:12: operators form a cycle: a -> b -> c -> a{CYCLE}"],
        id="cycle-of-three-operators",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
          - id: extra
            type: datagen
            fields: {y: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:6:9: the output of source 'extra' " + UNUSED.format("extra", "source")],
        id="unconsumed-source",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: f
            input: src
            filter: x > 1
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:7:9: the output of operator 'f' " + UNUSED.format("f", "operator")],
        id="unconsumed-operator-output",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
          - id: out2
            type: console
        """,
        [f"p.yaml:10:5: sink 'out2' {NO_INPUT}"],
        id="sink-without-input",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: files
            path: /tmp/in
            format: jsonl
            on_error: clean
        operators:
          - id: clean
            input: src
            filter: x > 1
        sinks:
          - id: out
            type: console
            input: clean
        """,
        ["p.yaml:7:15: on_error 'clean' of source 'src' is an operator, not a sink; name a "
         "sink"],
        id="on-error-names-an-operator",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: files
            path: /tmp/in
            format: jsonl
            on_error: dead_leters
        sinks:
          - id: out
            type: console
            input: src
          - id: dead_letters
            type: console
        """,
        ["p.yaml:7:15: on_error 'dead_leters' of source 'src' is not defined; name a sink; did "
         "you mean 'dead_letters'?"],
        id="on-error-names-unknown-id-suggested",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: files
            path: /tmp/in
            format: jsonl
            on_error: dlq
        sinks:
          - id: out
            type: console
            input: src
          - id: dlq
            type: console
            input: src
        """,
        ["p.yaml:14:12: sink 'dlq' receives on_error of source 'src' and cannot also have "
         "input; use a separate sink"],
        id="dead-letter-sink-with-input",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset, ts: "timestamp_millis(offset)"}
            event_time: ts
        operators:
          - id: w
            input: src
            key_by: [x]
            window: {tumbling: 1m, late: src}
            aggregate: {n: count()}
        sinks:
          - id: out
            type: console
            input: w
        """,
        ["p.yaml:11:34: late output 'src' of operator 'w' is a source, not a sink; name a "
         "sink"],
        id="late-output-names-a-source",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: w
            input: src
            key_by: [x]
            window: {tumbling: 1m, late: out}
            aggregate: {n: count()}
        sinks:
          - id: out
            type: console
            input: w
        """,
        ["p.yaml:15:12: sink 'out' receives late output of operator 'w' and cannot also have "
         "input; use a separate sink"],
        id="late-sink-with-input",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: files
            path: /in
            format: jsonl
            on_error: bad
        operators:
          - id: w
            input: src
            key_by: [x]
            window: {tumbling: 1m, late: bad}
            aggregate: {n: count()}
        sinks:
          - id: out
            type: console
            input: w
          - id: bad
            type: console
        """,
        ["p.yaml:12:34: sink 'bad' already receives on_error of source 'src'; dead-letter "
         "records and late records have different columns, use two sinks"],
        id="dead-letter-and-late-records-in-one-sink",
    ),
    # ------------------------------------------------------------------------- operators
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - input: src
            filter: x > 1
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:7:5: operators[0] is missing required key 'id'"],
        id="operator-without-id",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: f
            input: src
        sinks:
          - id: out
            type: console
            input: f
        """,
        [f"p.yaml:7:5: operator 'f' {KINDS}"],
        id="operator-with-zero-kinds",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: f
            input: src
            filter: x > 1
            select: {x: x}
        sinks:
          - id: out
            type: console
            input: f
        """,
        [f"p.yaml:10:5: operator 'f' {KINDS}; it has filter and select"],
        id="operator-with-two-kinds",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: w
            input: src
            key_by: [x]
            window: {tumbling: 1m}
        sinks:
          - id: out
            type: console
            input: w
        """,
        ["p.yaml:10:5: operator 'w' has a window but no aggregate; add aggregate: "
         "{name: count()} (or top_n: for the first rows per window)"],
        id="window-without-aggregate",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: k
            input: src
            key_by: x
        sinks:
          - id: out
            type: console
            input: k
        """,
        ["p.yaml:7:5: operator 'k' has key_by but nothing to do per key; add one of window + "
         "aggregate, aggregate, dedupe, process, top_n"],
        id="key-by-with-nothing-to-do",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: a
            input: src
            filter: x > 0
            aggregate: {n: count()}
        sinks:
          - id: out
            type: console
            input: a
        """,
        ["p.yaml:10:5: 'aggregate' needs key_by in operator 'a'; add key_by: [columns]"],
        id="aggregate-without-key-by",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: d
            input: src
            dedupe: {within: 1h}
        sinks:
          - id: out
            type: console
            input: d
        """,
        [f"p.yaml:7:5: operator 'd' {KINDS}",
         "p.yaml:9:5: 'dedupe' needs key_by in operator 'd'; add key_by: [columns]"],
        id="dedupe-without-key-by",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: d
            input: src
            filter: x > 0
            process: "fraud:Detector"
        sinks:
          - id: out
            type: console
            input: d
        """,
        ["p.yaml:10:5: 'process' needs key_by in operator 'd'; add key_by: [columns]"],
        id="process-without-key-by",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: f
            input: src
            uid: f-v1
            filter: x > 1
        sinks:
          - id: out
            type: console
            input: f
        """,
        ["p.yaml:9:5: 'uid' applies only to stateful (key_by) operators; remove it from "
         "operator 'f'"],
        id="uid-on-stateless-operator",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: k
            input: src
            key_by: [x]
            aggregate: {n: count()}
            dedupe: {within: 1h}
        sinks:
          - id: out
            type: console
            input: k
        """,
        ["p.yaml:11:5: operator 'k' can have only one of aggregate, dedupe, process, top_n; it has "
         "aggregate and dedupe"],
        id="aggregate-and-dedupe",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: w
            input: src
            key_by: [x]
            window:
              tumbling: 1m
              session: {gap: 30s}
            aggregate: {n: count()}
        sinks:
          - id: out
            type: console
            input: w
        """,
        ["p.yaml:12:7: window needs exactly one of tumbling, sliding, session, count, until; it "
         "has tumbling and session"],
        id="window-with-two-kinds",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: w
            input: src
            key_by: [x]
            window: {emit: updates}
            aggregate: {n: count()}
        sinks:
          - id: out
            type: console
            input: w
        """,
        ["p.yaml:10:13: window needs exactly one of tumbling, sliding, session, count, until"],
        id="window-with-no-kind",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: w
            input: src
            key_by: [x]
            window:
              sliding: {size: 10s, slide: 1m}
            aggregate: {n: count()}
        sinks:
          - id: out
            type: console
            input: w
        """,
        ["p.yaml:11:35: slide (1m) must not be longer than size (10s), or some records would "
         "fall in no window"],
        id="sliding-slide-longer-than-size",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: w
            input: src
            key_by: [x]
            aggregate: {total: summ(x), mid: median(x)}
        sinks:
          - id: out
            type: console
            input: w
        """,
        ["p.yaml:10:24: unknown aggregate function 'summ'; did you mean 'sum'?",
         "p.yaml:10:38: unknown aggregate function 'median'; did you mean 'min'?"],
        id="unknown-aggregate-functions-suggested",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: w
            input: src
            key_by: [x]
            aggregate: {total: sum()}
        sinks:
          - id: out
            type: console
            input: w
        """,
        ["p.yaml:10:24: sum() needs a column or expression, e.g. sum(amount)"],
        id="sum-without-argument",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: w
            input: src
            key_by: [x]
            aggregate: {n: count(x)}
        sinks:
          - id: out
            type: console
            input: w
        """,
        ["p.yaml:10:20: count() takes no argument; use count(distinct x) to count distinct "
         "values"],
        id="count-with-argument",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: w
            input: src
            key_by: [x]
            aggregate: {total: sum x, n: 5}
        sinks:
          - id: out
            type: console
            input: w
        """,
        ["p.yaml:10:24: aggregate 'sum x' must be a call such as count() or sum(x), "
         "optionally followed by filter (where <condition>)",
         "p.yaml:10:34: 'n' must be a string, got 5"],
        id="malformed-aggregates",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: w
            input: src
            key_by: [x]
            aggregate: {spread: max(x) - min(x)}
        sinks:
          - id: out
            type: console
            input: w
        """,
        ["p.yaml:10:25: aggregate 'max(x) - min(x)' must be a call such as count() or sum(x), "
         "optionally followed by filter (where <condition>)"],
        id="aggregate-expression-of-two-calls",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: s
            input: src
            select: {1st: x, ok: x}
        sinks:
          - id: out
            type: console
            input: s
        """,
        ["p.yaml:9:14: name '1st' must be a column name (letters, digits and underscores, not "
         "starting with a digit)"],
        id="bad-column-name-in-select",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: k
            input: src
            key_by: [x]
            process: fraud.Detector
        sinks:
          - id: out
            type: console
            input: k
        """,
        ["p.yaml:10:14: 'process' 'fraud.Detector' must be 'module:Class', e.g. "
         "'fraud:LargeAfterSmall'"],
        id="bad-process-module-class",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: a
            input: src
            key_by: [x]
            dedupe: {within: 1h}
          - id: b
            input: a
            uid: a
            key_by: [x]
            aggregate: {n: count()}
        sinks:
          - id: out
            type: console
            input: b
        """,
        ["p.yaml:13:10: operator 'b' has uid 'a', which is already the uid of operator 'a'; "
         + DUP_UID],
        id="duplicate-uid",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        operators:
          - id: k
            input: src
            uid: src
            key_by: [x]
            dedupe: {within: 1h}
        sinks:
          - id: out
            type: console
            input: k
        """,
        ["p.yaml:9:10: operator 'k' has uid 'src', which is already the uid of source 'src'; "
         + DUP_UID],
        id="duplicate-uid-operator-and-source",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            uid: k
            type: datagen
            fields: {x: offset}
        operators:
          - id: k
            input: src
            key_by: [x]
            dedupe: {within: 1h}
        sinks:
          - id: out
            type: console
            input: k
        """,
        # k has no uid: key, so its uid is its id, and the problem is shown at the id.
        ["p.yaml:8:9: operator 'k' has uid 'k', which is already the uid of source 'src'; "
         + DUP_UID],
        id="duplicate-uid-source-uid-is-an-operator-id",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: a
            type: datagen
            fields: {x: offset}
          - id: b
            uid: a
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: [a, b]
        """,
        ["p.yaml:7:10: source 'b' has uid 'a', which is already the uid of source 'a'; "
         + DUP_UID],
        id="duplicate-uid-between-sources",
    ),
    # --------------------------------------------------------------------------- sources
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
            watermark: {max_out_of_orderness: 5s}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:6:5: source 'src' has a watermark but no event_time; add event_time: "
         "<timestamp column>"],
        id="watermark-without-event-time",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: files
            path: /tmp/in
            format: jsonl
            header: true
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:7:5: 'header' applies only to format: csv"],
        id="files-source-header-on-jsonl",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
            schema: {x: bigint}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:6:5: a datagen source takes its schema from `fields`; remove `schema` (cast "
         "in the field expressions instead)"],
        id="datagen-with-schema",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: kafka
            bootstrap_servers: localhost:9092
            topic: a
            topics: [a, b]
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:7:5: a kafka source needs exactly one of topic, topics; it has topic and "
         "topics"],
        id="kafka-topic-and-topics",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: kafka
            bootstrap_servers: localhost:9092
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:3:5: a kafka source needs exactly one of topic, topics"],
        id="kafka-without-topic",
    ),
    # ------------------------------------------------------------------------------- job
    pytest.param(
        """\
        name: p
        job:
          parallelism: 8
          max_parallelism: 4
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:3:16: parallelism (8) cannot exceed max_parallelism (4); raise "
         "max_parallelism or lower parallelism"],
        id="parallelism-above-max-parallelism",
    ),
    pytest.param(
        """\
        name: p
        job:
          parallelism: 200
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:3:16: parallelism (200) cannot exceed max_parallelism (128); raise "
         "max_parallelism or lower parallelism"],
        id="parallelism-above-default-max-parallelism",
    ),
    pytest.param(
        """\
        name: p
        job:
          max_parallelism: 40000
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:3:20: 'max_parallelism' must be at most 32768, got 40000"],
        id="max-parallelism-too-large",
    ),
    pytest.param(
        """\
        name: p
        job:
          max_parallelism: 0
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:3:20: 'max_parallelism' must be at least 1, got 0"],
        id="max-parallelism-zero",
    ),
    pytest.param(
        """\
        name: p
        job:
          execution:
            small_epoch_rows: -1
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:23: 'small_epoch_rows' must be at least 0, got -1; set a number of rows, "
         "or 0 to turn the small-epoch mode off"],
        id="execution-negative-small-epoch-rows",
    ),
    pytest.param(
        """\
        name: p
        job:
          execution:
            local_rows: 1k
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:17: 'local_rows' must be a whole number, got '1k'; set a number of rows, or "
         "0 to never read a slice on the driver"],
        id="execution-local-rows-not-a-number",
    ),
    pytest.param(
        """\
        name: p
        job:
          execution:
            local_rows: 2.5
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:17: 'local_rows' must be a whole number, got 2.5; set a number of rows, or "
         "0 to never read a slice on the driver"],
        id="execution-local-rows-decimal",
    ),
    pytest.param(
        """\
        name: p
        job:
          execution:
            direct_read: off
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:18: 'direct_read' must be true or false, got 'off'"],
        id="execution-direct-read-yaml-11-word",
    ),
    pytest.param(
        """\
        name: p
        job:
          execution:
            driver_subtasks: 0
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:22: 'driver_subtasks' must be true or false, got 0"],
        id="execution-driver-subtasks-number",
    ),
    pytest.param(
        """\
        name: p
        job:
          execution:
            task_sink:
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:15: 'task_sink' must be true or false, got nothing (null)"],
        id="execution-task-sink-null",
    ),
    pytest.param(
        """\
        name: p
        job:
          execution:
            direct_reads: false
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:5: unknown key 'direct_reads' in 'execution'; did you mean 'direct_read'?"],
        id="execution-unknown-key",
    ),
    pytest.param(
        """\
        name: p
        job:
          execution:
            small_epochs: 0
            local_rows: -5
            task_sink: yes
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:5: unknown key 'small_epochs' in 'execution'; did you mean "
         "'small_epoch_rows'?",
         "p.yaml:5:17: 'local_rows' must be at least 0, got -5; set a number of rows, or "
         "0 to never read a slice on the driver",
         "p.yaml:6:16: 'task_sink' must be true or false, got 'yes'"],
        id="execution-three-problems",
    ),
    pytest.param(
        """\
        name: p
        job:
          execution: [direct_read]
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:3:14: 'execution' must be a mapping, got a list"],
        id="execution-not-a-mapping",
    ),
    pytest.param(
        """\
        name: p
        job:
          parallelism:
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:3:15: 'parallelism' must be a whole number, got nothing (null)"],
        id="parallelism-null",
    ),
    pytest.param(
        """\
        name: p
        job:
          parallelism: 8
          max_parallelism: 0
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        # (the comparison with an invalid max_parallelism is not made: one problem, not two)
        ["p.yaml:4:20: 'max_parallelism' must be at least 1, got 0"],
        id="parallelism-with-an-invalid-max-parallelism",
    ),
    pytest.param(
        """\
        name: p
        job:
          state: {backend: rocksbd, local_dir: ' '}
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:3:20: 'backend' must be one of rocksdb, memory; got 'rocksbd' (did you mean "
         "'rocksdb'?)",
         "p.yaml:3:40: 'local_dir' must not be empty"],
        id="state-backend-typo-and-blank-local-dir",
    ),
    pytest.param(
        """\
        name: p
        job:
          metrics:
            prometheus: {host: 0.0.0.0}
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:17: 'prometheus' is missing required key 'port'"],
        id="prometheus-without-port",
    ),
    pytest.param(
        """\
        name: p
        job:
          metrics:
            prometheus: {port: 70000, hots: x}
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:24: 'port' must be at most 65535, got 70000",
         "p.yaml:4:31: unknown key 'hots' in 'prometheus'; did you mean 'host'?"],
        id="prometheus-port-too-high-and-unknown-key",
    ),
    pytest.param(
        """\
        name: p
        job:
          metrics:
            prometheus:
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:4:16: 'prometheus' must be a mapping, got nothing (null)"],
        id="prometheus-null",
    ),
    # ---------------------------------------------------------------- environment, tests
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: kafka
            bootstrap_servers: ${KAFKA_HOST}:9092
            topic: t
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:5:24: environment variable 'KAFKA_HOST' is not set; set it, or give a default "
         "with ${KAFKA_HOST:-value}"],
        id="undefined-variable-without-default",
    ),
    pytest.param(
        """\
        name: ${NAME}
        sources:
          - id: src
            type: kafka
            bootstrap_servers: ${HOST}
            topic: ${TOPIC}
        sinks:
          - id: out
            type: console
            input: src
        """,
        [f"p.yaml:{line}: environment variable {var!r} is not set; set it, or give a default "
         f"with ${{{var}:-value}}"
         for line, var in (("1:7", "NAME"), ("5:24", "HOST"), ("6:12", "TOPIC"))],
        id="several-undefined-variables",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: clicks
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: clicks
        tests:
          - name: smoke
            inputs: {clikcs: [{x: 1}]}
            expect: {outt: [{x: 1}]}
        """,
        ["p.yaml:12:14: inputs of test 'smoke' names 'clikcs', which is not a source; did you "
         "mean 'clicks'?",
         "p.yaml:13:14: expect of test 'smoke' names 'outt', which is not a sink; did you "
         "mean 'out'?"],
        id="test-block-names-unknown-source-and-sink",
    ),
    # ------------------------------------------------------ several problems in one file
    pytest.param(
        """\
        name: p
        job:
          epoch: 10 seconds
          checkpoint:
            mode: exactly-once
        sources:
          - id: src
            type: files
            path: /in
            format: json
            wacth: true
        sinks:
          - id: out
            type: kafka
            input: src
            topic: t
        """,
        [f"p.yaml:3:10: 'epoch' must be {DURATION}, got '10 seconds'",
         "p.yaml:5:11: 'mode' must be one of exactly_once, at_least_once; got 'exactly-once' "
         "(did you mean 'exactly_once'?)",
         "p.yaml:10:13: 'format' must be one of jsonl, csv, parquet, text; got 'json' "
         "(did you mean "
         "'jsonl'?)",
         "p.yaml:11:5: unknown key 'wacth' in source 'src'; did you mean 'watch'?",
         "p.yaml:13:5: sink 'out' is missing required key 'bootstrap_servers'"],
        id="five-structural-problems",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
          - id: unused
            type: datagen
            fields: {x: offset}
        operators:
          - id: a
            input: b
            filter: x > 1
          - id: b
            input: a
            filter: x > 2
        sinks:
          - id: out
            type: console
            input: [src, b, nope]
        """,
        # 'unused' is not reported: an unknown input (here 'nope') may be a typo for it.
        [f"p.yaml:14:12: operators form a cycle: a -> b -> a{CYCLE}",
         "p.yaml:19:21: sink 'out' has input 'nope', which is not a source or operator; known "
         "ids: a, b, src, unused"],
        id="several-reference-problems",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: srcc
          - id: log
            type: consol
            input: src
        """,
        ["p.yaml:9:12: sink 'out' has input 'srcc', which is not a source or operator; did "
         "you mean 'src'?",
         "p.yaml:11:11: unknown type 'consol' for sink 'log'; valid: console, delta, files, kafka, "
         "postgres; "
         "did you mean 'console'?"],
        id="structural-and-reference-problems-together",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: kafka
            bootstrap_servers: ${KAFKA_HOST}
            topic: t
            strat: earliest
        sinks:
          - id: out
            type: console
            input: src
        """,
        ["p.yaml:5:24: environment variable 'KAFKA_HOST' is not set; set it, or give a default "
         "with ${KAFKA_HOST:-value}",
         "p.yaml:7:5: unknown key 'strat' in source 'src'; did you mean 'start'?"],
        id="undefined-variable-and-unknown-key-together",
    ),
    # ------------------------------------------------------------------- storage_options
    pytest.param(
        """\
        name: p
        storage: s3://bucket/jobs
        storage_options:
          endpoint: http://127.0.0.1:9000
          endpoint_url: 127.0.0.1:9000
          anon: maybe
        sources:
          - {id: src, type: datagen, fields: {x: offset}}
        sinks:
          - {id: out, type: console, input: src}
        """,
        ["p.yaml:4:3: unknown key 'endpoint' in storage_options; did you mean 'endpoint_url'?",
         "p.yaml:5:17: 'endpoint_url' '127.0.0.1:9000' must be an http:// or "
         "https:// URL",
         "p.yaml:6:9: 'anon' must be true or false, got 'maybe'"],
        id="storage-options-unknown-key-bad-url-bad-switch",
    ),
    pytest.param(
        """\
        name: p
        storage: ./state
        storage_options: {key: k, secret: s}
        sources:
          - {id: src, type: datagen, fields: {x: offset}}
        sinks:
          - {id: out, type: files, input: src, path: ./out, format: jsonl}
        """,
        ["p.yaml:3:1: storage_options applies to s3:// URLs, and neither storage: nor any "
         "source or sink path is one; remove storage_options or set storage: "
         "s3://bucket/prefix"],
        id="storage-options-without-an-s3-url",
    ),
    # ------------------------------------------------------------------- broadcast inputs
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: "offset"}
          - id: rules
            type: datagen
            fields: {r: "offset"}
        operators:
          - id: k
            input: src
            key_by: [x]
            process: "fraud:Detector"
            broadcast: rulez
        sinks:
          - id: out
            type: console
            input: k
        """,
        ["p.yaml:14:16: broadcast input 'rulez' of operator 'k' is not a source or operator; "
         "did you mean 'rules'?"],
        id="broadcast-unknown-id",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: "offset"}
          - id: rules
            type: datagen
            fields: {r: "offset"}
        operators:
          - id: k
            input: src
            key_by: [x]
            process: "fraud:Detector"
            broadcast: src
        sinks:
          - id: out
            type: console
            input: k
        """,
        ["p.yaml:14:16: operator 'k' has 'src' as its input and its broadcast input; the "
         "broadcast input must be another source or operator (the rules, not the keyed "
         "records)"],
        id="broadcast-same-as-input",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: "offset"}
          - id: rules
            type: datagen
            fields: {r: "offset"}
        operators:
          - id: k
            input: src
            key_by: [x]
            window: {tumbling: 1m}
            aggregate: {n: count()}
            broadcast: rules
        sinks:
          - id: out
            type: console
            input: k
        """,
        ["p.yaml:15:5: 'broadcast' applies only to process operators; remove it from operator 'k'"],
        id="broadcast-on-a-window",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: "offset"}
          - id: rules
            type: datagen
            fields: {r: "offset"}
        operators:
          - id: k
            input: src
            key_by: [x]
            process: "fraud:Detector"
            broadcast: out
        sinks:
          - id: out
            type: console
            input: k
        """,
        ["p.yaml:14:16: broadcast input 'out' of operator 'k' is a sink, which has no output "
         "to read; name a source or operator"],
        id="broadcast-a-sink",
    ),
    pytest.param(
        """\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {x: "offset"}
          - id: rules
            type: datagen
            fields: {r: "offset"}
        operators:
          - id: k
            input: src
            key_by: [x]
            process: "fraud:Detector"
            broadcast: k
        sinks:
          - id: out
            type: console
            input: k
        """,
        ["p.yaml:14:16: operator 'k' cannot be its own broadcast input; name a source or operator"],
        id="broadcast-itself",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_invalid_pipeline_reports_every_problem_at_its_location(
    text: str, expected: list[str]
) -> None:
    lines = problems_of(text)
    assert lines == expected


@pytest.mark.parametrize("text", [pytest.param(p.values[0], id=p.id) for p in CASES
                                  if not p.marks])
def test_problems_are_in_location_order(text: str) -> None:
    """Problems come sorted by (line, col), so the output reads top to bottom."""
    with pytest.raises(PipelineError) as info:
        load_pipeline_text(textwrap.dedent(text), file="p.yaml", env={})
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
