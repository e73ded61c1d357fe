"""Pydantic in the pipeline file's words: `check_model` validates the file (or a part of it)
with the pydantic models (`pipeline/schema.py`, `pipeline/*_model.py`) and turns each of
pydantic's errors into the message the file gets (`file:line:col` from the loader's positions,
the key quoted, the entry named by its id, the nearest valid key or type, the fix);
`check_rules` runs the rules between keys of a mapping; `model_schema` renders a model's JSON
Schema inline, as `streamer schema` and the docs reference read it.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Tag, ValidationError
from pydantic.fields import FieldInfo

from streamer.pipeline.checker import (
    Checker,
    Rule,
    did_you_mean,
    label,
    nearest,
    type_name,
)
from streamer.pipeline.yaml_loader import Path
from streamer.pipeline.yaml_model import KEY, NULL, PLAIN, RULE, Expects, Fix, YamlModel, adapter


def _members(annotation: Any) -> list[Any]:
    """The types an annotation allows, without `Annotated` wrappers, unions flattened."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [m for arg in get_args(annotation) for m in _members(arg)]
    return [annotation]


def fields_of(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """A model's fields by the key the file writes (`schema`, for the field `schema_`)."""
    return {f.alias or name: f for name, f in model.model_fields.items()}


def _words(annotation: Any) -> str | None:
    """The `Expects` of an annotation (a duration's), at any `Annotated` level."""
    for meta in getattr(annotation, "__metadata__", ()):
        if isinstance(meta, Expects):
            return meta.text
    args = get_args(annotation)
    return next((w for w in map(_words, args) if w), None) if args else None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    models = [m for m in _members(annotation)
              if isinstance(m, type) and issubclass(m, BaseModel)]
    return models[0] if len(models) == 1 else None


def _branch(annotation: Any, name: str) -> Any:
    """The member of a union that pydantic names `name` in an error's `loc` (a model's tag
    `files` or class name, a `Tag`), or None when `name` names none."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _branch(get_args(annotation)[0], name)
    if origin is not Union and origin is not types.UnionType:
        return None
    for arg in get_args(annotation):
        tags = [m.tag for m in getattr(arg, "__metadata__", ()) if isinstance(m, Tag)]
        model = _model_in(arg)
        kind = model.model_fields.get("type") if model else None
        if name in tags or (model is not None and (name == model.__name__ or (
                kind is not None and get_args(kind.annotation) == (name,)))):
            return arg
    return None


def expects(annotation: Any) -> str:
    """What a key takes, for a message: `must be a whole number`, `must be a mapping`."""
    members = [m for m in _members(annotation) if m is not type(None)]
    if words := _words(annotation):
        return words
    if _model_in(annotation) is not None:
        return "must be a mapping"
    if any(get_origin(m) is dict for m in members):
        return "must be a mapping of name: value"
    for kind, words in ((bool, "must be true or false"), (int, "must be a whole number"),
                        (str, "must be a string")):
        if kind in members:
            return words
    if any(get_origin(m) is list for m in members):
        return "must be a list"
    literals = [v for m in members if get_origin(m) is Literal for v in get_args(m)]
    return f"must be one of {', '.join(map(str, literals))}" if literals else "must be set"


@dataclass
class _Spot:
    """Where a pydantic error is in the file: the keys of its `loc` (without the names of
    union members), the model field of the last key and the model of its mapping."""

    keys: tuple[Any, ...] = ()
    field: FieldInfo | None = None
    owner: type[BaseModel] | None = None
    #: The annotation of the value at the error (a union's, for a `type:` that names none).
    current: Any = None


def _is_union(annotation: Any) -> bool:
    origin = get_origin(annotation)
    if origin is Annotated:
        return _is_union(get_args(annotation)[0])
    return origin is Union or origin is types.UnionType


def _optional(annotation: Any) -> Any:
    """`X | None` as X (the None of an optional key is refused before the union)."""
    if not _is_union(annotation) or get_origin(annotation) is Annotated:
        return annotation
    rest = [a for a in get_args(annotation) if _members(a) != [type(None)]]
    return rest[0] if len(rest) == 1 else annotation


def _container(annotation: Any, kind: type) -> Any:
    """The items' (or values') annotation of the list (or dict) `annotation` allows."""
    found = next((m for m in _members(annotation) if get_origin(m) is kind), None)
    return get_args(found)[-1] if found is not None else None


def _spot(annotation: Any, value: Any, loc: tuple[Any, ...]) -> _Spot:
    keys: list[Any] = []
    spot = _Spot()
    current = annotation
    for part in loc:
        branch = _branch(current, part) if isinstance(part, str) else None
        if branch is not None:  # `parallelism.constrained-int`, `sinks.0.files.path`
            current = branch
            continue
        real = isinstance(value, dict | list) and (
            part in value if isinstance(value, dict) else isinstance(part, int))
        model = _model_in(current)
        if isinstance(part, str) and model is not None and (
                part in fields_of(model) or real or part == loc[-1]):
            spot.owner, spot.field = model, fields_of(model).get(part)
            current = spot.field.annotation if spot.field else Any
        elif isinstance(part, str) and not real and _is_union(current):
            current = _optional(current)  # an unnamed member of a union: `none`, `str`,
            continue  # `dict[...]`, a validator's `function-before[...]`
        else:
            spot.owner, spot.field = None, None
            current = _container(current, list if isinstance(part, int) else dict)
        keys.append(part)
        value = value[part] if real else None
    spot.keys, spot.current = tuple(keys), current
    return spot


def _value_at(value: Any, keys: tuple[Any, ...]) -> Any:
    for key in keys:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def _tag_message(err: Any, where: Path, what: str, tags: list[str]) -> tuple[Path, str, bool]:
    """A `type:` that names no variant (`union_tag_invalid`) or none (`..._not_found`)."""
    if not isinstance(err["input"], dict):
        return where, f"{label(where)} must be a mapping, got {type_name(err['input'])}", False
    kind = err["input"].get("type")
    valid = ", ".join(tags)
    if kind is None:
        return where, f"{what} is missing required key 'type' (one of {valid})", False
    if not isinstance(kind, str):
        return ((*where, "type"), f"'type' of {what} must be one of {valid}, got "
                f"{type_name(kind)}", False)
    hint = nearest(kind, tags)
    return ((*where, "type"), f"unknown type {kind!r} for {what}; valid: {valid}"
            + (f"; did you mean {hint!r}?" if hint else ""), False)


@dataclass
class _Where:
    """What `_message` needs besides the error: the annotation, the value, its path."""

    annotation: Any
    value: Any
    path: Path

    def name(self, keys: tuple[Any, ...], owner: type[BaseModel] | None) -> str:
        """How a message names the mapping at `keys`: as its model calls it (`sink 'out'`,
        `storage_options`), else by its label."""
        where = (*self.path, *keys)
        if owner is not None and issubclass(owner, YamlModel):
            called = owner.called(_value_at(self.value, keys), where)
            if called is not None:
                return called
        return label(where)


def _message(at: _Where, err: Any) -> tuple[Path, str, bool]:
    """(where, message, at the key) for one of pydantic's errors at `at.path` + its loc."""
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == KEY:  # a mapping's key: `loc` ends in the key and pydantic's `[key]`
        spot = _spot(at.annotation, at.value, tuple(err["loc"])[:-1])
        return (*at.path, *spot.keys), err["msg"], True
    spot = _spot(at.annotation, at.value, tuple(err["loc"]))
    loc, field = spot.keys, spot.field
    where: Path = (*at.path, *loc)
    fixes = [m.text for m in (field.metadata if field else []) if isinstance(m, Fix)]
    fix = f"; {fixes[0]}" if fixes else ""
    name = label(where)
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        variants = [m for m in _members(spot.current)
                    if isinstance(m, type) and issubclass(m, BaseModel)]
        tags = [str(get_args(m.model_fields["type"].annotation)[0]) for m in variants]
        return _tag_message(err, where, at.name(loc, variants[0]), tags)
    if kind == "extra_forbidden":
        owner = spot.owner
        valid = list(fields_of(owner)) if owner else []
        return where, (f"unknown key {loc[-1]!r} in {at.name(loc[:-1], owner)}"
                       f"{did_you_mean(str(loc[-1]), valid)}"), True
    if kind == "missing":
        owner = spot.owner
        return where[:-1], f"{at.name(loc[:-1], owner)} is missing required key {loc[-1]!r}", \
            False
    if kind in ("model_type", "model_attributes_type"):
        return where, f"{name} must be a mapping, got {type_name(got)}", False
    if kind == "dict_type":
        return where, f"{name} must be a mapping of name: value, got {type_name(got)}", False
    if kind == "literal_error" and field is not None:
        choices = [str(v) for m in _members(field.annotation) if get_origin(m) is Literal
                   for v in get_args(m)]
        hint = nearest(got, choices) if isinstance(got, str) else None
        shown = repr(got) if isinstance(got, str) else type_name(got)
        return where, (f"{name} must be one of {', '.join(choices)}; got {shown}"
                       + (f" (did you mean {hint!r}?)" if hint else "")), False
    words = {"int_type": "must be a whole number", "bool_type": "must be true or false",
             "string_type": "must be a string", "list_type": "must be a list"}
    if kind in words:
        return where, f"{name} {words[kind]}, got {type_name(got)}{fix}", False
    if kind in ("greater_than_equal", "less_than_equal"):
        bound = ctx.get("ge", ctx.get("le"))
        side = "at least" if kind == "greater_than_equal" else "at most"
        return where, f"{name} must be {side} {bound}, got {got}{fix}", False
    if kind == "too_short":
        count = ctx["min_length"]
        return where, f"{name} needs at least {count} entr{'y' if count == 1 else 'ies'}", False
    if kind == "string_too_short":
        return where, f"{name} must not be empty", False
    if kind == RULE:  # a model validator's rule, reported at the key it names
        return (*where, ctx["at"]), err["msg"], False
    if kind == PLAIN:  # the whole line, e.g. an aggregate call's
        return where, err["msg"], False
    if kind == NULL and field is not None:
        takes = expects(field.annotation)  # `must be one of a, b; got ...`, as a literal's
        comma = ";" if takes.startswith("must be one of") else ","
        return where, f"{name} {takes}{comma} {err['msg']}{fix}", False
    return where, f"{name} {err['msg']}{fix}", False  # our own errors: duration, blank


