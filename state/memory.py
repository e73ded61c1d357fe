"""The names by which memory-state files written before the memory backend was split by
concept (`memory_values`, `memory_files`, `memory_backend`) pickled what they store.

A pickle names a class by module and name, so a subtask directory or a checkpoint written
then names `streamer.state.memory._Expiring` and so on. They load through these aliases; what
is written now names `streamer.state.memory_values`. Nothing in streamer imports this module.
"""

from __future__ import annotations

from streamer.state import memory_values

_Expiring = memory_values.Expiring
_MapChange = memory_values.MapChange
_Changes = memory_values.Changes
_TOMBSTONE = memory_values.TOMBSTONE
