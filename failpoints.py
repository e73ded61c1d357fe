"""Named crash points for the crash tests (like FoundationDB's and TiKV's fail points). A core
module: the driver, keyed tasks (`operators`) and state snapshots (`state`) all reach them.

`STREAMER_FAILPOINTS="after-metadata:3,mid-upload:2"` makes the run SIGKILL its driver process
(`streamer run`, and with it Spark) the first time the named point is reached for checkpoint or
epoch number >= the given one (any number when it is left out). Points:

- `epoch-start:<epoch>`    driver, before the epoch's Spark job
- `staged:<epoch>`         driver, a keyed stage's input staged as parquet files for its
                           subtasks (`StagedRun`), the subtasks not yet run
- `arrow-written:<epoch>`  driver, a sink's staging written by its source's Arrow tasks
                           (`ToSink`), the sink not yet staged
- `in-task:<epoch>`        a keyed subtask, after its work and before its state commit
- `mid-upload:<chk>`       a keyed subtask, after uploading the first file of a snapshot
- `after-snapshot:<chk>`   driver, snapshots uploaded, `_metadata` not yet written
- `after-metadata:<chk>`   driver, `_metadata` written, sinks not yet committed
- `mid-commit:<chk>`       driver, the first sink committed, others not
- `cancelling`             driver, a run that failed or was cancelled, before it records how

A third part, `sleep=<seconds>`, makes the point stall instead of kill (`after-snapshot:0:sleep=30`
holds the driver in a checkpoint): a stop that takes long, deterministically.

Unset (always, outside tests), `reached` is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import time

ENV = "STREAMER_FAILPOINTS"
DRIVER_PID_ENV = "STREAMER_DRIVER_PID"


def _armed() -> dict[str, tuple[int, float | None]]:
    """Each armed point: (the first number it acts at, seconds to sleep or None to kill)."""
    spec = os.environ.get(ENV, "")
    points: dict[str, tuple[int, float | None]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, rest = part.partition(":")
        number, _, action = rest.partition(":")
        sleep = float(action.removeprefix("sleep=")) if action else None
        points[name] = (int(number) if number else 0, sleep)
    return points


def reached(name: str, number: int = 0) -> None:
    """Kill the driver (SIGKILL: no cleanup), or stall, if fail point `name` is armed for
    `number`."""
    if ENV not in os.environ:
        return
    at, sleep = _armed().get(name, (None, None))
    if at is None or number < at:
        return
    if sleep is not None:
        time.sleep(sleep)  # a signal's handler that raises ends it early
        return
    pid = int(os.environ.get(DRIVER_PID_ENV) or os.getpid())
    os.kill(pid, signal.SIGKILL)
    if pid != os.getpid():  # a Spark worker: wait to be torn down with the driver
        os.kill(os.getpid(), signal.SIGKILL)
