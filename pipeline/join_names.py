"""The names of a join's output: which input columns would clash in it.

One rule for both checks of a pipeline: `pipeline.typecheck` (without Spark, from the declared
schemas) and `operators.join.join_columns` (from the schemas Spark's analyzer derives).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamer.pipeline.spec import JoinSpec

#: The columns a window join adds to its output: the window each pair met in.
WINDOW_COLUMNS = ("window_start", "window_end")


def name_clashes(join: JoinSpec, left: list[str], right: list[str]) -> list[tuple[str, str]]:
    """(where, message) of each clash among join `join`'s output names, over the input columns
    `left` and `right` (hidden ones left out): a right column whose name (with
    `right_prefix`) a left column has, an input column named as a window join's own
    window columns. `where` is the key the problem is about: "right_prefix" or "right",
    "window"."""
    problems = []
    taken = set(left)
    right_others = [n for n in right if n not in join.right_key]
    clashes = [n for n in right_others if join.right_prefix + n in taken]
    if clashes:
        where = "right_prefix" if join.right_prefix else "right"
        names = ", ".join(repr(join.right_prefix + n) for n in clashes)
        problems.append((where, f"column(s) {names} would be on both sides of the output; "
                         "set right_prefix: (e.g. "
                         f"{join.right + '_'!r}) or rename them with a select before the "
                         "join"))
    out = {*left, *(join.right_prefix + n for n in right_others)}
    own = [n for n in WINDOW_COLUMNS if join.mode == "window" and n in out]
    if own:
        names = ", ".join(repr(n) for n in own)
        problems.append(("window", f"column(s) {names} of an input would clash with the "
                         "window join's own window_start and window_end (the window each "
                         "pair met in); drop or rename them with a select before the "
                         "join, or set right_prefix: when they are the right input's"))
    return problems
