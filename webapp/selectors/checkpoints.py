"""Checkpoints as the API and the pages list them, and the ones retention may take off the record."""
from django.db.models import QuerySet

from ..models import Checkpoint, Run


def checkpoints_with_runs() -> QuerySet:
    """Every checkpoint with its run and that run's owner, and its own owner (an imported one has no run)."""
    return Checkpoint.objects.select_related("run__owner", "owner")


def checkpoints_visible_to(user) -> QuerySet:
    return checkpoints_with_runs().visible_to(user)


def checkpoints_without_deployments(run: Run) -> QuerySet:
    """The run's checkpoints no deployment was made from: the ones that leave the record with their folder."""
    return run.checkpoints.filter(deployments__isnull=True)
