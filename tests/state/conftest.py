"""Fixtures of the state tests: a factory of real backends on `tmp_path`, one per backend kind."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from streamer.state import BackendOptions, KeyedStateBackend, StateDescriptor, open_backend
from streamer.state.memory_files import drop_process_cache
from streamer.state.rocksdb_parking import release_parked

#: The states most contract tests declare.
STATES = (
    StateDescriptor("value", "value"),
    StateDescriptor("acc", "aggregating"),
    StateDescriptor("sum", "reducing"),
    StateDescriptor("items", "list"),
    StateDescriptor("attrs", "map"),
)


@dataclass
class Opener:
    """Opens backends of one kind under one root directory, and closes them all at teardown."""

    kind: str
    root: Path
    opened: list[KeyedStateBackend] = field(default_factory=list)

    def __call__(self, subtask: int = 0, key_groups: range = range(8), *,
                 states: Iterable[StateDescriptor] = STATES, root: Path | None = None,
                 kind: str | None = None, **options: Any) -> KeyedStateBackend:
        backend = open_backend(kind or self.kind, str(root or self.root), "job", "op", subtask,
                               key_groups, states=states,
                               options=BackendOptions(**{"lock_timeout_s": 0.05, **options}))
        self.opened.append(backend)
        return backend

    def reopen(self, backend: KeyedStateBackend, **options: Any) -> KeyedStateBackend:
        """Close `backend` and open its subtask again."""
        backend.close()
        return self(backend.location.subtask, backend.key_groups,
                    root=Path(backend.location.root_dir), kind=backend.name, **options)

    def close_all(self) -> None:
        for backend in self.opened:
            backend.close()
        self.opened.clear()


@pytest.fixture
def open_state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """A factory of backends of the kind given by indirect parametrization ('memory' or
    'rocksdb'), on a real directory under `tmp_path`.
    """
    opener = Opener(request.param, tmp_path / "state")
    yield opener
    opener.close_all()
    drop_process_cache()
    release_parked()
