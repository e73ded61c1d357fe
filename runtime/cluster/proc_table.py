"""The machine's processes as Linux's /proc lists them: what the cluster launcher and the
spark-submit wrapper read to find a session's or a process tree's members."""

from __future__ import annotations

import os


def process_table() -> dict[int, list[bytes]]:
    """Each process's fields of /proc/<pid>/stat after its command name: state, ppid, pgrp,
    session, ... (proc(5)); processes that end while it is read are left out."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        table[int(entry)] = stat[stat.rfind(b")") + 2:].split()
    return table
