"""Strict conversion between the contract's dataclasses and plain JSON values.

Standard library only. Every field is type-checked on the way in, unknown keys are refused, and floats survive the
trip exactly (JSON writes ``repr(float)``), so ``from_dict(to_dict(x)) == x`` for every spec.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Literal, Union

# 2 added the Llama/Mixtral/Qwen2-MoE model fields, context parallel and stage layouts. Every field added since 1 has
# a default that means what version 1 meant, so a version-1 spec reads unchanged and writes back as version 2.
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)


class SpecError(ValueError):
    """A spec that cannot be used. ``errors`` maps a dotted field path ('' for the whole object) to messages."""

    def __init__(self, errors: dict[str, list[str]]):
        self.errors = {field: list(messages) for field, messages in errors.items() if messages}
        super().__init__("; ".join(f"{field}: {m}" if field else m
                                   for field, messages in self.errors.items() for m in messages))

    @classmethod
    def single(cls, field: str, message: str) -> "SpecError":
        return cls({field: [message]})

    def prefixed(self, prefix: str) -> "SpecError":
        return SpecError({f"{prefix}.{k}" if k else prefix: v for k, v in self.errors.items()})


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is tuple:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp) and type(value) in {type(a) for a in typing.get_args(tp)}:
            return value
        raise SpecError.single(path, f"must be one of {_type_name(tp)}, got {value!r}")
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise SpecError.single(path, f"must be {_type_name(tp)}, got null")
        last_error = None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path)
            except SpecError as exc:
                last_error = exc
        raise last_error  # type: ignore[misc]
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise SpecError.single(path, f"must be a list, got {value!r}")
        item = typing.get_args(tp)[0]
        return tuple(_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise SpecError.single(path, f"must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise SpecError.single(path, f"must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise SpecError.single(path, f"must be a finite number, got {value!r}")
            return float(value)
        raise SpecError.single(path, f"must be a number, got {value!r}")
    if tp is str:
        if isinstance(value, str) and "\x00" in value:
            # NUL is never meaningful in a name or path, and PostgreSQL's jsonb cannot store it.
            raise SpecError.single(path, "must not contain NUL characters")
        if isinstance(value, str):
            return value
        raise SpecError.single(path, f"must be a string, got {value!r}")
    raise TypeError(f"unsupported field type {tp!r} at {path}")


@functools.cache
def _fields_of(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field]]:
    """``cls``'s resolved field types and its init fields, once a class: resolving the string annotations took most
    of the time of reading a small spec (a dashboard reads hundreds of plans)."""
    return typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls) if f.init}


def from_dict(cls: type, data: Any, path: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, collecting every field error before raising."""
    expand = getattr(cls, "expand_json", None)
    if expand is not None:  # a spec's shorthand (a GPU by name) becomes its full form before the checks
        data = expand(data, path)
    if not isinstance(data, dict):
        raise SpecError.single(path, f"must be an object, got {type(data).__name__}")
    hints, fields = _fields_of(cls)
    errors: dict[str, list[str]] = {}
    kwargs: dict[str, Any] = {}
    for key in data:
        if key == "schema_version":
            continue
        if key not in fields:
            errors.setdefault(_join(path, key), []).append(
                f"unknown field; expected one of {', '.join(sorted(fields))}")
    for name, field in fields.items():
        where = _join(path, name)
        if name not in data:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                errors.setdefault(where, []).append("this field is required")
            continue
        try:
            kwargs[name] = _convert(hints[name], data[name], where)
        except SpecError as exc:
            for k, v in exc.errors.items():
                errors.setdefault(k, []).extend(v)
    version = data.get("schema_version", SCHEMA_VERSION)
    if version not in READABLE_VERSIONS:
        errors.setdefault(_join(path, "schema_version"), []).append(
            f"schema_version {version!r} is not supported; this version reads "
            f"{', '.join(map(str, READABLE_VERSIONS))}")
    if errors:
        raise SpecError(errors)
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """Plain JSON values for a dataclass tree (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
