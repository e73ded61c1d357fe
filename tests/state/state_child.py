"""Work done in a spawned Python process by the state contract tests (a fresh interpreter, like
another PySpark worker): importable without pytest, so the child starts quickly.
"""

from __future__ import annotations

from typing import Any

from streamer.state import BackendOptions, StateDescriptor, open_backend
from streamer.state.exceptions import StateLockedError


def try_open(kind: str, root: str, states: list[StateDescriptor]) -> str:
    """Open subtask 0 of job/op with a short lock wait; report 'locked' or 'opened'."""
    try:
        backend = open_backend(kind, root, "job", "op", 0, range(8), states=states,
                               options=BackendOptions(lock_timeout_s=0.1))
    except StateLockedError as exc:
        return f"locked: {exc}"
    backend.close()
    return "opened"


def read_and_advance(kind: str, root: str, states: list[StateDescriptor],
                     key: bytes) -> dict[str, Any]:
    """Read what the parent committed, then commit version 2 with one more write."""
    with open_backend(kind, root, "job", "op", 0, range(8), states=states) as backend:
        seen = {"version": backend.version(), "outputs": backend.outputs(1),
                "value": backend.get("value", 3, key), "items": backend.get("items", 3, key),
                "attrs": backend.get("attrs", 3, key),
                "timers": [t.time_ms for t in backend.due_timers("event", 10**12)]}
        backend.put("value", 3, key, b"", "from-child")
        backend.add_timer("processing", 4, 77, key)
        backend.commit(2, b"child-out")
    return seen
