"""The task side of keyed subtask placement (`runtime/cluster/placement.py` has the design and the
driver side): which Spark executor runs this task, and the state directories it keeps there.

Each executor keeps its own working state and local recovery copies (`executor-<id>`
directories under the state and local-copy roots), so two executors on one host never open
the same RocksDB directory.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from dataclasses import replace
from typing import Any


def executor_identity() -> str:
    """The identity of the Spark executor whose Python worker runs this: the host name plus a
    digest of the executor's own scratch directories (`SPARK_EXECUTOR_DIRS` on standalone,
    `SPARK_LOCAL_DIRS` everywhere), which differ between executors of one host."""
    dirs = os.environ.get("SPARK_EXECUTOR_DIRS") or os.environ.get("SPARK_LOCAL_DIRS") or ""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"
    digest = hashlib.sha1(f"{host}\0{dirs}\0{os.getppid() if not dirs else ''}".encode())
    return f"{host}-{digest.hexdigest()[:10]}"


def scoped(cfg: Any, executor: str) -> Any:
    """`cfg` (a `KeyedConfig`) with its state root and local-copy root inside `executor`'s
    own directories."""
    part = f"executor-{executor}"
    chk = cfg.checkpointing
    if chk is not None and chk.local_copy_root:
        chk = replace(chk, local_copy_root=os.path.join(chk.local_copy_root, part))
    return replace(cfg, state_root=os.path.join(cfg.state_root, part), checkpointing=chk)
