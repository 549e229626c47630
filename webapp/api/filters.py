import django_filters

from .. import models


class RunFilter(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")
    owner = django_filters.CharFilter(field_name="owner__username")
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = models.Run
        fields = ["status", "model_config", "plan", "cluster", "dataset", "shared"]


class MetricFilter(django_filters.FilterSet):
    since_step = django_filters.NumberFilter(field_name="step", lookup_expr="gte")

    class Meta:
        model = models.Metric
        fields = ["run", "kind"]
