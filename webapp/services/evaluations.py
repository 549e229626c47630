"""Evaluating checkpoints on evaluation sets (webapp.models.evaluations): asked for here, run by a worker
(workers.evaluating: ``python -m trainer.evaluate`` as a process), which records what it did through the functions
below (webapp.services.job_rows)."""
from django.core.exceptions import ValidationError
from django.db import transaction

from trainer.contract.manifest import read_manifest

from ..finite import finite
from ..models import Checkpoint, Evaluation, EvaluationSet, data_roots_for
from .job_rows import job_claim, job_progress, job_settle
from .tasks import TaskName, enqueue


@transaction.atomic
def evaluation_create(owner, eval_set: EvaluationSet, checkpoint: Checkpoint) -> Evaluation:
    """Queue the evaluation of ``checkpoint`` on ``eval_set`` (both visible to ``owner``: the caller checks);
    ValidationError when the set's file may no longer be read or the checkpoint's folder is gone."""
    problem = data_roots_for(eval_set.owner).problem(eval_set.path)
    if problem:
        raise ValidationError({"eval_set": [f"evaluation set {eval_set.name!r}: {problem}"]})
    if read_manifest(checkpoint.path) is None:
        raise ValidationError({"checkpoint": [f"checkpoint {checkpoint.pk}'s folder {checkpoint.path} no longer holds "
                                              f"a complete checkpoint (pruned or moved): evaluate another one"]})
    evaluation = Evaluation.objects.create(owner=owner, eval_set=eval_set, checkpoint=checkpoint,
                                           message="queued for evaluation")
    enqueue(TaskName.EVALUATION_RUN, evaluation.pk)
    return evaluation


def evaluation_claim(evaluation_id: int) -> Evaluation | None:
    return job_claim(Evaluation, evaluation_id, "loading the checkpoint", related=("eval_set", "checkpoint"))


def evaluation_progress(evaluation: Evaluation, message: str) -> bool:
    return job_progress(evaluation, message)


def evaluation_settle(evaluation: Evaluation, status: str, message: str, scores: dict) -> bool:
    return job_settle(evaluation, status, message, scores=finite(scores))
