"""Tuning with measured trials: checked here, run by a worker (the trials are real trainings on this machine)."""
from django.core.exceptions import ValidationError
from django.db import transaction

from trainer.planner.tune.api import parse_tune_request

from ..finite import finite
from ..models import TuneJob, data_roots_for
from .job_rows import job_claim, job_progress, job_settle
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


def tune_job_claim(job_id: int) -> TuneJob | None:
    """The job, now running under this delivery's claim; None when it is settled or gone."""
    return job_claim(TuneJob, job_id, "ranking the plans", related=("owner", "dataset"))


def tune_job_progress(job: TuneJob, event: dict) -> bool:
    """Record the latest progress event; counts of trials tried and of those that failed accumulate (a failed
    trial's reason is in its event, and in the result once the job is done). False when another delivery has
    claimed the job since."""
    progress = dict(TuneJob.objects.values_list("progress", flat=True).get(pk=job.pk) or {})
    if event.get("phase") == "trial":
        progress["trials_done"] = progress.get("trials_done", 0) + 1
        if event.get("failed"):
            progress["trials_failed"] = progress.get("trials_failed", 0) + 1
    progress["last"] = finite(event)
    said = f"{event.get('phase') or 'tuning'}: {progress.get('trials_done', 0)} trials done"
    return job_progress(job, said, progress=progress)


def tune_job_finish(job: TuneJob, result: dict | None = None, error: str = "") -> bool:
    """Done with the tune's result, or failed with the reason; False when another delivery has claimed it since."""
    if error:
        return job_settle(job, TuneJob.Status.FAILED, error)
    return job_settle(job, TuneJob.Status.DONE, "done", result or {})
