"""Stateless operators (filter, select, with_columns) evaluated on Arrow tables, where that
is certainly what Spark computes.

Spark SQL is the language of expressions: `compile_ops` asks Spark's analyzer for each
operator's plan (so Spark resolves names and inserts its implicit casts, under the session's
ANSI mode) and translates the analyzed plan into a `Program` of Arrow compute calls, or says
why it cannot. It takes Project and Filter nodes over a handful of expressions whose Arrow
kernels give Spark's results: column references, literals, widening numeric casts, `+ - *`
and unary minus (integers with overflow checks; decimals where Arrow's result type is Spark's,
so that both are exact), `%` of integers (the sign of the dividend, as Java's), `/` on
doubles, comparisons, `AND`/`OR` (both three-valued), `NOT`, `IS [NOT] NULL`, `<=>`,
`timestamp_millis`/`timestamp_micros` of integers (checked against overflow as Spark does),
casts of integers and decimals to decimals (checked: a value that does not fit is refused),
`get(split(s, 'sep'), i)` where `sep` is plain text (no regular-expression character, so
Java's regex split and Arrow's literal split agree; `get` gives null out of range),
`CASE WHEN`, `hour` of a timestamp in a UTC session, `length` of a string and `replace` of
literal text.

At run time `Program.run` raises `Refused` wherever Arrow's answer could differ from Spark's,
and the caller has Spark compute those rows instead (where Spark then also fails, it fails
with its own error): an integer overflow (an error under ANSI, wrapped without it), a
division by zero, a comparison meeting a NaN (Spark orders NaN above every number and
equal to itself; IEEE comparisons do not), or a decimal that does not fit its type.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from streamer.exceptions import ArrowRefused as Refused
from streamer.frames import empty_frame

#: Spark simple types whose values Arrow holds as Spark does (`arrow_type`), with decimals
#: (`DECIMAL`).
TYPES = ("int", "bigint", "double", "string", "boolean", "timestamp")
DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")
#: Session time zones in which an hour of the day is UTC's.
_UTC = ("UTC", "Etc/UTC", "GMT", "Etc/GMT", "Z", "+00:00")
#: Characters that make a `split` separator a regular expression rather than plain text.
_REGEX = set("\\^$.|?*+()[]{}")
#: Casts whose Arrow result is Spark's (a long rounds to the nearest double in both).
_CASTS = {("int", "bigint"), ("int", "double"), ("bigint", "double")}
_ARITHMETIC = {"Add": "add", "Subtract": "subtract", "Multiply": "multiply"}
_COMPARE = {"EqualTo": "equal", "LessThan": "less", "LessThanOrEqual": "less_equal",
            "GreaterThan": "greater", "GreaterThanOrEqual": "greater_equal"}


class Untranslatable(Exception):
    """The analyzed plan has something `compile_ops` does not translate (its message says
    what)."""


@dataclass(frozen=True)
class Step:
    """One operator: `filter` (keep rows where `exprs[0]` is true) or `project` (the
    columns `names` computed by `exprs`). `inputs`: the input column name behind each
    attribute id the expressions use."""

    op_id: str
    kind: str
    names: tuple[str, ...]
    exprs: tuple[Any, ...]
    inputs: tuple[tuple[int, str], ...]


@dataclass(frozen=True)
class Program:
    """Stateless operators, in order, as Arrow computations (picklable)."""

    steps: tuple[Step, ...]

    def run(self, table: Any) -> tuple[Any, dict[str, tuple[int, int]]]:
        """(`table` after every step, filter op id -> (rows in, rows out)); `Refused` when
        a result could differ from Spark's."""
        import pyarrow as pa

        counts: dict[str, tuple[int, int]] = {}
        for step in self.steps:
            env = {ident: table.column(name) for ident, name in step.inputs}
            if step.kind == "filter":
                mask = _eval(step.exprs[0], env, table.num_rows)
                before = table.num_rows
                table = table.filter(mask, null_selection_behavior="drop")
                counts[step.op_id] = (before, table.num_rows)
            else:
                columns = [_array(_eval(e, env, table.num_rows), table.num_rows)
                           for e in step.exprs]
                table = pa.table(columns, names=list(step.names))
        return table, counts


def _array(value: Any, rows: int) -> Any:
    """A column of `rows` values from an array or a scalar."""
    import pyarrow as pa

    if isinstance(value, pa.Scalar):
        return pa.repeat(value, rows)
    return value


def _has_nan(value: Any) -> bool:
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_floating(value.type):
        return False
    if isinstance(value, pa.Scalar):
        return value.is_valid and value.as_py() != value.as_py()
    return bool(pc.any(pc.is_nan(value)).as_py())


