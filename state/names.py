"""Names of the states the built-in keyed operators keep (operators/keyed_kinds.py), for the code
below operators that reads them back: savepoint export shows the per-epoch entries of
`WINDOW_KEYS` as per-key partials, and the chunks of `JOIN_CHUNKS` as buffered records.
"""

from __future__ import annotations

#: Time windows: per key group, window and epoch, the keys that got the window that epoch.
WINDOW_KEYS = "window_keys"

#: Interval joins: per key group, side and epoch, a chunk of buffered records (Arrow IPC).
JOIN_CHUNKS = "join.chunks"
#: The chunk schema's metadata entry naming its key columns (a JSON list).
JOIN_CHUNK_KEYS = b"streamer.keys"
#: The chunk column that says whether a buffered record has matched.
JOIN_MATCHED = "__matched"
