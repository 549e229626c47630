"""Tuning with measured trials: checked here, run by a worker (the trials are real trainings on this machine)."""
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from trainer.planner.tune.api import parse_tune_request

from ..finite import finite
from ..models import TuneJob, data_roots_for
from .tasks import TaskName, enqueue

TRIAL_GPU = "cpu"


@transaction.atomic
def tune_job_create(*, owner, request: dict, dataset, trial_steps: int = 8) -> TuneJob:
    """Queue a tuning job whose best plans are measured by short runs of the trainer on local CPU ranks.

    Trials measure this machine, so the request's cluster must be a local CPU cluster: otherwise the measured times
    would re-rank plans meant for other hardware.
    """
    # a bad request is refused now, not by the worker later; checking it estimates no plan
    cluster = parse_tune_request(request).cluster
    if cluster.gpu.name != TRIAL_GPU or cluster.nodes != 1:
        raise ValidationError({"cluster": [
            f"trials run on this machine's local CPU ranks; give a one-node cluster with gpu '{TRIAL_GPU}' "
            f"(got {cluster.nodes} node(s) of {cluster.gpu.name}), or tune without trials"]})
    problem = tune_job_dataset_problem(owner, dataset)
    if problem:
        raise ValidationError({"dataset": [problem]})
    job = TuneJob.objects.create(owner=owner, request=request, dataset=dataset, trial_steps=trial_steps)
    enqueue(TaskName.TUNE_RUN, job.pk)
    return job


def tune_job_dataset_problem(owner, dataset) -> str:
    """Why the trials may not read ``dataset`` for ``owner``, or '' (checked when the job is queued and when it
    runs)."""
    if not dataset.is_visible_to(owner):
        return f"dataset {dataset.name!r} is not shared with {owner}: register a dataset of your own"
    problem = data_roots_for(dataset.owner).problem(dataset.path)
    return f"dataset {dataset.name!r}: {problem}" if problem else ""


def tune_job_progress(job_id: int, event: dict) -> None:
    """Record the latest progress event; counts of trials tried and of those that failed accumulate (a failed
    trial's reason is in its event, and in the result once the job is done)."""
    job = TuneJob.objects.get(pk=job_id)
    progress = dict(job.progress or {})
    if event.get("phase") == "trial":
        progress["trials_done"] = progress.get("trials_done", 0) + 1
        if event.get("failed"):
            progress["trials_failed"] = progress.get("trials_failed", 0) + 1
    progress["last"] = finite(event)
    TuneJob.objects.filter(pk=job_id).update(progress=progress)


def tune_job_start(job_id: int) -> TuneJob | None:
    with transaction.atomic():
        job = TuneJob.objects.select_for_update().get(pk=job_id)
        if job.status != TuneJob.Status.QUEUED:
            return None  # already taken (the task was delivered twice)
        job.status, job.started_at = TuneJob.Status.RUNNING, timezone.now()
        job.save()
        return job


def tune_job_finish(job_id: int, result: dict | None = None, error: str = "") -> None:
    TuneJob.objects.filter(pk=job_id).update(
        status=TuneJob.Status.FAILED if error else TuneJob.Status.COMPLETED, result=finite(result), error=error,
        finished_at=timezone.now())
