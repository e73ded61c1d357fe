"""Test scaffolding that ships with streamer, for streamer's own tests and for yours.

Nothing in the engine imports this package (tests/test_layering.py checks that). What it holds:

- `streamer.testing.storage_faults`: `faulty://<absolute local path>`, the local file system
  with chosen operations failing, by rules in the JSON file named by `$STREAMER_TEST_FAULTS`.
  It reaches every process (Spark's Python workers too) through fsspec's own plug-in
  registration: the `fsspec.specs` entry point `faulty` in pyproject.toml, so a `faulty://`
  URL works wherever streamer is installed, and `streamer.storage` knows no scheme of its own.
- `streamer.testing.harness`: `OperatorHarness`, one keyed operator of a pipeline run by the
  engine's own subtask code without Spark (push rows, move the watermark, read the output,
  snapshot and restore on either backend at any parallelism).

Its environment variables start with `STREAMER_TEST_` (see `streamer.environment`).
"""
