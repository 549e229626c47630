"""Evaluating checkpoints on evaluation sets (webapp.models.evaluations): asked for here, run by a worker
(workers.evaluating: ``python -m trainer.evaluate`` as a process), which records what it did through the functions
below (webapp.services.job_rows)."""
import logging

from django.core.exceptions import ValidationError
from django.db import transaction
from rest_framework.authtoken.models import Token

from deploy.client import ADDED_IN
from trainer.contract.manifest import read_manifest

from ..models import Checkpoint, Deployment, Evaluation, EvaluationSet, Run, data_roots_for
from .job_rows import job_claim, job_settle
from .tasks import TaskName, enqueue

log = logging.getLogger(__name__)


@transaction.atomic
def evaluation_create(owner, eval_set: EvaluationSet, checkpoint: Checkpoint | None = None,
                      deployment: Deployment | None = None) -> Evaluation:
    """Queue the evaluation of ``checkpoint``, or of ``deployment`` through /v1, on ``eval_set`` (all visible to
    ``owner``: the caller checks); ValidationError when the set's file may no longer be read, the checkpoint's folder
    is gone, the deployment is not serving or the set cannot be scored through /v1."""
    if (checkpoint is None) == (deployment is None):
        raise ValidationError({"checkpoint": ["give a checkpoint, or a deployment to evaluate through /v1, not both"]})
    problem = data_roots_for(eval_set.owner).problem(eval_set.path)
    if problem:
        raise ValidationError({"eval_set": [f"evaluation set {eval_set.name!r}: {problem}"]})
    if deployment is not None:
        if deployment.status != Deployment.Status.READY:
            raise ValidationError({"deployment": [f"deployment {deployment.model_name!r} is {deployment.status}: "
                                                  f"only a ready one answers /v1"]})
        if eval_set.kind == EvaluationSet.Kind.TEXT:
            raise ValidationError({"eval_set": ["a text set is scored by the model's log-likelihood over windows of "
                                                "its context, which an evaluation through /v1 does not ask: evaluate "
                                                "the deployment's checkpoint instead"]})
        checkpoint = deployment.checkpoint
    elif read_manifest(checkpoint.path) is None:
        raise ValidationError({"checkpoint": [f"checkpoint {checkpoint.pk}'s folder {checkpoint.path} no longer holds "
                                              f"a complete checkpoint (pruned or moved): evaluate another one"]})
    evaluation = Evaluation.objects.create(owner=owner, eval_set=eval_set, checkpoint=checkpoint,
                                           deployment=deployment, message="queued for evaluation")
    enqueue(TaskName.EVALUATION_RUN, evaluation.pk)
    return evaluation


def evaluations_after_checkpoint(run: Run, checkpoint: Checkpoint) -> list[Evaluation]:
    """The evaluations ``run`` asked for at launch, of its newly saved ``checkpoint``: one per set it names that its
    owner may still read (a set no longer readable is left out, the others still run)."""
    queued = []
    for eval_set in run.evaluation_sets.all():
        try:
            queued.append(evaluation_create(run.owner, eval_set, checkpoint=checkpoint))
        except ValidationError as exc:
            log.warning("run %s: no evaluation of step %s on %r: %s", run.pk, checkpoint.step, eval_set.name,
                        "; ".join(exc.messages))
    return queued


def evaluation_api_key(evaluation: Evaluation) -> str:
    """The API token a deployment's evaluation sends to /v1: its owner's, so /v1 serves what they may use."""
    return Token.objects.get_or_create(user=evaluation.owner)[0].key


def evaluation_tokenizer(evaluation: Evaluation) -> str | None:
    """The tokenizer a deployment's evaluation counts its contexts' tokens with, where its deployment returns the
    prompt's log-probabilities (so choices are scored by their likelihood too): its checkpoint's."""
    deployment = evaluation.deployment
    if deployment is None or int(deployment.report.get("interface", 1)) < ADDED_IN["prompt_logprobs"]:
        return None
    return (deployment.checkpoint.manifest or {}).get("tokenizer") or None


def evaluation_claim(evaluation_id: int) -> Evaluation | None:
    return job_claim(Evaluation, evaluation_id, "starting the harness",
                     related=("eval_set", "checkpoint", "deployment", "owner"))


def evaluation_settle(evaluation: Evaluation, status: str, message: str, scores: dict) -> bool:
    return job_settle(evaluation, status, message, scores)