def _eval(expr: Any, env: dict[int, Any], rows: int) -> Any:
    """One expression over the columns `env` (attribute id -> array): an array or a scalar."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = expr[0]
    if kind == "attr":
        return env[expr[1]]
    if kind == "lit":
        return pa.scalar(expr[1], type=arrow_type(expr[2]))
    args = [_eval(e, env, rows) for e in expr[2:] if isinstance(e, tuple)]
    target = expr[1]
    try:
        if kind == "cast":
            return pc.cast(args[0], arrow_type(target), safe=False)
        if kind == "cast_exact":  # (to a decimal: a value that does not fit is refused)
            value = args[0]
            if not pa.types.is_decimal(value.type):  # (Arrow takes an integer to a decimal
                value = pc.cast(value, pa.decimal128(38, 0))  # wide enough for every value)
            return pc.cast(value, arrow_type(target), safe=True)
        if kind in ("add", "subtract", "multiply"):
            if DECIMAL.fullmatch(target):  # (exact: `_expr` checked Arrow's type is Spark's)
                return pc.cast(pc.call_function(kind, args), arrow_type(target))
            integral = target in ("int", "bigint")
            return pc.call_function(f"{kind}_checked" if integral else kind, args)
        if kind == "remainder":
            _no_zero(args[1])
            rest = pc.subtract(args[0], pc.multiply(pc.divide(*args), args[1]))
            # (Arrow's MIN / -1 is 0, so its rest is MIN; Java's MIN % -1 is 0)
            zero = pa.scalar(0, arrow_type(target))
            return pc.if_else(pc.equal(args[1], -1), pc.multiply(args[0], zero), rest)
        if kind == "split_get":
            return _split_get(_array(args[0], rows), expr[3], args[1])
        if kind == "case":  # (a null condition is not true, as in Spark)
            result = args[-1] if expr[2] else pa.scalar(None, arrow_type(target))
            pairs = args[:-1] if expr[2] else args
            for cond, value in reversed(list(zip(pairs[::2], pairs[1::2], strict=True))):
                result = pc.if_else(pc.coalesce(cond, False), value, result)
            return result
        if kind == "hour":  # (of a UTC timestamp: `_expr` checked the zone)
            return pc.cast(pc.hour(args[0]), pa.int32())
        if kind == "length":  # (characters, as Spark counts them: code points)
            return pc.utf8_length(args[0])
        if kind == "replace":
            return pc.replace_substring(args[0], expr[3], expr[4])
        if kind == "to_timestamp":  # timestamp_millis / timestamp_micros of an integer
            micros = pc.multiply_checked(pc.cast(args[0], pa.int64()), pa.scalar(
                expr[3], pa.int64()))
            return pc.cast(micros, arrow_type("timestamp"))
        if kind == "negate":
            integral = target in ("int", "bigint")
            return pc.call_function("negate_checked" if integral else "negate", args)
        if kind == "divide":
            _no_zero(args[1])
            return pc.divide(*args)
        if kind in ("equal", "less", "less_equal", "greater", "greater_equal", "null_safe"):
            if any(_has_nan(a) for a in args):
                msg = "a comparison meets NaN"
                raise Refused(msg)
            if kind != "null_safe":
                return pc.call_function(kind, args)
            both = pc.and_kleene(pc.is_null(args[0]), pc.is_null(args[1]))
            return pc.if_else(pc.or_kleene(pc.is_null(args[0]), pc.is_null(args[1])), both,
                              pc.equal(*args))
        if kind == "and":
            return pc.and_kleene(*args)
        if kind == "or":
            return pc.or_kleene(*args)
        if kind == "not":
            return pc.invert(args[0])
        if kind == "is_null":
            return pc.is_null(args[0])
        if kind == "is_not_null":
            return pc.is_valid(args[0])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        msg = f"{kind}: {str(exc)[:200]}"
        raise Refused(msg) from exc
    msg = f"unknown expression {kind!r}"  # (compile_ops emits only the kinds above)
    raise AssertionError(msg)


def _no_zero(divisor: Any) -> None:
    """`Refused` where `divisor` (an array or a scalar) holds a zero."""
    import pyarrow as pa
    import pyarrow.compute as pc

    zero = pc.equal(divisor, pa.scalar(0).cast(divisor.type))
    if (isinstance(zero, pa.Scalar) and zero.as_py()) or (not isinstance(
            zero, pa.Scalar) and pc.any(zero).as_py()):
        msg = "a division by zero"
        raise Refused(msg)


def _split_get(strings: Any, separator: str, index: Any) -> Any:
    """Spark's `get(split(strings, separator), index)`: the index-th piece (from 0), null
    where there is none (out of range, a null string or index)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = pc.split_pattern(strings, separator)
    if isinstance(parts, pa.ChunkedArray):
        parts = parts.combine_chunks()
    index = pc.cast(index, pa.int64())
    inside = pc.and_kleene(pc.greater_equal(index, 0),
                           pc.less(index, pc.list_value_length(parts)))
    at = pc.add(pc.cast(parts.offsets[:-1], pa.int64()), index)
    return pc.take(parts.values, pc.if_else(inside, at, pa.scalar(None, pa.int64())))


