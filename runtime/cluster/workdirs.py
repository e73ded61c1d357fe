"""Where keyed subtasks keep their working state and their local recovery copies on this
machine, and the clean-up of what killed runs left behind."""

from __future__ import annotations

import os
import tempfile


def local_state_base(local_dir: str | None) -> str:
    """The local state directory: `job.state.local_dir`, `$STREAMER_STATE_DIR`, or
    `<tmp>/streamer-state`."""
    base = local_dir or os.environ.get("STREAMER_STATE_DIR") or os.path.join(
        tempfile.gettempdir(), "streamer-state")
    return os.path.abspath(base)


def default_state_root(local_dir: str | None, job: str, run_id: str) -> str:
    """Where subtasks keep working state: `<local_dir>/<job>/<run id>`."""
    return os.path.join(local_state_base(local_dir), job, run_id)


def local_recovery_root(local_dir: str | None) -> str:
    """Where subtasks keep local copies of their checkpoint snapshots (local recovery)."""
    return os.path.join(local_state_base(local_dir), ".local-recovery")


def cleanup_stale_runs(local_dir: str | None, job: str, current_run: str) -> list[str]:
    """Remove the working state of earlier runs of `job` whose process is gone (a killed
    run leaves it behind; resuming restores from checkpoints, never from it)."""
    import re
    import shutil

    root = os.path.join(local_state_base(local_dir), job)
    removed: list[str] = []
    if not os.path.isdir(root):
        return removed
    for name in os.listdir(root):
        match = re.fullmatch(r"[0-9a-f]+-(\d+)", name)
        if not match or name == current_run:
            continue
        pid = int(match.group(1))
        try:
            os.kill(pid, 0)
            continue  # that run is alive (or the pid was reused: leave it)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        removed.append(name)
    return removed
