"""Named crash points for the crash tests (like FoundationDB's and TiKV's fail points). A core
module: the driver, keyed tasks (`operators`) and state snapshots (`state`) all reach them.

`STREAMER_TEST_FAILPOINTS="after-metadata:3,mid-upload:2"` makes the run SIGKILL its driver process
(`streamer run`, and with it Spark) the first time the named point is reached for checkpoint or
epoch number >= the given one (any number when it is left out). Points:

- `starting`               driver, the job claimed in its registry, Spark not yet started
- `recovering:<chk>`       driver, resuming from checkpoint <chk> (at start-up or in a
                           restart), its offsets, state and sink commits not yet restored
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
- `barrier-injected:<chk>` driver, continuous mode: barrier <chk> injected at every subtask,
                           none of their acknowledgements taken yet
- `mid-transaction:<epoch>` driver, a Kafka sink's records of <epoch> produced in its
                           transaction, which is not committed yet
- `source-slice:<n>`       a continuous source subtask, having sent its n-th slice of
                           records on (with `sleep=`: a stream that lasts, for a test that
                           needs checkpoints to come while the sources are mid-input)
(In the continuous mode `in-task:<chk>` is a keyed subtask at barrier <chk>, its snapshot
uploaded and not acknowledged; `mid-upload`, `after-metadata` are as above, numbered by
checkpoint.)

A third part, `sleep=<seconds>`, makes the point stall instead of kill (`after-snapshot:0:sleep=30`
holds the driver in a checkpoint): a stop that takes long, deterministically. `pause=<path>`
holds it until the file `<path>` exists, having created `<path>.reached` on arrival (at most
`PAUSE_MAX_S`): a test waits for the one, acts on the held job, then creates the other.
`raise` makes it raise `FailPointError` in the process that reaches it, once per process (Bytewax's
`ABORT`): a failure that the run's restarts recover from in place, for a recovery test that
needs no SIGKILL, so no fresh JVM (`epoch-start:3:raise` fails epoch 3 once; its restart
goes on).

Unset (always, outside tests), `reached` is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import time

ENV = "STREAMER_TEST_FAILPOINTS"
DRIVER_PID_ENV = "STREAMER_TEST_DRIVER_PID"
#: The longest a `pause=` point holds (a test that never releases it fails, not hangs).
PAUSE_MAX_S = 600.0
#: Points armed with `raise` that have raised in this process (each raises once).
_raised: set[str] = set()


class FailPointError(RuntimeError):
    """Raised by a fail point armed with `raise` (tests only): the run fails as if the step at
    that point had failed, and its restart policy decides what happens next."""


def _armed() -> dict[str, tuple[int, str]]:
    """Each armed point: (the first number it acts at, its action: "" to kill,
    `sleep=<seconds>`, `pause=<path>` or `raise`)."""
    spec = os.environ.get(ENV, "")
    points: dict[str, tuple[int, str]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, rest = part.partition(":")
        number, _, action = rest.partition(":")
        points[name] = (int(number) if number else 0, action)
    return points


def reached(name: str, number: int = 0) -> None:
    """Kill the driver (SIGKILL: no cleanup), stall, pause or raise, if fail point `name` is
    armed for `number`."""
    if ENV not in os.environ:
        return
    at, action = _armed().get(name, (None, ""))
    if at is None or number < at:
        return
    if action.startswith("sleep="):
        time.sleep(float(action.removeprefix("sleep=")))  # a signal's handler ends it early
        return
    if action.startswith("pause="):
        _pause(action.removeprefix("pause="))
        return
    if action == "raise":
        if name not in _raised:
            _raised.add(name)
            msg = f"fail point {name!r} reached at {number} (armed with raise)"
            raise FailPointError(msg)
        return
    pid = int(os.environ.get(DRIVER_PID_ENV) or os.getpid())
    os.kill(pid, signal.SIGKILL)
    if pid != os.getpid():  # a Spark worker: wait to be torn down with the driver
        os.kill(os.getpid(), signal.SIGKILL)


def _pause(gate: str) -> None:
    """Announce the arrival (`<gate>.reached`), then hold until `gate` exists."""
    with open(f"{gate}.reached", "a", encoding="utf-8"):
        pass
    deadline = time.monotonic() + PAUSE_MAX_S
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