def supported(kind: str) -> bool:
    """Whether Arrow holds values of Spark type `kind` as Spark does (`arrow_type`)."""
    found = DECIMAL.fullmatch(kind)
    return kind in TYPES or (found is not None and int(found.group(1)) <= 38)


def arrow_type(kind: str) -> Any:
    """The Arrow type values of Spark type `kind` (`supported`) are held as."""
    import pyarrow as pa

    found = DECIMAL.fullmatch(kind)
    if found is not None:
        return pa.decimal128(int(found.group(1)), int(found.group(2)))
    return {"int": pa.int32(), "bigint": pa.int64(), "double": pa.float64(),
            "string": pa.string(), "boolean": pa.bool_(),
            "timestamp": pa.timestamp("us", tz="UTC")}[kind]


# ------------------------------------------------------------------ compiling (the driver)
def compile_ops(spark: Any, schema: Any, ops: Sequence[Any]) -> Program | str:
    """The operators `ops` (filter / select / with_columns specs, in order) over rows of
    `schema` as a `Program`, or why they cannot be one."""
    from pyspark.sql.types import StructType

    from streamer.operators.stateless import apply_stateless

    steps = []
    for op in ops:
        for field in schema.fields:
            if not supported(field.dataType.simpleString()):
                return f"column {field.name!r} of type {field.dataType.simpleString()}"
        df = apply_stateless(op, empty_frame(spark, schema))
        try:
            steps.extend(_steps(op.id, df._jdf.queryExecution().analyzed()))
        except Untranslatable as exc:
            return f"operator {op.id!r}: {exc}"
        schema = StructType(df.schema.fields)
    return Program(tuple(steps))


def _steps(op_id: str, plan: Any) -> list[Step]:
    """The Project and Filter nodes of an analyzed plan, innermost first."""
    node, chain = plan, []
    while node.getClass().getSimpleName() in ("Project", "Filter"):
        chain.append(node)
        node = node.children().apply(0)
    if node.getClass().getSimpleName() not in ("LocalRelation", "LogicalRDD"):
        msg = f"a {node.nodeName()} in its plan"
        raise Untranslatable(msg)
    steps = []
    for step in reversed(chain):
        child = step.children().apply(0).output()
        inputs = tuple((int(child.apply(i).exprId().id()), str(child.apply(i).name()))
                       for i in range(child.size()))
        if step.getClass().getSimpleName() == "Filter":
            steps.append(Step(op_id, "filter", (), (_expr(step.condition()),), inputs))
            continue
        names, exprs = [], []
        projected = step.projectList()
        for i in range(projected.size()):
            e = projected.apply(i)
            names.append(str(e.name()))
            exprs.append(_expr(e))
        if len(set(names)) != len(names):
            msg = "two output columns of one name"
            raise Untranslatable(msg)
        steps.append(Step(op_id, "project", tuple(names), tuple(exprs), inputs))
    return steps


