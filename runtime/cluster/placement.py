"""Where keyed subtasks run on a cluster, and what it costs when they move.

Spark does not pin a task to an executor, so on a cluster a keyed subtask may run on another
executor every epoch. Each executor keeps its own working state and local recovery copies
(`executor-<id>` directories under the state and local-copy roots), so two executors on one
host never open the same RocksDB directory. A subtask that lands where its state is missing
or older than the epoch before restores it: from that executor's local recovery copy when the
copy is of the latest checkpoint, else from checkpoint storage. On a cluster the coordinator
checkpoints every epoch (incremental), so storage always holds the version a moved subtask
needs and a move never rewinds the job (see docs/operations/clusters.md).

Task side (it runs in the keyed operator's task): `operators.executor` (`executor_identity`,
`scoped`). Driver side, here: `on_cluster`, and `Placement` counts moves per epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def on_cluster(master: str | None) -> bool:
    """Whether tasks run in executors apart from the driver: any master but `local` and
    `local[...]` (`local-cluster[...]` has executors of its own, as a real cluster does)."""
    master = master or "local"
    return not (master == "local" or master.startswith("local["))


@dataclass
class Placement:
    """The executor of each keyed subtask in the last epoch, per operator; counts moves."""

    last: dict[str, dict[int, str]] = field(default_factory=dict)
    #: Every executor any subtask ran on.
    seen: set[str] = field(default_factory=set)

    def update(self, node_id: str, metas: list[dict[str, Any]]) -> int:
        """Record where `node_id`'s subtasks ran this epoch; how many ran elsewhere than in
        the epoch before."""
        now = {int(m["subtask"]): str(m["executor"]) for m in metas if m.get("executor")}
        before = self.last.get(node_id, {})
        moves = sum(1 for s, e in now.items() if s in before and before[s] != e)
        self.seen.update(now.values())
        self.last[node_id] = {**before, **now}
        return moves

    def executors(self) -> set[str]:
        """Every executor a keyed subtask ran on."""
        return set(self.seen)