def check_model(annotation: Any, value: Any, path: Path, ck: Checker) -> Any:
    """Validate `value` at `path` as `annotation` (a model, or a union of them); report
    every error to `ck`. The validated value, or None when `value` is not valid."""
    try:
        return adapter(annotation).validate_python(value)
    except ValidationError as exc:
        at = _Where(annotation, value, path)
        for err in exc.errors(include_url=False):
            if err["type"] == "none_required":  # the None of `X | None`: null is refused
                continue  # before the union (`YamlModel._not_null`), so this is noise
            where, message, at_key = _message(at, err)
            ck.report(where, message, at_key=at_key)
        return None


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    """`schema` with its `$ref`s replaced by what they name, without pydantic's titles, an
    object's default (its keys' defaults say it), a default of None (not set) or the OpenAPI
    `discriminator` (`oneOf` and each variant's `const` say it in JSON Schema's words)."""
    if isinstance(schema, list):
        return [_inline(item, defs) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        return _inline({**defs[schema["$ref"].rsplit("/", 1)[-1]],
                        **{k: v for k, v in schema.items() if k != "$ref"}}, defs)
    out = {k: _inline(v, defs) for k, v in schema.items()
           if k not in ("title", "$defs", "discriminator") and not (
               k == "default" and (v is None or isinstance(v, dict)))}
    if isinstance(out.get("required"), list):  # in name order
        out["required"] = sorted(out["required"])
    if isinstance(out.get("description"), str):
        out["description"] = " ".join(out["description"].split())
    return out


def check_rules(annotation: Any, rules: dict[str, list[Rule]], value: Any, path: Path,
                ck: Checker) -> None:
    """Run the rules between keys of the mapping `value` (of `annotation`, a model or a union
    of them): those of its `type:` when that names a variant, else those for any (""). A
    value that is not a mapping has only pydantic's message."""
    if not isinstance(value, dict):
        return
    kind = value.get("type")
    if not isinstance(kind, str) or _branch(annotation, kind) is None:
        kind = ""  # a type that names no variant: only the type's message
    for rule in rules.get(kind, []):
        rule(value, path, ck)


def model_schema(annotation: Any) -> dict[str, Any]:
    """The JSON Schema of `annotation` (a model), its definitions inlined."""
    raw = adapter(annotation).json_schema()
    return dict(_inline(raw, raw.get("$defs", {})))
