"""The pydantic models of the pipeline file (`pipeline/job_model.py`) inside the hand-built
one (`pipeline/model.py`): a `ModelNode` validates its part of the file with pydantic and
turns each of pydantic's errors into the message the rest of the file gets (`file:line:col`
from the loader's positions, the key quoted, the nearest valid key, the fix), and renders
the model's JSON Schema inline, as `streamer schema` and the docs reference read it.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from streamer.pipeline.job_model import NULL, RULE, Fix
from streamer.pipeline.model import Checker, Node, did_you_mean, label, nearest, type_name
from streamer.pipeline.yaml_loader import Path


def _members(annotation: Any) -> list[Any]:
    """The types an annotation allows, without `Annotated` wrappers, unions flattened."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [m for arg in get_args(annotation) for m in _members(arg)]
    return [annotation]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    return next((m for m in _members(annotation)
                 if isinstance(m, type) and issubclass(m, BaseModel)), None)


def expects(annotation: Any) -> str:
    """What a key takes, for a message: `must be a whole number`, `must be a mapping`."""
    members = [m for m in _members(annotation) if m is not type(None)]
    if _model_in(annotation) is not None:
        return "must be a mapping"
    for kind, words in ((bool, "must be true or false"), (int, "must be a whole number"),
                        (str, "must be a string")):
        if kind in members:
            return words
    literals = [v for m in members if get_origin(m) is Literal for v in get_args(m)]
    return f"must be one of {', '.join(map(str, literals))}" if literals else "must be set"


def _field(model: type[BaseModel], loc: tuple[Any, ...]) -> FieldInfo | None:
    """The field at `loc` (a pydantic error's location) of `model`, if there is one."""
    current: type[BaseModel] | None = model
    found = None
    for part in loc:
        if current is None or not isinstance(part, str) or part not in current.model_fields:
            return None
        found = current.model_fields[part]
        current = _model_in(found.annotation)
    return found


def _owner(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel]:
    """The model of the mapping at `loc` (`loc` () is `model` itself)."""
    field = _field(model, loc) if loc else None
    return (_model_in(field.annotation) if field else None) or model


def _keys(model: type[BaseModel], loc: tuple[Any, ...], kind: str) -> tuple[Any, ...]:
    """The keys of the file in a pydantic error's `loc`, without the names pydantic gives
    the members of a union (`parallelism: int | None` fails as `parallelism.constrained-int`
    and `parallelism.none`; `prometheus: PrometheusModel | None` as
    `prometheus.PrometheusModel.port`)."""
    out: list[Any] = []
    current: type[BaseModel] | None = model
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if current is not None and isinstance(part, str) and part in current.model_fields:
            out.append(part)
            current = _model_in(current.model_fields[part].annotation)
        elif current is not None and last and kind in ("extra_forbidden", "missing"):
            out.append(part)  # the unknown (or missing) key itself
        elif not isinstance(part, str):
            out.append(part)
    return tuple(out)


def _message(model: type[BaseModel], err: Any, path: Path) -> tuple[Path, str, bool]:
    """(where, message, at the key) for one of pydantic's errors at `path` + its loc."""
    loc = _keys(model, tuple(err["loc"]), err["type"])
    where: Path = (*path, *loc)
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    field = _field(model, loc)
    fixes = [m.text for m in (field.metadata if field else []) if isinstance(m, Fix)]
    fix = f"; {fixes[0]}" if fixes else ""
    name = label(where)
    if kind == "extra_forbidden":
        valid = list(_owner(model, loc[:-1]).model_fields)
        return where, (f"unknown key {loc[-1]!r} in {label(where[:-1])}"
                       f"{did_you_mean(str(loc[-1]), valid)}"), True
    if kind == "missing":
        return where[:-1], f"{label(where[:-1])} is missing required key {loc[-1]!r}", False
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return where, f"{name} must be a mapping, got {type_name(got)}", False
    if kind == "literal_error" and field is not None:
        choices = [str(v) for m in _members(field.annotation) if get_origin(m) is Literal
                   for v in get_args(m)]
        hint = nearest(got, choices) if isinstance(got, str) else None
        shown = repr(got) if isinstance(got, str) else type_name(got)
        return where, (f"{name} must be one of {', '.join(choices)}; got {shown}"
                       + (f" (did you mean {hint!r}?)" if hint else "")), False
    words = {"int_type": "must be a whole number", "bool_type": "must be true or false",
             "string_type": "must be a string"}
    if kind in words:
        return where, f"{name} {words[kind]}, got {type_name(got)}{fix}", False
    if kind in ("greater_than_equal", "less_than_equal"):
        bound = ctx.get("ge", ctx.get("le"))
        side = "at least" if kind == "greater_than_equal" else "at most"
        return where, f"{name} must be {side} {bound}, got {got}{fix}", False
    if kind == "string_too_short":
        return where, f"{name} must not be empty", False
    if kind == RULE:  # a model validator's rule, reported at the key it names
        return (*where, ctx["at"]), err["msg"], False
    if kind == NULL and field is not None:
        return where, f"{name} {expects(field.annotation)}, {err['msg']}{fix}", False
    return where, f"{name} {err['msg']}{fix}", False  # our own errors: duration, blank


def check_model(model: type[BaseModel], value: Any, path: Path, ck: Checker) -> Any:
    """Validate `value` at `path` with `model`; report every error to `ck`. The model's
    instance, or None when `value` is not valid."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            if err["type"] == "none_required":  # the None of `X | None`: null is refused
                continue  # before the union (`YamlModel._not_null`), so this is noise
            where, message, at_key = _message(model, err, path)
            ck.report(where, message, at_key=at_key)
        return None


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    """`schema` with its `$ref`s replaced by what they name, without pydantic's titles, an
    object's default (its keys' defaults say it) or a default of None (not set)."""
    if isinstance(schema, list):
        return [_inline(item, defs) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        return _inline({**defs[schema["$ref"].rsplit("/", 1)[-1]],
                        **{k: v for k, v in schema.items() if k != "$ref"}}, defs)
    out = {k: _inline(v, defs) for k, v in schema.items()
           if k not in ("title", "$defs") and not (
               k == "default" and (v is None or isinstance(v, dict)))}
    if isinstance(out.get("description"), str):
        out["description"] = " ".join(out["description"].split())
    return out


@dataclass
class ModelNode(Node):
    """A part of the pipeline file described by a pydantic model."""

    model: type[BaseModel]
    description: str = ""

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        """Report every problem pydantic finds in `value`, in the file's words."""
        check_model(self.model, value, path, ck)

    def schema(self) -> dict[str, Any]:
        """The model's JSON Schema, its definitions inlined."""
        raw = self.model.model_json_schema()
        return dict(_inline(raw, raw.get("$defs", {})))
