"""`streamer init NAME`: a new pipeline project that validates, tests and runs as it is
(docs/init.md), as `dbt init` and `spark-pipelines init` start theirs.

The files are templates with the job name filled in; nothing that exists is overwritten.
"""

from __future__ import annotations

import re
from pathlib import Path

from streamer.pipeline.exceptions import ScaffoldError

#: A job name, as `name:` in the pipeline file accepts it.
NAME = re.compile(r"[a-z0-9][a-z0-9-]*")

PIPELINE = """\
# {name}: purchases per user and minute, from generated events
# (made by `streamer init`; make it yours).
#   Check:  streamer validate pipeline.yaml
#   Test:   streamer test pipeline.yaml       (runs the tests: block below)
#   Run:    streamer run pipeline.yaml        (writes ./out/{name}/)
name: {name}
description: Purchases per user and minute, from generated events.
job:
  epoch: 1s
  state: {{backend: rocksdb}}
  # metrics: {{prometheus: {{port: 9249}}}}   # Prometheus metrics while it runs (docs/metrics.md)
sources:
  - id: events
    type: datagen                  # replace with files or kafka (see the README)
    splits: 2
    limit: 5000                    # rows per split: a bounded demo; remove it for an endless stream
    max_records_per_epoch: 2000
    fields:
      user: "concat('u', cast(offset % 20 as string))"
      action: "element_at(array('view', 'view', 'cart', 'purchase'), cast(offset % 4 + 1 as int))"
      amount: "cast(offset % 50 as double)"
      ts: "timestamp_millis(1767225600000 + offset * 100 + split * 50)"
    event_time: ts
    watermark: {{max_out_of_orderness: 5s}}
operators:
  - id: purchases
    input: events
    filter: "action = 'purchase'"
  - id: per_minute
    input: purchases
    key_by: [user]
    window: {{tumbling: 1m}}
    aggregate:
      purchases: count()
      spent: sum(amount)
sinks:
  - id: out
    type: files
    input: per_minute
    path: ./out/{name}
    format: jsonl
tests:
  - name: only purchases count, per user and minute
    inputs:
      events:
        - {{user: a, action: purchase, amount: 10.0, ts: "2026-01-01T00:00:01Z"}}
        - {{user: a, action: view, amount: 99.0, ts: "2026-01-01T00:00:02Z"}}
        - {{user: a, action: purchase, amount: 5.0, ts: "2026-01-01T00:00:59Z"}}
        - {{user: b, action: purchase, amount: 7.5, ts: "2026-01-01T00:01:30Z"}}
    expect:
      out:
        - {{user: a, window_start: "2026-01-01T00:00:00Z", window_end: "2026-01-01T00:01:00Z",
           purchases: 2, spent: 15.0}}
        - {{user: b, window_start: "2026-01-01T00:01:00Z", window_end: "2026-01-01T00:02:00Z",
           purchases: 1, spent: 7.5}}
"""

README = """\
# {name}

A streamer pipeline: `pipeline.yaml` counts purchases per user and
minute from generated events (a filter, then a keyed tumbling window), and its `tests:` block
checks that with three inline rows.

```bash
pip install -r requirements.txt        # streamer (needs Python 3.11+ and Java 17+)
streamer validate pipeline.yaml        # keys, types, references and every expression
streamer test pipeline.yaml            # the tests: block, on Spark in this process
streamer run pipeline.yaml             # the job itself: ./out/{name}/, checkpoints in ./.streamer/
```

CI (`.github/workflows/streamer.yml`) runs `validate` and `test` on every push and pull
request. Next: replace the `datagen` source with your `files` or `kafka` source, and the
`tests:` rows with records of yours.
"""

REQUIREMENTS = """\
# Where CI and your machine install streamer from: a version from your package index, a
# wheel, or a git URL (pip's `streamer @ git+https://...` form).
streamer=={version}
"""

WORKFLOW = """\
# Checks the pipeline on every push and pull request: `streamer validate` (keys, references,
# expressions against Spark's analyzer) and `streamer test` (the tests: block, on real Spark).
name: streamer
on: [push, pull_request]
jobs:
  pipeline:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with: {{python-version: "3.11"}}
      - uses: actions/setup-java@v4     # Spark 4 runs on Java 17+
        with: {{distribution: temurin, java-version: "17"}}
      - run: pip install -r requirements.txt
      - run: streamer validate pipeline.yaml
      - run: streamer test pipeline.yaml
"""

GITIGNORE = """\
.streamer/
out/
"""


def scaffold(name: str, directory: Path, version: str) -> list[Path]:
    """Create `directory/name/` with a pipeline, its tests, a README, a CI workflow and what
    they need; the files created. Refuses, creating nothing, if any of them exists."""
    if not NAME.fullmatch(name):
        msg = (f"{name!r} cannot name a job: use lowercase letters, digits and dashes, "
               "starting with a letter or digit, e.g. 'clicks-per-user'")
        raise ScaffoldError(msg)
    root = directory / name
    files = {
        root / "pipeline.yaml": PIPELINE.format(name=name),
        root / "README.md": README.format(name=name),
        root / "requirements.txt": REQUIREMENTS.format(version=version),
        root / ".github" / "workflows" / "streamer.yml": WORKFLOW.format(),
        root / ".gitignore": GITIGNORE,
    }
    existing = [str(path) for path in files if path.exists()]
    if existing:
        msg = (f"not overwriting {', '.join(existing)}; choose another name or --dir, or "
               "move the existing files away")
        raise ScaffoldError(msg)
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(files)
