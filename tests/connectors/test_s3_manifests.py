"""The `files` sink's per-epoch manifests on a real S3 API server (MinIO, the `s3` fixture):
what a committed epoch is, and what a run rewound to an earlier epoch deletes."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from streamer.connectors.files import manifests

pytestmark = pytest.mark.s3


def test_manifests_name_the_committed_files_and_a_rewind_drops_later_epochs(s3: Any) -> None:
    fs = s3.filesystem()
    root = f"streamer/out-{uuid.uuid4().hex[:8]}"
    for epoch, count in ((1, 2), (2, 1), (3, 2)):
        names = [f"part-{epoch:08d}-{n:05d}.jsonl" for n in range(count)]
        for name in names:
            fs.pipe_file(f"{root}/{name}", b'{"x": 1}\n' * (epoch + 1))
        manifests.publish(fs, root, epoch, names)
    manifests.publish(fs, root, 4, [])  # an epoch without output publishes nothing
    # Epoch 5's files are in place but its manifest is not: it is not committed.
    fs.pipe_file(f"{root}/part-00000005-00000.jsonl", b"{}\n")
    assert manifests.committed(fs, root) == [
        "part-00000001-00000.jsonl", "part-00000001-00001.jsonl", "part-00000002-00000.jsonl",
        "part-00000003-00000.jsonl", "part-00000003-00001.jsonl"]
    body = json.loads(fs.cat_file(f"{root}/_manifests/epoch-00000003.json"))
    assert body == {"epoch": 3, "files": [{"name": "part-00000003-00000.jsonl", "size": 36},
                                          {"name": "part-00000003-00001.jsonl", "size": 36}]}

    dropped = manifests.drop_after(fs, root, 2, "jsonl")
    assert sorted(dropped) == ["_manifests/epoch-00000003.json", "part-00000003-00000.jsonl",
                               "part-00000003-00001.jsonl", "part-00000005-00000.jsonl"]
    assert manifests.committed(fs, root) == [
        "part-00000001-00000.jsonl", "part-00000001-00001.jsonl", "part-00000002-00000.jsonl"]
    left = sorted(p.removeprefix(root + "/") for p in fs.find(root))
    assert left == ["_manifests/epoch-00000001.json", "_manifests/epoch-00000002.json",
                    "part-00000001-00000.jsonl", "part-00000001-00001.jsonl",
                    "part-00000002-00000.jsonl"]
