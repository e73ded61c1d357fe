"""Valid pipeline files parse into the expected `PipelineSpec`, with every default filled in."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from streamer.pipeline.job_spec import CheckpointSpec, JobSpec
from streamer.pipeline.source_spec import WatermarkSpec
from streamer.pipeline.spec import (
    AggregateSpec,
    OperatorSpec,
    PipelineSpec,
    SinkSpec,
    SourceSpec,
    WindowSpec,
)
from streamer.pipeline.spec import (
    TestCase as PipelineTestCase,  # aliased: not unittest.TestCase (and has __test__ = False)
)
from streamer.pipeline.validate import load_pipeline, load_pipeline_text

PIPELINES_DIR = Path(__file__).resolve().parents[2] / "pipelines"

MINIMAL = """\
    name: minimal
    sources:
      - id: src
        type: datagen
        fields: {x: offset}
    sinks:
      - id: out
        type: console
        input: src
    """


def load(text: str, env: dict[str, str] | None = None) -> PipelineSpec:
    return load_pipeline_text(textwrap.dedent(text), file="p.yaml", env=env or {})


@pytest.fixture
def no_storage_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMER_STORAGE", raising=False)


def with_operator(operator: str, *, source_extra: str = "") -> str:
    """A pipeline of one datagen source, the given operator (id `op`) and a console sink."""
    return (
        "name: p\n"
        "sources:\n"
        "  - id: src\n"
        "    type: datagen\n"
        "    fields: {user: \"concat('u', offset)\", amount: offset, ts: "
        "\"timestamp_millis(offset)\"}\n"
        "    event_time: ts\n"
        f"{source_extra}"
        "operators:\n"
        "  - id: op\n"
        "    input: src\n"
        + textwrap.indent(textwrap.dedent(operator), "    ")
        + "sinks:\n"
        "  - id: out\n"
        "    type: console\n"
        "    input: op\n"
    )


# ------------------------------------------------------------------------------- defaults

@pytest.mark.usefixtures("no_storage_env")
def test_minimal_pipeline_gets_every_default() -> None:
    spec = load(MINIMAL)
    assert spec == PipelineSpec(
        name="minimal",
        description="",
        storage="./.streamer",
        job=JobSpec(parallelism=None, max_parallelism=128, epoch_ms=1000,
                    checkpoint=CheckpointSpec(interval_ms=10_000, mode="exactly_once",
                                              retain=3, timeout_ms=600_000),
                    state_backend="rocksdb", state_local_dir=None),
        spark={},
        sources=(SourceSpec(id="src", type="datagen", uid="src", schema=None,
                            event_time=None, watermark=None, on_error=None,
                            options={"splits": 1, "fields": {"x": "offset"}},
                            path=("sources", 0)),),
        operators=(),
        sinks=(SinkSpec(id="out", type="console", inputs=("src",), options={"max_rows": 20},
                        path=("sinks", 0)),),
        tests=(),
        file="p.yaml",
        positions=spec.positions,  # not compared
    )
    assert spec.job.checkpoint == CheckpointSpec()
    assert spec.job == JobSpec()


def test_storage_from_streamer_storage_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMER_STORAGE", "memory://elsewhere")
    assert load_pipeline_text(textwrap.dedent(MINIMAL), file="p.yaml").storage == (
        "memory://elsewhere")


def test_storage_in_file_wins_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMER_STORAGE", "memory://elsewhere")
    spec = load("storage: file:///data/streamer\n" + textwrap.dedent(MINIMAL))
    assert spec.storage == "file:///data/streamer"


@pytest.mark.usefixtures("no_storage_env")
def test_storage_from_env_parameter() -> None:
    spec = load(MINIMAL, env={"STREAMER_STORAGE": "memory://from-env-param"})
    assert spec.storage == "memory://from-env-param"


def test_job_settings_in_milliseconds() -> None:
    spec = load("""\
        name: tuned-job
        description: all the knobs
        job:
          parallelism: 4
          max_parallelism: 64
          epoch: 250ms
          checkpoint: {interval: 1m, mode: at_least_once, retain: 5, timeout: 2h}
          state: {backend: memory, local_dir: /tmp/state}
          restart: {attempts: 3, delay: 0s}
        spark:
          spark.sql.shuffle.partitions: 4
          spark.sql.adaptive.enabled: false
          spark.app.name: x
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """)
    assert spec.description == "all the knobs"
    assert spec.job == JobSpec(
        parallelism=4, max_parallelism=64, epoch_ms=250,
        checkpoint=CheckpointSpec(interval_ms=60_000, mode="at_least_once", retain=5,
                                  timeout_ms=7_200_000),
        state_backend="memory", state_local_dir="/tmp/state",
        restart_attempts=3, restart_delay_ms=0)
    assert spec.spark == {"spark.sql.shuffle.partitions": "4",
                          "spark.sql.adaptive.enabled": "false", "spark.app.name": "x"}


@pytest.mark.parametrize(("text", "ms"), [
    ("1ms", 1), ("250ms", 250), ("1s", 1000), ("1.5s", 1500), ("5m", 300_000),
    ("2h", 7_200_000), ("1d", 86_400_000), (" 10s ", 10_000),
])
def test_durations_become_milliseconds(text: str, ms: int) -> None:
    spec = load(f"job: {{epoch: '{text}'}}\n" + textwrap.dedent(MINIMAL))
    assert spec.job.epoch_ms == ms


# ---------------------------------------------------------------- environment variables

def test_variables_are_substituted_from_env() -> None:
    spec = load("""\
        name: ${JOB_NAME}
        storage: ${STORE:-./.streamer}/jobs
        sources:
          - id: src
            type: kafka
            bootstrap_servers: ${KAFKA_HOST}:${KAFKA_PORT:-9092}
            topic: ${TOPIC:-clicks}
            properties: {sasl.password: "${PASSWORD}", plain: $HOME, empty: "${NONE:-}"}
        sinks:
          - id: out
            type: console
            input: src
        """, env={"JOB_NAME": "from-env", "KAFKA_HOST": "broker", "TOPIC": "orders",
                  "PASSWORD": "s3cr3t"})
    assert spec.name == "from-env"
    assert spec.storage == "./.streamer/jobs"
    src = spec.node("src")
    assert isinstance(src, SourceSpec)
    assert src.option("bootstrap_servers") == "broker:9092"
    assert src.option("topic") == "orders"
    assert src.option("properties") == {"sasl.password": "s3cr3t", "plain": "$HOME",
                                        "empty": ""}


def test_default_is_used_only_when_the_variable_is_unset() -> None:
    text = """\
        name: ${NAME:-fallback}
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """
    assert load(text).name == "fallback"
    assert load(text, env={"NAME": "given"}).name == "given"
    assert load(text, env={"OTHER": "x"}).name == "fallback"


def test_default_is_used_when_the_variable_is_empty() -> None:
    spec = load("""\
        name: ${NAME:-fallback}
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """, env={"NAME": ""})
    assert spec.name == "fallback"


def test_variable_in_a_number_setting() -> None:
    spec = load("""\
        name: p
        job:
          parallelism: ${PARALLELISM:-2}
        sources:
          - id: src
            type: datagen
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """)
    assert spec.job.parallelism == 2


# ------------------------------------------------------------ sources, sinks, references

def test_union_inputs_and_operators_in_any_order() -> None:
    spec = load("""\
        name: union
        sources:
          - id: a
            type: datagen
            fields: {x: offset}
          - id: b
            type: datagen
            fields: {x: offset}
        operators:
          - id: big
            input: both
            filter: x > 10
          - id: both
            input: [a, b]
            with_columns: {y: x * 2, z: "'z'"}
        sinks:
          - id: out
            type: console
            input: [big, both]
        """)
    big, both = spec.operators
    assert big == OperatorSpec(id="big", inputs=("both",), kind="filter",
                               path=("operators", 0), uid="big", filter="x > 10")
    assert both == OperatorSpec(id="both", inputs=("a", "b"), kind="with_columns",
                                path=("operators", 1), uid="both",
                                columns=(("y", "x * 2"), ("z", "'z'")))
    assert spec.sinks[0].inputs == ("big", "both")
    assert not big.stateful
    assert big.keyed_kind is None


def test_dead_letter_sinks_need_no_input() -> None:
    spec = load("""\
        name: dlq
        sources:
          - id: raw
            type: files
            path: /data/in/*.jsonl
            format: jsonl
            watch: true
            schema: {user: string, ts: timestamp}
            event_time: ts
            on_error: bad_records
          - id: orders
            type: kafka
            bootstrap_servers: k1:9092,k2:9092
            topics: [orders, returns]
            start: earliest
            format: json
            event_time: ts
            on_error: bad_records
        operators:
          - id: counts
            input: [raw, orders]
            key_by: user
            window: {tumbling: 1m, late: too_late}
            aggregate: {n: count()}
        sinks:
          - id: out
            type: files
            input: counts
            path: s3://bucket/out
            format: parquet
          - id: bad_records
            type: console
            max_rows: 5
          - id: too_late
            type: kafka
            bootstrap_servers: k1:9092
            topic: late
            format: json
            key: user
        """)
    assert spec.dead_letter_sinks == {"bad_records", "too_late"}
    assert [s.inputs for s in spec.sinks] == [("counts",), (), ()]
    raw = spec.node("raw")
    assert raw == SourceSpec(
        id="raw", type="files", uid="raw", schema=(("user", "string"), ("ts", "timestamp")),
        event_time="ts", watermark=WatermarkSpec(0, None), on_error="bad_records",
        options={"path": "/data/in/*.jsonl", "format": "jsonl", "watch": True, "header": True,
                 "delimiter": ",", "reload": False},
        path=("sources", 0))
    orders = spec.node("orders")
    assert isinstance(orders, SourceSpec)
    assert orders.options == {
        "bootstrap_servers": "k1:9092,k2:9092", "topics": ["orders", "returns"],
        "start": "earliest", "format": "json", "bounded": False, "client": "confluent",
        "max_records_per_epoch": 1_000_000}
    assert spec.sinks[0].option("format") == "parquet"
    assert spec.sinks[1].option("max_rows") == 5
    assert spec.sinks[2].option("key") == "user"
    assert spec.sinks[2].option("missing", "default") == "default"


def test_watermark_and_source_uid() -> None:
    spec = load("""\
        name: p
        sources:
          - id: src
            uid: clicks-v1
            type: datagen
            splits: 4
            rows_per_second: 100.5
            limit: 0
            fields: {ts: "timestamp_millis(offset)"}
            event_time: ts
            watermark: {max_out_of_orderness: 0s, idle_timeout: 1m}
        sinks:
          - id: out
            type: console
            input: src
        """)
    src = spec.sources[0]
    assert src.uid == "clicks-v1"
    assert src.watermark == WatermarkSpec(max_out_of_orderness_ms=0, idle_timeout_ms=60_000)
    assert src.options == {"splits": 4, "rows_per_second": 100.5, "limit": 0,
                           "fields": {"ts": "timestamp_millis(offset)"}}


def test_tests_block() -> None:
    spec = load("""\
        name: p
        sources:
          - id: clicks
            type: datagen
            fields: {user: "'a'"}
        sinks:
          - id: out
            type: console
            input: clicks
        tests:
          - name: one click
            inputs: {clicks: [{user: a, ts: "2026-01-01T00:00:01Z"}]}
            expect: {out: [{user: a}]}
        """)
    assert spec.tests == (PipelineTestCase(
        name="one click", inputs={"clicks": [{"user": "a", "ts": "2026-01-01T00:00:01Z"}]},
        expect={"out": [{"user": "a"}]}, path=("tests", 0)),)


def test_locations_are_kept_on_the_spec() -> None:
    spec = load(MINIMAL)
    assert str(spec.where(("sources", 0, "fields"))) == "p.yaml:5:13"
    assert str(spec.where(("sources", 0, "fields"), key=True)) == "p.yaml:5:5"
    assert str(spec.where(("sinks", 0, "input", "nothing", 3))) == "p.yaml:9:12"
    assert spec.node("out") is spec.sinks[0]
    with pytest.raises(KeyError):
        spec.node("missing")


def test_load_pipeline_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(MINIMAL), encoding="utf-8")
    spec = load_pipeline(str(path), env={})
    assert spec.name == "minimal"
    assert spec.file == str(path)


def test_yaml_11_boolean_words_as_column_names() -> None:
    spec = load(with_operator("""\
        select: {on: user, off: amount}
        """))
    assert spec.operators[0].columns == (("on", "user"), ("off", "amount"))


def test_yaml_12_keys_and_values_are_kept_as_written() -> None:
    """Only true/false are booleans (YAML 1.2): `yes`, `no`, `on` stay strings, and mapping
    keys are kept as written (`True:` is the column 'True', not a boolean)."""
    spec = load(with_operator("""\
        select: {yes: user, no: amount, True: user, null: amount}
        """))
    assert spec.operators[0].columns == (("yes", "user"), ("no", "amount"), ("True", "user"),
                                         ("null", "amount"))
    src = load("""\
        name: p
        sources:
          - id: src
            type: files
            path: /in
            format: csv
            header: true
            delimiter: no
        sinks:
          - id: out
            type: console
            input: src
        """).sources[0]
    assert src.option("header") is True
    assert src.option("delimiter") == "no"


def test_pipeline_test_case_is_not_collected_by_pytest() -> None:
    assert PipelineTestCase.__test__ is False


# ---------------------------------------------------------------------- YAML merge keys

def test_merge_key_in_a_sources_entry() -> None:
    """`<<: *anchor` (YAML merge key) fills keys of a sources entry from another mapping."""
    spec = load("""\
        name: p
        sources:
          - id: a
            type: files
            path: /in/a
            <<: &csv {format: csv, header: true, delimiter: ";"}
          - id: b
            type: files
            path: /in/b
            <<: *csv
        sinks:
          - id: out
            type: console
            input: [a, b]
        """)
    for source_id in ("a", "b"):
        src = spec.node(source_id)
        assert isinstance(src, SourceSpec)
        assert src.type == "files"
        assert src.options == {"path": f"/in/{source_id}", "format": "csv", "header": True,
                               "delimiter": ";", "watch": False, "reload": False}


def test_merge_key_local_keys_override_merged_ones() -> None:
    """The common use: copy a whole source and change its id (YAML merge: keys written in
    the mapping win over merged ones)."""
    spec = load("""\
        name: p
        sources:
          - &base
            id: a
            type: datagen
            fields: {x: offset}
          - <<: *base
            id: b
            rows_per_second: 5
        sinks:
          - id: out
            type: console
            input: [a, b]
        """)
    a, b = spec.node("a"), spec.node("b")
    assert isinstance(a, SourceSpec)
    assert isinstance(b, SourceSpec)
    assert (a.type, a.options) == ("datagen", {"splits": 1, "fields": {"x": "offset"}})
    assert (b.type, b.options) == ("datagen", {"splits": 1, "fields": {"x": "offset"},
                                               "rows_per_second": 5})


def test_merge_key_list_earlier_mappings_win() -> None:
    spec = load("""\
        name: p
        sources:
          - id: src
            <<: [{type: datagen, rows_per_second: 1}, {type: files, rows_per_second: 2}]
            fields: {x: offset}
        sinks:
          - id: out
            type: console
            input: src
        """)
    src = spec.sources[0]
    assert src.type == "datagen"
    assert src.options == {"splits": 1, "rows_per_second": 1, "fields": {"x": "offset"}}


# ------------------------------------------------------------------------ keyed operators

@pytest.mark.parametrize(("window", "expected"), [
    pytest.param("{tumbling: 1m}", WindowSpec("tumbling", size_ms=60_000), id="tumbling"),
    pytest.param("{sliding: {size: 1h, slide: 15m}, emit: updates}",
                 WindowSpec("sliding", size_ms=3_600_000, slide_ms=900_000, emit="updates"),
                 id="sliding"),
    pytest.param("{sliding: {size: 10s, slide: 10s}}",
                 WindowSpec("sliding", size_ms=10_000, slide_ms=10_000), id="sliding-equal"),
    pytest.param("{session: {gap: 30s}, time: processing}",
                 WindowSpec("session", gap_ms=30_000, time="processing"), id="session"),
    pytest.param("{count: 100, time: event, allowed_lateness: 0s}",
                 WindowSpec("count", count=100, time="event"), id="count"),
    pytest.param("{tumbling: 5m, allowed_lateness: 30s, late: late_rows, emit: final}",
                 WindowSpec("tumbling", size_ms=300_000, allowed_lateness_ms=30_000,
                            late="late_rows"), id="tumbling-with-late-output"),
])
def test_window_kinds(window: str, expected: WindowSpec) -> None:
    text = with_operator(f"""\
        key_by: [user]
        window: {window}
        aggregate: {{clicks: count(), total: sum(amount)}}
        """)
    if "late_rows" in window:
        text += "  - id: late_rows\n    type: console\n"
    op = load(text).operators[0]
    assert op == OperatorSpec(
        id="op", inputs=("src",), kind="keyed", path=("operators", 0), uid="op",
        key_by=("user",), window=expected,
        aggregates=(AggregateSpec("clicks", "count", None),
                    AggregateSpec("total", "sum", "amount")))
    assert op.stateful
    assert op.keyed_kind == "window"


@pytest.mark.parametrize(("call", "function", "arg"), [
    ("count()", "count", None),
    ("count(*)", "count", None),
    ("count( )", "count", None),
    ("sum(amount)", "sum", "amount"),
    ("SUM(amount)", "sum", "amount"),
    ("min(amount)", "min", "amount"),
    ("max(amount)", "max", "amount"),
    ("avg( amount * 2 )", "avg", "amount * 2"),
    ("first(user)", "first", "user"),
    ("last(user)", "last", "user"),
    ("collect_list(user)", "collect_list", "user"),
    ("count_distinct(user)", "count_distinct", "user"),
    ("sum(coalesce(amount, 0))", "sum", "coalesce(amount, 0)"),
])
def test_rolling_aggregate_functions(call: str, function: str, arg: str | None) -> None:
    op = load(with_operator(f"""\
        key_by: user
        aggregate: {{value: "{call}"}}
        """)).operators[0]
    assert op.aggregates == (AggregateSpec("value", function, arg),)
    assert op.window is None
    assert op.keyed_kind == "aggregate"


def test_aggregates_keep_their_written_order() -> None:
    op = load(with_operator("""\
        key_by: [user, amount]
        aggregate:
          z: count()
          a: max(ts)
          m: collect_list(amount)
        """)).operators[0]
    assert op.key_by == ("user", "amount")
    assert [a.name for a in op.aggregates] == ["z", "a", "m"]


@pytest.mark.parametrize(("within", "ms"), [("1h", 3_600_000), ("90s", 90_000),
                                            ("1500ms", 1500), ("0.5s", 500)])
def test_dedupe(within: str, ms: int) -> None:
    op = load(with_operator(f"""\
        key_by: user
        uid: dedupe-v2
        dedupe: {{within: {within}}}
        """)).operators[0]
    assert op == OperatorSpec(id="op", inputs=("src",), kind="keyed", path=("operators", 0),
                              uid="dedupe-v2", uid_explicit=True, key_by=("user",),
                              dedupe_within_ms=ms)
    assert op.keyed_kind == "dedupe"


def test_process() -> None:
    op = load(with_operator("""\
        key_by: [user]
        process: fraud.rules:LargeAfterSmall
        """)).operators[0]
    assert op.process == "fraud.rules:LargeAfterSmall"
    assert op.keyed_kind == "process"
    assert op.uid == "op"
    assert not op.uid_explicit


def test_select_and_filter_specs() -> None:
    spec = load("""\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {line: "'a b'"}
        operators:
          - id: words
            input: src
            select: {word: "explode(split(line, ' '))"}
          - id: long_words
            input: words
            filter: length(word) > 3
        sinks:
          - id: out
            type: console
            input: long_words
        """)
    words, long_words = spec.operators
    assert (words.kind, words.columns) == ("select", (("word", "explode(split(line, ' '))"),))
    assert (long_words.kind, long_words.filter) == ("filter", "length(word) > 3")


# ------------------------------------------------------------------ example pipelines

EXAMPLES = sorted([*PIPELINES_DIR.glob("*.yaml"), *PIPELINES_DIR.glob("*.yml")])


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_pipeline_validates(path: Path) -> None:
    spec = load_pipeline(str(path), env={})
    assert spec.sources
    assert spec.sinks


def test_example_pipelines_exist() -> None:
    if not EXAMPLES:
        pytest.skip(f"no example pipelines in {PIPELINES_DIR} yet")
    assert len({p.stem for p in EXAMPLES}) == len(EXAMPLES)
