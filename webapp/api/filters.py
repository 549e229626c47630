import datetime

import django_filters
from django.core.exceptions import ValidationError
from django_filters.fields import IsoDateTimeField

from .. import models


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


class RunFilter(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")
    owner = django_filters.CharFilter(field_name="owner__username")
    created_after = UTCDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UTCDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = models.Run
        fields = ["status", "model_config", "plan", "cluster", "dataset", "shared"]


class DatasetFilter(django_filters.FilterSet):
    owner = django_filters.CharFilter(field_name="owner__username")

    class Meta:
        model = models.Dataset
        fields = ["name", "shared"]


class MetricFilter(django_filters.FilterSet):
    since_step = django_filters.NumberFilter(field_name="step", lookup_expr="gte")

    class Meta:
        model = models.Metric
        fields = ["run", "kind"]


# The API's words for a tuning job's state, as before its row became a common job row (webapp.models.jobs)
TUNE_STATUS_WORDS = {models.TuneJob.Status.PENDING: "queued", models.TuneJob.Status.RUNNING: "running",
                     models.TuneJob.Status.DONE: "completed", models.TuneJob.Status.FAILED: "failed"}


class TuneJobFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=[(word, word) for word in TUNE_STATUS_WORDS.values()],
                                         method="in_state")

    class Meta:
        model = models.TuneJob
        fields = ["status"]

    def in_state(self, queryset, name, word):
        return queryset.filter(status={w: s for s, w in TUNE_STATUS_WORDS.items()}[word])