def _expr(e: Any) -> Any:
    """One analyzed Catalyst expression as a nested tuple (`_eval`'s form)."""
    cls = e.getClass().getSimpleName()
    kids = e.children()
    args = [kids.apply(i) for i in range(kids.size())]
    kind = e.dataType().simpleString()
    if not supported(kind):
        msg = f"{e.sql()} has type {kind}"
        raise Untranslatable(msg)
    if cls == "Alias":
        return _expr(args[0])
    if cls == "AttributeReference":
        return ("attr", int(e.exprId().id()))
    if cls == "Literal":
        value = e.value()
        if value is not None and kind == "timestamp":
            msg = "a timestamp literal"
            raise Untranslatable(msg)
        if value is not None and kind == "string":
            value = str(value.toString())
        elif value is not None and DECIMAL.fullmatch(kind):
            value = Decimal(str(value.toString()))
        return ("lit", value, kind)
    if cls == "Cast":
        return _cast(kind, args[0])
    if cls == "Get" and args[0].getClass().getSimpleName() == "StringSplit":
        return ("split_get", kind, *_split(args[0]), _expr(args[1]))
    if cls == "CaseWhen":
        has_else = bool(e.elseValue().isDefined())
        return ("case", kind, has_else, *[_expr(a) for a in args])
    if cls == "Hour" and e.timeZoneId().isDefined() and str(e.timeZoneId().get()) in _UTC:
        return ("hour", kind, _expr(args[0]))
    if cls == "Length" and args[0].dataType().simpleString() == "string":
        return ("length", kind, _expr(args[0]))
    if cls == "StringReplace":
        search, by = (_plain(a, e) for a in args[1:])
        if not search:  # (Spark gives the string unchanged)
            return _expr(args[0])
        return ("replace", kind, _expr(args[0]), search, by)
    if cls == "Remainder" and kind in ("int", "bigint"):
        return ("remainder", kind, *[_expr(a) for a in args])
    if cls in _ARITHMETIC and DECIMAL.fullmatch(kind):
        _exact(e, cls, kind, args)
    simple = {"And": "and", "Or": "or", "Not": "not", "IsNull": "is_null",
              "IsNotNull": "is_not_null", "EqualNullSafe": "null_safe", "UnaryMinus": "negate",
              **_ARITHMETIC, **_COMPARE}
    if cls in ("MillisToTimestamp", "MicrosToTimestamp") and args[0].dataType().simpleString() \
            in ("int", "bigint"):
        return ("to_timestamp", kind, _expr(args[0]), 1000 if cls == "MillisToTimestamp" else 1)
    if cls == "Divide" and kind == "double":
        return ("divide", kind, *[_expr(a) for a in args])
    if cls in simple and ((cls not in _ARITHMETIC and cls != "UnaryMinus")
                          or kind in ("int", "bigint", "double") or DECIMAL.fullmatch(kind)):
        return (simple[cls].lower() if cls not in _ARITHMETIC else _ARITHMETIC[cls], kind,
                *[_expr(a) for a in args])
    msg = f"{e.sql()} ({cls})"
    raise Untranslatable(msg)


def _cast(kind: str, arg: Any) -> Any:
    """A cast of `arg` to Spark type `kind`."""
    source = arg.dataType().simpleString()
    if (kind == "double" and source.startswith("decimal")
            and arg.getClass().getSimpleName() == "Literal"):
        # a decimal literal compared with or added to a double: Spark rounds it to the
        # nearest double, as Python's float() of its text does
        value = arg.value()
        return ("lit", None if value is None else float(str(value.toString())), kind)
    if source == kind:
        return _expr(arg)
    if DECIMAL.fullmatch(kind) and (source in ("int", "bigint") or DECIMAL.fullmatch(source)):
        # (exact where the value fits; Spark rounds a decimal that loses scale, so a safe
        # cast that would drop a digit is refused)
        return ("cast_exact", kind, _expr(arg))
    if (source, kind) not in _CASTS:
        msg = f"a cast from {source} to {kind}"
        raise Untranslatable(msg)
    return ("cast", kind, _expr(arg))


def _plain(arg: Any, e: Any) -> str:
    """The text of string literal `arg` of expression `e`."""
    if arg.getClass().getSimpleName() != "Literal" or arg.value() is None:
        msg = f"{e.sql()}: an argument that is not a literal"
        raise Untranslatable(msg)
    return str(arg.value().toString())


def _split(split: Any) -> tuple[Any, str]:
    """(The string, the separator) of a `split(s, 'sep')` whose separator is plain text and
    whose limit keeps every piece, as Arrow's literal split gives them."""
    kids = split.children()
    text, separator, limit = (kids.apply(i) for i in range(3))
    plain = _plain(separator, split)
    if not plain or set(plain) & _REGEX:
        msg = f"{split.sql()}: a separator that is a regular expression"
        raise Untranslatable(msg)
    if limit.getClass().getSimpleName() != "Literal" or limit.value() is None \
            or int(limit.value()) > 0:
        msg = f"{split.sql()}: a limit"
        raise Untranslatable(msg)
    return _expr(text), plain


def _exact(e: Any, cls: str, kind: str, args: list[Any]) -> None:
    """Untranslatable unless Arrow's decimal result type for `e` is Spark's `kind` (Spark
    rounds a result whose precision would pass 38: Arrow does not)."""
    (p1, s1), (p2, s2) = (_precision(a.dataType().simpleString()) for a in args)
    if cls == "Multiply":
        mine = (p1 + p2 + 1, s1 + s2)
    else:
        scale = max(s1, s2)
        mine = (max(p1 - s1, p2 - s2) + scale + 1, scale)
    if mine != _precision(kind):
        msg = f"{e.sql()}: decimal arithmetic that Spark rounds to {kind}"
        raise Untranslatable(msg)


def _precision(kind: str) -> tuple[int, int]:
    found = DECIMAL.fullmatch(kind)
    if found is None:
        msg = f"a decimal operation on {kind}"
        raise Untranslatable(msg)
    return int(found.group(1)), int(found.group(2))
