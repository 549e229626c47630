"""Tuning jobs with measured trials: the planner ranks, the trainer measures the best plans on local CPU ranks."""
import logging
import time
import traceback
from pathlib import Path

from django.conf import settings

from trainer.planner.estimate.api import model_from_json
from trainer.planner.tune.api import tune_json
from trainer.planner.tune.measure import LocalTrials
from webapp import services
from webapp.models import TuneJob

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 0.5  # enumeration reports often; the database needs to hear of it only a few times a second


class Superseded(Exception):
    """Another delivery of the task claimed the job: this one stops."""


def _progress_writer(job: TuneJob):
    last = {"time": 0.0, "phase": None}

    def write(event: dict) -> None:
        if event.get("failed"):  # the tune goes on; the worker's log says why this trial gave no time
            log.warning("tune job %s: a trial failed: %s", job.pk, event["failed"])
        now = time.monotonic()
        if event.get("phase") in ("trial", "done") or event.get("phase") != last["phase"] \
                or now - last["time"] >= PROGRESS_EVERY_S:
            if not services.tune_job_progress(job, event):
                raise Superseded
            last.update(time=now, phase=event.get("phase"))
    return write


def _measurable(request: dict) -> dict:
    """Trials search the native engine unless the request names engines: a DeepSpeed trial spends seconds in
    deepspeed.initialize before its first step, which would swamp the few steps a trial times."""
    space = dict(request.get("space") or {})
    space.setdefault("engines", ["native"])
    return {**request, "space": space}


def tune_job_run(job_id: int) -> str:
    """Run a queued tuning job. A trial that fails is recorded in the result with its reason and the job goes on;
    when every trial fails the job still completes, with the estimates' ranking, ``trials.best`` None and a note
    "all N trials failed: …" — the ranking stands without trials, and the reasons say what to fix before measuring
    again. The job fails only when the tune itself cannot run (a bad request, an unreadable dataset)."""
    job = services.tune_job_claim(job_id)
    if job is None:
        return "settled"
    problem = services.tune_job_dataset_problem(job.owner, job.dataset)
    if problem:  # sharing withdrawn, or the file changed, since the job was queued
        services.tune_job_finish(job, error=f"the trials cannot read their dataset: {problem}")
        return TuneJob.Status.FAILED
    try:
        root = Path(settings.WORKBENCH["RUNS_ROOT"]) / f"tune-{job.pk}"
        dataset = job.dataset.dataset_spec().replace(prepared_dir=str(root / "data"))
        steps = job.trial_steps
        measure = LocalTrials(model_from_json(job.request["model"]), dataset, root, steps=steps,
                              warmup=min(5, steps // 2))  # the first steps pay for start-up, not the plan
        result = tune_json(_measurable(job.request), measure=measure, progress=_progress_writer(job))
    except Superseded:
        return "superseded"
    except Exception as exc:  # the job records any failure for its owner; the worker carries on
        log.exception("tune job %s failed", job_id)
        services.tune_job_finish(job, error=f"{exc}\n\n{traceback.format_exc(limit=5)}")
        return TuneJob.Status.FAILED
    services.tune_job_finish(job, result=result)
    return TuneJob.Status.DONE
