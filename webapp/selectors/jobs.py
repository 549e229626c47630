"""Reads of the jobs a row follows: a dataset's preparations, and checkpoints' evaluations."""
from django.db.models import F, Prefetch, Q, QuerySet

from ..models import Dataset, Evaluation, EvaluationSet, Run
from .checkpoints import checkpoints_visible_to


def dataset_preparations(dataset: Dataset) -> QuerySet:
    """The dataset's preparations, newest first, each with who asked and where it runs."""
    return dataset.preparations.select_related("owner", "cluster")


def evaluations_visible_to(user) -> QuerySet:
    """Evaluations of the checkpoints ``user`` may see, each with who asked, its checkpoint and its deployment."""
    return (Evaluation.objects.filter(checkpoint__in=checkpoints_visible_to(user))
            .select_related("owner", "checkpoint", "deployment"))


def checkpoints_with_scores(run: Run) -> QuerySet:
    """The run's checkpoints, newest first, each with its evaluations (``evaluations_shown``: by set, the checkpoint
    itself before its deployments, newest first)."""
    shown = Evaluation.objects.select_related("eval_set", "deployment") \
        .order_by("eval_set__name", F("deployment_id").asc(nulls_first=True), "-created_at")
    return run.checkpoints.order_by("-step").prefetch_related(Prefetch("evaluations", queryset=shown,
                                                                       to_attr="evaluations_shown"))


def run_is_evaluating(run: Run) -> bool:
    """Whether an evaluation of one of the run's checkpoints is still to finish."""
    return Evaluation.objects.filter(checkpoint__run=run, status__in=[Evaluation.Status.PENDING,
                                                                     Evaluation.Status.RUNNING]).exists()


def run_evaluation_sets(run: Run) -> QuerySet:
    """The sets the run's checkpoints are scored on: those asked for at launch and those a checkpoint of the run
    was evaluated on directly since, by name."""
    return (EvaluationSet.objects.filter(Q(runs=run) | Q(evaluations__checkpoint__run=run,
                                                         evaluations__deployment__isnull=True))
            .distinct().order_by("name", "id"))
