"""Pipeline files: loading with line tracking, validation against the spec model, the frozen spec,
and the logical dataflow graph compiled from it.
"""
