"""`type: postgres`: the sink, and what it needs of the database (its settings, the connection,
column types, the target and marker tables, COPY)."""
