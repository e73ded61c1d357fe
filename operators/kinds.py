"""The registry of keyed operator kinds (`operators.contract`): one line per kind."""

from __future__ import annotations

from streamer.operators.contract import KeyedKind
from streamer.operators.dedupe import DedupeKind
from streamer.operators.join import JoinKind
from streamer.operators.over import OverKind
from streamer.operators.process import ProcessKind
from streamer.operators.rolling import RollingKind
from streamer.operators.topn import TopNKind
from streamer.operators.windows import WindowKind

#: Kind name (`OperatorSpec.keyed_kind`) -> the kind.
KINDS: dict[str, KeyedKind] = {kind.name: kind for kind in (
    WindowKind(),
    RollingKind(),
    DedupeKind(),
    JoinKind(),
    ProcessKind(),
    TopNKind(),
    OverKind(),
)}


def kind_of(name: str) -> KeyedKind:
    """The registered kind `name`."""
    try:
        return KINDS[name]
    except KeyError:
        msg = f"no keyed operator kind {name!r} is registered (operators.kinds)"
        raise LookupError(msg) from None
