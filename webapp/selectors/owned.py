"""Rows of an owned model (webapp.models.ownership) as lists show them: those the user may see, with their owner."""
from django.db.models import QuerySet


def visible_with_owners(queryset: QuerySet, user) -> QuerySet:
    """The rows of ``queryset`` that ``user`` may see, each with its owner, whom every list names."""
    return queryset.visible_to(user).select_related("owner")
