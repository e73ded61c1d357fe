"""What a run needs that can be checked before Spark starts, in a second instead of a
minute: the savepoint to restore exists, every Kafka broker the pipeline names accepts a
connection, every bounded files source has files; and whether the job already finished.

`streamer run`, `restore` and `test` call `preflight` first; each problem is raised (or
warned about) here once, with the fix, and nothing after it runs.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from streamer.exceptions import StreamerError
from streamer.pipeline.spec import PipelineSpec, SourceSpec
from streamer.runtime.exceptions import JobFinishedError, PreflightError

#: Seconds a broker has to accept a TCP connection.
CONNECT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class PreflightOptions:
    """What the command was asked to do."""

    storage: str | None = None
    from_savepoint: str | None = None
    from_checkpoint: str | None = None
    fresh: bool = False
    checkpoints: bool = True
    #: Sources replaced by inline rows (`streamer test`): nothing of theirs is checked.
    replaced: frozenset[str] = frozenset()
    #: Whether the sinks are written (not in `streamer test`).
    sinks: bool = True


def preflight(spec: PipelineSpec, options: PreflightOptions,
              warn: Callable[[str], None]) -> None:
    """Raise `PreflightError` with every problem found, or `JobFinishedError`; call `warn`
    for what is odd but may be meant (a watched path with no files yet)."""
    problems: list[str] = []
    if options.from_savepoint:
        from streamer.savepoint.savepoint_metadata import read_metadata

        try:
            read_metadata(options.from_savepoint)
        except StreamerError as exc:
            problems.append(f"{exc}; give the savepoint's directory (`streamer savepoint "
                            "list` shows them)")
    problems += _brokers(spec, options)
    for source in spec.sources:
        if source.type == "files" and source.id not in options.replaced:
            problem = _files(source, warn)
            if problem:
                problems.append(problem)
    if problems:
        raise PreflightError(problems[0] if len(problems) == 1 else
                             f"{len(problems)} problems stop the run before it starts:\n"
                             + "\n".join(f"- {p}" for p in problems))
    if options.checkpoints and not (options.fresh or options.from_savepoint
                                    or options.from_checkpoint):
        _finished(spec, options)


def _servers(value: object) -> list[tuple[str, int]]:
    """`host:port` pairs of a `bootstrap_servers` value (a comma-separated string)."""
    found = []
    for item in str(value or "").split(","):
        host, _, port = item.strip().rpartition(":")
        if host and port.isdigit():
            found.append((host.strip("[]"), int(port)))
    return found


def _reachable(servers: Iterable[tuple[str, int]]) -> str | None:
    """None when one of `servers` accepts a TCP connection, else the last reason."""
    reason = "no host:port given"
    for host, port in servers:
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
                return None
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
    return reason.lower()


def _brokers(spec: PipelineSpec, options: PreflightOptions) -> list[str]:
    """One problem per Kafka bootstrap list no broker of which accepts a connection."""
    users: dict[str, list[str]] = {}  # bootstrap_servers -> who uses them
    for source in spec.sources:
        if source.type == "kafka" and source.id not in options.replaced:
            users.setdefault(str(source.option("bootstrap_servers")), []).append(
                f"source {source.id!r}")
    for sink in spec.sinks if options.sinks else ():
        if sink.type == "kafka":
            users.setdefault(str(sink.option("bootstrap_servers")), []).append(
                f"sink {sink.id!r}")
    problems = []
    for servers, who in users.items():
        reason = _reachable(_servers(servers))
        if reason is not None:
            problems.append(f"{' and '.join(who)} cannot reach Kafka at {servers!r} "
                            f"({reason}); start the broker (scripts/kafka_broker.py for "
                            "development) or fix bootstrap_servers")
    return problems


def _files(source: SourceSpec, warn: Callable[[str], None]) -> str | None:
    """Why a local files source has nothing to read (None: it has, or cannot tell here)."""
    import os

    from fsspec.core import url_to_fs

    from streamer.connectors.files.files_source import is_local

    url = str(source.option("path"))
    try:
        fs, root = url_to_fs(url)
        if not is_local(fs):
            return None  # (remote listings need credentials; the run reports them)
        found = fs.glob(root) if any(c in root for c in "*?[") else (
            fs.ls(root) if fs.isdir(root) else [root] if fs.isfile(root) else [])
    except OSError:
        found = []
    if any(not os.path.basename(p.rstrip("/")).startswith(("_", ".")) for p in found):
        return None
    where = f"(relative paths are resolved against {os.getcwd()})" if not os.path.isabs(
        url) and "://" not in url else ""
    if source.option("watch") or source.option("reload"):
        warn(f"source {source.id!r} watches {url!r}, which matches no file yet {where}; it "
             "waits for files to arrive".replace("  ", " "))
        return None
    return (f"source {source.id!r} reads {url!r}, which matches no file {where}; fix path:, "
            "or set watch: true to wait for files").replace("  ", " ")


def _finished(spec: PipelineSpec, options: PreflightOptions) -> None:
    """Raise `JobFinishedError` when the job's last run finished and a new one would read
    nothing: every source is bounded and no files arrived since the last checkpoint."""
    from streamer.checkpoint.checkpoint_metadata import CheckpointStore
    from streamer.runtime.job.control import JobRegistry

    storage = options.storage or spec.storage
    try:
        record = JobRegistry(storage, spec.name).read()
    except StreamerError:
        return
    if not record or record.get("status") != "finished":
        return
    if any(s.type != "files" or s.option("watch") or s.option("reload")
           for s in spec.sources):
        return  # (datagen and Kafka sources: the run decides)
    store = CheckpointStore(storage, spec.name)
    for checkpoint_id in reversed(store.ids()):
        try:
            meta = store.read(checkpoint_id)
        except StreamerError:
            continue
        break
    else:
        return
    for source in spec.sources:
        done = meta.offsets.get(source.id, {}).get("files")
        if not isinstance(done, list):
            return
        if _new_files(source, set(done)):
            return
    reason = record.get("reason") or "its sources are exhausted"
    msg = (f"job {spec.name!r} already finished ({reason}; checkpoint {checkpoint_id}) and "
           "no new input has arrived; its output is complete. Run with --fresh to start "
           "over")
    raise JobFinishedError(msg)


def _new_files(source: SourceSpec, done: set[str]) -> bool:
    """Whether a files source lists a file not in `done` (or cannot tell)."""
    from streamer.connectors.base import ConnectorContext
    from streamer.connectors.files.files_source import FilesSource

    try:
        # (Listing files needs no Spark session: the context holds none.)
        no_spark: Any = None
        listed = FilesSource(source, ConnectorContext(spark=no_spark, job_name=""))
        return bool(set(listed.list_files()) - done)
    except Exception:
        return True
