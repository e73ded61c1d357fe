"""Names of the states the built-in keyed operators keep (operators/kinds.py), for the code
below operators that reads them back: savepoint export shows the per-epoch entries of
`WINDOW_KEYS` as per-key partials, the chunks of `JOIN_CHUNKS` as buffered records, those of
`DEDUPE_SEEN` as remembered keys and those of `SESSION_CHUNKS` as open sessions.
"""

from __future__ import annotations

#: Time windows: per key group, window and epoch, the keys that got the window that epoch.
WINDOW_KEYS = "window_keys"

#: Interval joins: per key group, side and epoch, a chunk of buffered records (Arrow IPC).
JOIN_CHUNKS = "join.chunks"
#: Dedupe: per key group and epoch, a chunk of remembered keys and their expiry (Arrow IPC).
DEDUPE_SEEN = "dedupe.seen"
#: Session windows: per key group, a chunk of its open sessions (Arrow IPC).
SESSION_CHUNKS = "session.open"
#: The dedupe chunk column holding when a key is forgotten (ms).
DEDUPE_EXPIRES = "__expires_ms"
#: A chunk schema's metadata entry naming its key columns (a JSON list).
CHUNK_KEYS = b"streamer.keys"
#: The chunk column that says whether a buffered record has matched.
JOIN_MATCHED = "__matched"
