"""Checkpoints: the metadata that makes them exactly-once (`metadata`) and the keyed subtask's
side of them (`task`). The storage they are written to is `streamer.storage` (fault injection
for tests: `streamer.testing.storage_faults`).
"""
