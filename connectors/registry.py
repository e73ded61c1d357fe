"""Which class implements each source and sink `type:` of the pipeline file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import ConnectorContext, Sink, Source
from streamer.connectors.builtin.console import ConsoleSink
from streamer.connectors.builtin.datagen import DatagenSource
from streamer.connectors.delta.delta_sink import DeltaSink
from streamer.connectors.exceptions import ConnectorError
from streamer.connectors.files.files_sink import FilesSink
from streamer.connectors.files.files_source import FilesSource
from streamer.connectors.kafka.kafka_sink import KafkaSink
from streamer.connectors.kafka.kafka_source import KafkaSource
from streamer.connectors.postgres.postgres_sink import PostgresSink

if TYPE_CHECKING:
    from streamer.pipeline.spec import PipelineSpec, SinkSpec, SourceSpec

SOURCES: dict[str, type[Source]] = {"datagen": DatagenSource, "files": FilesSource,
                                    "kafka": KafkaSource}
SINKS: dict[str, type[Sink]] = {"console": ConsoleSink, "delta": DeltaSink, "files": FilesSink,
                                 "kafka": KafkaSink, "postgres": PostgresSink}
#: Types the pipeline file accepts that this version cannot run yet.
NOT_YET: tuple[str, ...] = ()


def session_conf(spec: PipelineSpec, conf: Mapping[str, Any]) -> dict[str, str]:
    """The Spark settings the pipeline's connectors add to `conf` at the session's start:
    Spark's Kafka connector (a `client: spark` source) and S3A with its `fs.s3a.*` settings
    (files on s3://), each connector's packages after those before it on
    `spark.jars.packages`."""
    from streamer.connectors.files import s3a
    from streamer.connectors.kafka import kafka_source as kafka

    out: dict[str, str] = {}
    for connector in (kafka, s3a):
        out.update(connector.session_conf(spec, {**conf, **out}))
    return out


def _unavailable(kind: str, node_id: str, type_name: str, known: list[str]) -> str:
    """The message for a `type:` without an implementation here."""
    if type_name in NOT_YET:
        return (f"{kind} {node_id!r} has type: {type_name}, but {type_name} sources/sinks are "
                f"not available in this version yet; use type: {' or '.join(known)} for now")
    return f"{kind} {node_id!r} has unknown type {type_name!r}; use type: {' or '.join(known)}"


def make_source(spec: SourceSpec, ctx: ConnectorContext) -> Source:
    """The source that runs `spec`."""
    cls = SOURCES.get(spec.type)
    if cls is None:
        msg = _unavailable("source", spec.id, spec.type, list(SOURCES))
        raise ConnectorError(msg)
    return cls(spec, ctx)


def make_sink(spec: SinkSpec, ctx: ConnectorContext) -> Sink:
    """The sink that runs `spec`."""
    cls = SINKS.get(spec.type)
    if cls is None:
        msg = _unavailable("sink", spec.id, spec.type, list(SINKS))
        raise ConnectorError(msg)
    return cls(spec, ctx)
