"""The hidden columns that stages pass to each other, named once.

Every column streamer adds for itself starts with `HIDDEN_PREFIX`; such columns never reach a
sink. The values are part of what is stored (a keyed task's output batches are kept with its
state and in checkpoints, and tests pin them), so a name here may change, its value may not.
"""

from __future__ import annotations

#: The prefix of every column streamer adds for itself (user columns are not expected to start
#: with it).
HIDDEN_PREFIX = "__"

# --------------------------------------------------------------------------- event time
#: A record's event time (timestamp), from its source's `event_time`; a window result's is
#: window_end - 1 ms.
EVENT_TIME = "__ts"
#: The event time in milliseconds since the epoch (long): what keyed stages compute with.
EVENT_TIME_MS = "__ts_ms"
#: A record's order of arrival within the job (long); breaks ties of equal event times.
SEQUENCE = "__seq"
#: A record's `SEQUENCE` is `epoch * EPOCH_SEQ` + its place in the epoch's input.
EPOCH_SEQ = 1 << 40

# --------------------------------------------------------------------------- routing
#: The key group of a record's key (int): `pmod(xxhash64(keys), max_parallelism)`.
KEY_GROUP = "__kg"
#: The keyed subtask that owns the record's key group (int).
SUBTASK = "__subtask"
#: The Spark partition a row is routed to (= its subtask), for `repartition`.
ROUTE = "__route"
#: True on the one empty row per subtask that makes every subtask's task run, input or not.
DUMMY = "__dummy"

# --------------------------------------------------------------------------- joins
#: Which input of a join a record comes from (int): 0 left, 1 right (`operators.join`).
JOIN_SIDE = "__join_side"
#: A changelog record that deletes its key (a Kafka tombstone of a source with `key:`): its
#: Kafka record timestamp, which is also its event time; null on every other record.
TOMBSTONE = "__tombstone"

# --------------------------------------------------------------------------- broadcast
#: A process function's broadcast record, as a struct of its input's visible columns (null on
#: keyed records and dummy rows); one copy per subtask (`runtime.plan.keyed_plan`).
BROADCAST = "__broadcast"

# --------------------------------------------------------------------------- metrics
#: What a sink's row counts as in the epoch's metrics (`out`, `dead_letters`, `late`), while
#: a sink's inputs of several kinds are unioned and counted (dropped before it writes).
COUNT_AS = "__count_as"

# --------------------------------------------------------------------------- partials
#: The prefix of a pre-aggregated partial's column: `partial(i)` is the i-th (`__p<i>`).
PARTIAL_PREFIX = "__p"
#: The start of a row's window in milliseconds (long); 0 for rolling aggregates.
WINDOW_START = "__start"
#: The end of a row's session window in milliseconds (long).
WINDOW_END = "__end"
#: Spark's session window struct while partials are grouped (then `WINDOW_START`/`WINDOW_END`).
SESSION = "__session"
#: Dedupe: the struct of a key's first record of the epoch while partials are grouped.
FIRST_RECORD = "__r"
#: A top-N's rank of a record among its key's records of the epoch (Spark side).
RANK = "__rank"

#: The key of an operator with `key_by: []`: one constant for every record.
GLOBAL_KEY = "__global"

#: The change a row of an update stream is (Flink's RowKind): `INSERT` (a key's first
#: value), `RETRACT` (the value a key had, withdrawn: update-before) or `UPDATE` (its new
#: value: update-after). A rolling aggregate read by a keyed operator emits them; sinks
#: never see a `RETRACT` row (`runtime.plan.keyed_plan.visible`).
CHANGE = "__op"
INSERT, RETRACT, UPDATE = "+I", "-U", "+U"

# --------------------------------------------------------------------------- task output
#: What a row of a keyed task's output batch is: `OUT`, `META` or `SIDE`.
ROW_KIND = "__kind"
#: JSON text: a `META` row's task report, or a `SIDE` row's record.
ROW_META = "__meta"
#: The side output a `SIDE` row belongs to (process functions).
SIDE_OUTPUT = "__side"
#: The columns that say what a task's output row is, not part of the output itself.
BOOKKEEPING = (ROW_KIND, ROW_META, SIDE_OUTPUT)

#: `ROW_KIND` of an output row.
OUT = "out"
#: `ROW_KIND` of the one row per task that reports on it (`ROW_META`: counts, timers, handles).
META = "meta"
#: `ROW_KIND` of a row for a side output (`SIDE_OUTPUT` names it, `ROW_META` holds it).
SIDE = "side"


def partial(i: int) -> str:
    """The column of the i-th partial (`__p<i>`)."""
    return f"{PARTIAL_PREFIX}{i}"
