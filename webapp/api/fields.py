"""Serializer fields that take a JSON value of their own type only.

DRF's fields coerce: an IntegerField takes "10" and 10.0, a FloatField takes true, a BooleanField takes "yes" and
1, a CharField takes 12. A JSON body says what type each value is, and the schema promises one; these fields hold
the API to it, so that a value of the wrong type is a 400 naming the field and the value, never a surprise further
in. (Forms and multipart bodies carry only strings: their serializers keep DRF's own fields.)
"""
import math

from drf_spectacular.extensions import OpenApiSerializerExtension
from rest_framework import serializers


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "must be an integer (a JSON number without a fraction), got {input!r}"}

    def to_internal_value(self, data):
        if not _number(data) or (isinstance(data, float) and not data.is_integer()):
            self.fail("invalid", input=data)
        return int(data)


class StrictFloatField(serializers.FloatField):
    default_error_messages = {"invalid": "must be a finite number, got {input!r}"}

    def to_internal_value(self, data):
        if not _number(data) or not math.isfinite(data):
            self.fail("invalid", input=data)
        return float(data)


class StrictBooleanField(serializers.BooleanField):
    default_error_messages = {"invalid": "must be true or false, got {input!r}"}

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictCharField(serializers.CharField):
    default_error_messages = {"invalid": "must be a string, got {input!r}"}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid", input=data)
        return super().to_internal_value(data)


class StrictPrimaryKeyRelatedField(serializers.PrimaryKeyRelatedField):
    """An object's id: a JSON integer (not "3", not true, which Django would read as 1)."""

    default_error_messages = {"incorrect_type": "must be an object's id (an integer), got {data_type} {input!r}",
                              "does_not_exist": "no {what} {pk_value} that you can see"}

    def to_internal_value(self, data):
        if not _number(data) or (isinstance(data, float) and not data.is_integer()):
            self.fail("incorrect_type", data_type=type(data).__name__, input=data)
        queryset = self.get_queryset()
        try:
            return queryset.get(pk=int(data))
        except queryset.model.DoesNotExist:
            self.fail("does_not_exist", what=queryset.model._meta.verbose_name, pk_value=int(data))


class VisibleRelatedField(StrictPrimaryKeyRelatedField):
    """A foreign key limited to the objects the requesting user may see."""

    def get_queryset(self):
        return super().get_queryset().visible_to(self.context["request"].user)


class UsablePlanField(StrictPrimaryKeyRelatedField):
    """A plan the requesting user may use: they see it and its model config (ParallelismPlan.objects.usable_by)."""

    def get_queryset(self):
        return super().get_queryset().usable_by(self.context["request"].user)


class StrictSerializer(serializers.Serializer):
    """A JSON object whose every key is a field: an unknown key is refused instead of ignored (a typo would
    otherwise silently fall back to a default)."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                expected = ", ".join(sorted(self.fields))
                raise serializers.ValidationError({key: [f"unknown field; expected one of {expected}"]
                                                   for key in unknown})
        return super().to_internal_value(data)


class StrictSerializerSchema(OpenApiSerializerExtension):
    """A strict serializer's request body says that it refuses unknown keys (``additionalProperties`` false), or a
    client generated from the schema would send extra keys it believes allowed."""

    target_class = StrictSerializer
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_basic_serializer(self.target, direction)
        if direction == "request":
            schema["additionalProperties"] = False
        return schema
