"""How a keyed subtask runs inside a task: its batches (`subtask_batches`: `run_task`'s,
with the metadata reported and the output rows, or with a task-written sink their staging
file) and, for a plain job in local mode, which subtask the task runs (`claim_subtask`).

A keyed stage's tasks are one per subtask. PySpark hands each task whichever idle Python
worker it likes: on this machine's local[2], two successive 2-task jobs gave their partitions
to the two workers in an order that changed from job to job (10 jobs of 2 tasks: 5 swaps).
When partition i always runs subtask i, a swap makes each worker open the subtask the other
has parked: close, flush and open handed across processes, 20-55 ms a task on the table-join
benchmark, in about two epochs of three. So in local mode a task *claims* a subtask: first
one whose state its worker still holds (`state.held_subtasks`), else the first one left.

A claim is a file `<epoch>-<subtask>` in a directory of the stage's, made with one atomic
link, holding the claiming partition. Every attempt and every evaluation of a partition in
an epoch finds its partition's claim and runs the same subtask (a retried or replayed task
replays that subtask's stored output), and no two partitions share a subtask, so the epoch
still runs each subtask exactly once, as the keyed stage's contract needs. Claims of epochs
two behind are removed by the claimers.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from streamer import columns as C
from streamer.columns import META, OUT
from streamer.operators.keyed import run_task
from streamer.operators.keyed_config import KeyedConfig


def claim_subtask(directory: str, epoch: int, partition: int, parallelism: int,
                  preferred: Sequence[int]) -> int:
    """The subtask partition `partition` runs in `epoch`: the one it claimed before, else
    the first of `preferred` (then of all subtasks) that no other partition claimed."""
    os.makedirs(directory, exist_ok=True)
    prefix = f"{epoch}-"
    names = os.listdir(directory)
    for name in names:
        if name.startswith(prefix) and _claimer(os.path.join(directory, name)) == partition:
            return int(name[len(prefix):])
    for name in names:
        stale = name.split("-", 1)[0]
        if stale.isdigit() and int(stale) < epoch - 1:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
    staged = os.path.join(directory, f".{uuid.uuid4().hex}")
    with open(staged, "w") as handle:
        handle.write(str(partition))
    try:
        for subtask in [*preferred, *range(parallelism)]:
            if not 0 <= subtask < parallelism:
                continue
            try:
                os.link(staged, os.path.join(directory, f"{prefix}{subtask}"))
            except FileExistsError:
                continue
            return subtask
    finally:
        os.unlink(staged)
    msg = (f"epoch {epoch}: partition {partition} found all {parallelism} subtasks claimed "
           f"in {directory!r}; a keyed job ran more tasks than subtasks")
    raise RuntimeError(msg)


def _claimer(path: str) -> int | None:
    """The partition that made the claim `path` (None: unreadable)."""
    try:
        with open(path) as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return None


def subtask_batches(cfg: KeyedConfig, batches: Iterator[Any], subtask: int, write_to: Any,
                    report: Callable[[str], None], run: Any = None) -> Iterator[Any]:
    """`run_task` (or `run`) of one subtask, as a Spark task or the driver runs it: hands
    each metadata row's JSON to `report` and yields the batches with output rows (with
    `write_to`, a files sink's `TaskTarget`, the output rows go to the subtask's staging
    file instead)."""
    from streamer.connectors.files.files_sink import TaskFile

    out = None if write_to is None else TaskFile(write_to, subtask, C.ROW_KIND, OUT)
    try:
        for batch in (run or run_task)(cfg, batches, subtask):
            kinds = batch.column(0).to_pylist()
            for i, kind in enumerate(kinds):
                if kind == META:
                    report(batch.column(1)[i].as_py())
            if out is not None:
                batch = out.take(batch)
            if batch.num_rows:
                yield batch
        if out is not None:
            written = out.close()
            report(json.dumps({"subtask": subtask, "sink_rows": written,
                               "sink_refused": out.refused}))
    except BaseException:
        if out is not None:
            out.discard()
        raise


def subtask_of_rows(batches: Iterator[Any]) -> tuple[Iterator[Any], int]:
    """(`batches` unchanged, the subtask they are for): every partition of a keyed stage's
    input holds rows of one subtask and at least one row (its dummy row, or, for the tasks
    that read their input themselves, the start row whose `id` is the subtask)."""
    held = []
    for batch in batches:
        held.append(batch)
        if batch.num_rows:
            names = batch.schema.names
            column = batch.column(names.index(C.SUBTASK if C.SUBTASK in names else "id"))
            return itertools.chain(held, batches), int(column[0].as_py())
    msg = "a keyed stage's task received no rows: its partition lacks the subtask's start row"
    raise RuntimeError(msg)


def output_rows(batch: Any) -> Any:
    """The output rows of a keyed task's batch, without the stage's bookkeeping columns."""
    import pyarrow.compute as pc

    out = batch.filter(pc.equal(batch.column(C.ROW_KIND), OUT))
    return out.select([n for n in out.schema.names if n not in C.BOOKKEEPING])
