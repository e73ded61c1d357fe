"""Per-epoch manifests of a `files` sink on an object store: the commit point readers trust.

An object store has no atomic rename of several files: a committed epoch's files get their
final names one after another (server-side copies), so a reader listing the directory during
a commit may see some of an epoch's files and not yet the others (each of them whole). The
sink therefore publishes, after the epoch's files are all in place, one manifest per epoch:

    <path>/_manifests/epoch-<epoch:08d>.json   {"epoch": 7, "files": [{"name": ..., "size": ...}]}

written with one PUT (an object appears whole or not at all). An epoch is committed once its
manifest exists; a reader that must see whole epochs reads the manifests in name order and
the files each one names. `_manifests` starts with `_`, so Spark, pyarrow and pandas skip it
when they read the directory.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import re
from typing import Any

#: The manifests' directory under a sink's path.
MANIFESTS = "_manifests"
_MANIFEST = re.compile(r"epoch-(\d{8})\.json")
_PART = re.compile(r"part-(\d{8})-\d{5}\.")


def manifest_name(epoch: int) -> str:
    """`_manifests/epoch-<epoch:08d>.json`."""
    return f"{MANIFESTS}/epoch-{epoch:08d}.json"


def publish(fs: Any, root: str, epoch: int, names: list[str]) -> None:
    """Publish epoch `epoch`'s manifest naming `names` (files directly under `root`, each
    already there) with their sizes; an epoch without files gets none."""
    if not names:
        return
    files = []
    for name in names:
        fs.invalidate_cache(f"{root}/{name}")
        files.append({"name": name, "size": int(fs.info(f"{root}/{name}")["size"])})
    body = json.dumps({"epoch": epoch, "files": files}, sort_keys=True).encode()
    fs.pipe_file(f"{root}/{manifest_name(epoch)}", body)


def _listing(fs: Any, directory: str) -> list[str]:
    fs.invalidate_cache(directory)
    try:
        return sorted(posixpath.basename(str(p).rstrip("/"))
                      for p in fs.ls(directory, detail=False))
    except FileNotFoundError:
        return []


def read(fs: Any, root: str) -> dict[int, list[dict[str, Any]]]:
    """Epoch -> the files its manifest names (name and size), for every published manifest."""
    out = {}
    for name in _listing(fs, f"{root}/{MANIFESTS}"):
        match = _MANIFEST.fullmatch(name)
        if match:
            body = json.loads(fs.cat_file(f"{root}/{MANIFESTS}/{name}"))
            out[int(match.group(1))] = list(body["files"])
    return out


def committed(fs: Any, root: str) -> list[str]:
    """The names of the committed files: those the published manifests name, in name order."""
    return sorted(f["name"] for files in read(fs, root).values() for f in files)


def drop_after(fs: Any, root: str, epoch: int, extension: str) -> list[str]:
    """Delete the manifests and the `part-<e>-*.<extension>` files of epochs `e` > `epoch`
    (a run rewound to `epoch` writes them again); returns the deleted names."""
    doomed = []
    for name in _listing(fs, root):
        match = _PART.match(name)
        if match and int(match.group(1)) > epoch and name.endswith(f".{extension}"):
            doomed.append(name)
    for name in _listing(fs, f"{root}/{MANIFESTS}"):
        match = _MANIFEST.fullmatch(name)
        if match and int(match.group(1)) > epoch:
            doomed.append(f"{MANIFESTS}/{name}")
    for name in doomed:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(f"{root}/{name}")
    return doomed
