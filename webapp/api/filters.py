"""The list filters: each takes exactly what the OpenAPI schema says of its query parameter, no more and no less.

django-filter reads a query loosely by default: an empty or unreadable value (``?kind=``, ``?shared=-1``) means "no
filter", and a foreign key's id must name an existing object (``?run=0`` is a 400 "Select a valid choice"). Clients
generated from the schema expect the opposite on both counts, so every filter set here derives from ``StrictFilterSet``.
"""
import datetime

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.db import models as db
from django_filters.fields import IsoDateTimeField
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field

from .. import models
from .parsers import MAX_INT

# The ids a filter takes: the integers a JSON body may hold (a larger one could be neither stored nor compared)
ID_RANGE = (-MAX_INT, MAX_INT)
_BOOLEANS = {"true": True, "false": False}


@extend_schema_field(OpenApiTypes.INT)  # bounded as every integer of the schema is (webapp.api.schema)
class IdFilter(django_filters.NumberFilter):
    """An object's id: one that names no object you can see matches nothing, like any other value (an empty list,
    not an error, as for a name that matches nothing)."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        super().__init__(*args, min_value=ID_RANGE[0], max_value=ID_RANGE[1], **kwargs)


class StrictBooleanField(forms.Field):
    def to_python(self, value):
        if value in (None, ""):
            return None
        if value not in _BOOLEANS:
            raise ValidationError(f"{value!r} is not a boolean: give true or false")
        return _BOOLEANS[value]


class StrictBooleanFilter(django_filters.BooleanFilter):
    """``true`` or ``false`` as OpenAPI writes a boolean query parameter; anything else is refused, not ignored."""

    field_class = StrictBooleanField


class _GivenOnceForm(forms.Form):
    def clean(self):
        cleaned = super().clean()
        for name in self.fields:
            values = self.data.getlist(name) if hasattr(self.data, "getlist") else []
            if len(values) > 1:
                self.add_error(name, f"given {len(values)} times: give it once")
            elif values == [""] and not isinstance(self.fields[name], forms.CharField):  # a string may be empty
                self.add_error(name, "empty: give a value, or leave the parameter out")
        return cleaned


class StrictFilterSet(django_filters.FilterSet):
    """Refuses what the schema does not allow: a filter given twice, an empty value where the schema wants a number,
    a boolean or one of its choices, an unreadable boolean; and filters by an id without requiring the object to
    exist."""

    FILTER_DEFAULTS = {
        **django_filters.FilterSet.FILTER_DEFAULTS,
        db.ForeignKey: {"filter_class": IdFilter},
        db.OneToOneField: {"filter_class": IdFilter},
        db.BooleanField: {"filter_class": StrictBooleanFilter},
    }

    def get_form_class(self):
        return type(f"{type(self).__name__}Form", (_GivenOnceForm, super().get_form_class()), {})


class StrictFilterBackend(DjangoFilterBackend):
    """The default filter backend: the filter sets it builds from a view's ``filterset_fields`` are strict too."""

    filterset_base = StrictFilterSet


class UTCDateTimeField(IsoDateTimeField):
    """An ISO 8601 time, moved to UTC before it reaches the database: Python takes offsets up to ±24 h, PostgreSQL
    only up to ±16 h, and a time near year 1 or 9999 may leave the calendar once moved."""

    def to_python(self, value):
        value = super().to_python(value)
        if value is None:
            return None
        try:
            return value.astimezone(datetime.timezone.utc)
        except OverflowError:
            raise ValidationError(f"{value.isoformat()} is outside the years 1–9999 in UTC") from None


class UTCDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UTCDateTimeField


class RunFilter(StrictFilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")
    owner = django_filters.CharFilter(field_name="owner__username")
    created_after = UTCDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UTCDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = models.Run
        fields = ["status", "model_config", "plan", "cluster", "dataset", "shared"]


class DatasetFilter(StrictFilterSet):
    owner = django_filters.CharFilter(field_name="owner__username")

    class Meta:
        model = models.Dataset
        fields = ["name", "shared"]


class MetricFilter(StrictFilterSet):
    since_step = django_filters.NumberFilter(field_name="step", lookup_expr="gte")

    class Meta:
        model = models.Metric
        fields = ["run", "kind"]


# The API's words for a tuning job's state, as before its row became a common job row (webapp.models.jobs)
TUNE_STATUS_WORDS = {models.TuneJob.Status.PENDING: "queued", models.TuneJob.Status.RUNNING: "running",
                     models.TuneJob.Status.DONE: "completed", models.TuneJob.Status.FAILED: "failed"}


class TuneJobFilter(StrictFilterSet):
    status = django_filters.ChoiceFilter(choices=[(word, word) for word in TUNE_STATUS_WORDS.values()],
                                         method="in_state")

    class Meta:
        model = models.TuneJob
        fields = ["status"]

    def in_state(self, queryset, name, word):
        return queryset.filter(status={w: s for s, w in TUNE_STATUS_WORDS.items()}[word])
