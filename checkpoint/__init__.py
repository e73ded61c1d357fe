"""Checkpoints: the storage they are written to (`storage`), fault injection for tests
(`faults`), and the coordinator and metadata that make them exactly-once.
"""
