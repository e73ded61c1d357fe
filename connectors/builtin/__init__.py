"""The connectors with no system behind them: `datagen` (rows computed from offsets), the
`console` sink, and the in-memory sink `streamer test` reads."""
