"""Serializer fields holding a contract spec as JSON: validated by trainer.contract and described in OpenAPI.

The OpenAPI schema of each field is derived from the spec's dataclass, so the published schema, the validation
and the trainer can never disagree about what a field is.
"""
import dataclasses
import types
import typing
from typing import Any, Literal, Union

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.settings import api_settings

from trainer.contract import SpecError
from trainer.contract.rules import LIMITS
from trainer.contract.specjson import READABLE_VERSIONS

from ..spec_errors import spec_field_errors


def json_schema(tp: Any) -> dict:
    """An OpenAPI 3 schema for a contract type (dataclass, Literal, Optional, tuple, scalar)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        values = list(typing.get_args(tp))
        return {"type": "string", "enum": values}
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return {**json_schema(args[0]), "nullable": True}
    if origin is tuple:
        return {"type": "array", "items": json_schema(typing.get_args(tp)[0])}
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        fields = [f for f in dataclasses.fields(tp) if f.init]
        properties = {"schema_version": {"type": "integer", "enum": list(READABLE_VERSIONS)}}
        required = []
        limits = LIMITS.get(tp.__name__, {})
        for f in fields:
            properties[f.name] = json_schema(hints[f.name])
            if f.name in limits:  # the contract's own bound (rules.within_limits refuses what lies above it)
                properties[f.name]["maximum"] = limits[f.name][0]
            names = getattr(hints[f.name], "preset_names", None)
            if names is not None:  # a spec that may also be given by a preset's name (a GPU)
                properties[f.name] = {"oneOf": [properties[f.name], {"type": "string", "enum": list(names())}]}
            if f.default is not dataclasses.MISSING and not dataclasses.is_dataclass(f.default):
                properties[f.name]["default"] = f.default
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                required.append(f.name)
        schema = {"type": "object", "properties": properties, "additionalProperties": False}
        if required:
            schema["required"] = required
        if tp.__doc__:
            schema["description"] = " ".join(tp.__doc__.split())
        return schema
    return {bool: {"type": "boolean"}, int: {"type": "integer"}, float: {"type": "number"},
            str: {"type": "string"}}[tp]


def api_field(path: str) -> str:
    """Where the API answers a contract error's path: a key of its own, the whole object's under the non-field key."""
    return path or api_settings.NON_FIELD_ERRORS_KEY


class SpecField(serializers.JSONField):
    """A JSON object parsed into ``spec_class`` and stored as its canonical dict (defaults filled in)."""

    spec_class: type = None

    def to_internal_value(self, data):
        data = super().to_internal_value(data)
        try:
            return self.spec_class.from_dict(data).to_dict()
        except SpecError as exc:
            raise serializers.ValidationError(spec_field_errors(exc, api_field)) from None


def spec_field(spec_class: type) -> type[SpecField]:
    """A SpecField subclass for ``spec_class`` with its OpenAPI schema attached."""
    field_class = type(f"{spec_class.__name__}Field", (SpecField,), {"spec_class": spec_class})
    return extend_schema_field(json_schema(spec_class))(field_class)
