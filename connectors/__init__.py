"""Sources and sinks. The contracts are in `base.py`, the `type:` registry in `registry.py`, and
what several connectors share beside them (`formats`, `table_sink`, `staged_sink`,
`dead_letters`, `maven`); each connector is a package (`files`, `kafka`, `postgres`, `delta`,
`builtin`), and `arrow` holds the Arrow fast path's codecs."""
