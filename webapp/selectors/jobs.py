"""Reads of the jobs a row follows: a dataset's preparations, and checkpoints' evaluations."""
from django.db.models import Prefetch, QuerySet

from ..models import Dataset, Evaluation, Run
from .checkpoints import checkpoints_visible_to


def dataset_preparations(dataset: Dataset) -> QuerySet:
    """The dataset's preparations, newest first, each with who asked."""
    return dataset.preparations.select_related("owner")


def evaluations_visible_to(user) -> QuerySet:
    """Evaluations of the checkpoints ``user`` may see, each with who asked and its checkpoint."""
    return (Evaluation.objects.filter(checkpoint__in=checkpoints_visible_to(user))
            .select_related("owner", "checkpoint"))


def checkpoints_with_scores(run: Run) -> QuerySet:
    """The run's checkpoints, newest first, each with its finished evaluations (``done_evaluations``, by set)."""
    done = Evaluation.objects.filter(status=Evaluation.Status.DONE).select_related("eval_set") \
        .order_by("eval_set__name", "-created_at")
    return run.checkpoints.order_by("-step").prefetch_related(Prefetch("evaluations", queryset=done,
                                                                       to_attr="done_evaluations"))
