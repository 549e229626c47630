"""Stored parallelism plans with the parts they are checked against."""
from django.db.models import QuerySet

from ..models import ParallelismPlan


def plans_with_parts() -> QuerySet:
    """Every plan with its model config and cluster, which a plan is checked and estimated with (the API's plan
    fields choose from these, limited to the plans a user may use)."""
    return ParallelismPlan.objects.select_related("model_config", "cluster")
