"""What the memory state backend stores and pickles: values with an expiry, the buffered
changes of a map, tombstones, and an epoch's change set (the payload of a delta file).

These classes are pickled into the backend's files by reference (module and name), so a file
names this module. Files written before the backend's modules were split name
`streamer.state.memory` instead, which keeps the old names for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamer.state.base import StateKey, StateKind


class Tombstone:
    """Marks a deleted entry in a change set (pickled by reference, so it stays a singleton)."""

    __slots__ = ()

    def __reduce__(self) -> str:
        return "TOMBSTONE"

    def __repr__(self) -> str:
        return "<deleted>"


TOMBSTONE = Tombstone()
#: What `live_value` returns for an expired entry.
EXPIRED = object()


class Expiring:
    """A stored value with an expiry time; values without TTL are stored bare."""

    __slots__ = ("expires_at_ms", "value")

    def __init__(self, value: Any, expires_at_ms: int) -> None:
        self.value = value
        self.expires_at_ms = expires_at_ms

    def __reduce__(self) -> tuple[Any, ...]:
        return (Expiring, (self.value, self.expires_at_ms))


class MapChange:
    """The buffered changes of one map: cleared first or not, then per user key a stored value
    or a tombstone.
    """

    __slots__ = ("cleared", "entries")

    def __init__(self, cleared: bool = False, entries: dict[bytes, Any] | None = None) -> None:
        self.cleared = cleared
        self.entries: dict[bytes, Any] = {} if entries is None else entries

    def __reduce__(self) -> tuple[Any, ...]:
        return (MapChange, (self.cleared, self.entries))


def wrap(value: Any, expires_at_ms: int | None) -> Any:
    """The stored form of `value`: bare without an expiry, else an `Expiring`."""
    return value if expires_at_ms is None else Expiring(value, expires_at_ms)


def live_value(stored: Any, now_ms: int | None) -> Any:
    """The value of a stored entry, or `EXPIRED`."""
    if type(stored) is Expiring:
        if now_ms is not None and stored.expires_at_ms <= now_ms:
            return EXPIRED
        return stored.value
    return stored


def expiry_of(stored: Any) -> int | None:
    """The expiry time of a stored value, or None when it has none."""
    return stored.expires_at_ms if type(stored) is Expiring else None


def unwrap(stored: Any) -> Any:
    """The value of a stored entry, expired or not."""
    return stored.value if type(stored) is Expiring else stored


# state -> key group -> (key, namespace) -> stored value (a dict of stored values for maps)
Values = dict[str, dict[int, dict[tuple[bytes, bytes], Any]]]
# domain -> key group -> time -> {(key, namespace)}
Timers = dict[str, dict[int, dict[int, set[tuple[bytes, bytes]]]]]
TimerChangeKey = tuple[str, int, int, bytes, bytes]


@dataclass
class Changes:
    """The buffered writes of one epoch; also the payload of a delta file."""

    states: dict[str, StateKind] = field(default_factory=dict)
    values: dict[str, dict[StateKey, Any]] = field(default_factory=dict)
    timers: dict[TimerChangeKey, bool] = field(default_factory=dict)

    def is_empty(self) -> bool:
        """Whether the epoch wrote nothing."""
        return not (self.states or self.values or self.timers)
