"""Tasks, each by its name in the registry (webapp.services.tasks.TaskName). Each takes ids, not objects, and is
safe to run twice."""
import platform
import time

from celery import shared_task
from django.db import connection
from django.utils import timezone

from webapp.services.tasks import TaskName

from . import calibrating, converting, deploying, evaluating, ingesting, launching, preparing, runs, tuning


@shared_task(name=TaskName.HEALTH.value)
def health() -> dict:
    """Proves a worker is consuming from the broker and can reach the database."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        database_ok = cursor.fetchone()[0] == 1
    return {"worker": platform.node(), "time": timezone.now().isoformat(), "database": database_ok,
            "database_vendor": connection.vendor, "database_name": str(connection.settings_dict["NAME"]),
            "monotonic": time.monotonic()}


@shared_task(name=TaskName.RUN_LAUNCH.value)
def launch(run_id: int) -> str:
    return launching.run_launch(run_id)


@shared_task(name=TaskName.RUN_STOP.value)
def stop(run_id: int) -> None:
    runs.run_stop(run_id)


@shared_task(name=TaskName.RUNS_RECONCILE.value)
def reconcile() -> dict:
    """Every few seconds (beat): one pass over the active runs (one scheduler call per cluster), launches that wait.
    The one writer of a run's status from what its job and its folder say."""
    report = runs.reconcile_pass()
    return {"runs": report.runs, "scheduler_calls": report.scheduler_calls,
            "settled": {str(k): v for k, v in report.settled.items()}, "ingest_requested": report.ingest_requested}


@shared_task(name=TaskName.RUNS_INGEST.value)
def ingest(run_ids: list[int]) -> int:
    """Read these runs' folders in (metrics, events, checkpoints, profiles); sent by reconcile for grown folders."""
    return ingesting.ingest_runs(run_ids)


@shared_task(name=TaskName.CALIBRATION_REFIT.value)
def calibration_refit(cluster_id: int) -> dict:
    """Refit a cluster's step-time terms to its completed runs' records; sent when one of its runs completes."""
    return calibrating.calibration_refit(cluster_id)


@shared_task(name=TaskName.TUNE_RUN.value)
def tune_run(job_id: int) -> str:
    return tuning.tune_job_run(job_id)


@shared_task(name=TaskName.DEPLOYMENT_DEPLOY.value)
def deploy(deployment_id: int) -> str:
    """Export a pending deployment's checkpoint, load it on its Triton server and smoke-check it."""
    return deploying.deployment_deploy(deployment_id)


@shared_task(name=TaskName.DEPLOYMENT_UNDEPLOY.value)
def undeploy(deployment_id: int) -> str:
    """Unload a deployment's model from its Triton server."""
    return deploying.deployment_undeploy(deployment_id)


@shared_task(name=TaskName.CHECKPOINT_IMPORT_HF.value)
def import_hf(conversion_id: int) -> str:
    """Import a Hugging Face model folder as a checkpoint (python -m deploy import-hf, as a process)."""
    return converting.conversion_run(conversion_id)


@shared_task(name=TaskName.CHECKPOINT_EXPORT_HF.value)
def export_hf(conversion_id: int) -> str:
    """Export a checkpoint to the Hugging Face layout (python -m deploy export-hf, as a process)."""
    return converting.conversion_run(conversion_id)


@shared_task(name=TaskName.DATASET_PREPARE.value)
def prepare_dataset(preparation_id: int) -> str:
    """Prepare a dataset ahead of its runs (python -m trainer.data prepare, as a process)."""
    return preparing.preparation_run(preparation_id)


@shared_task(name=TaskName.EVALUATION_RUN.value)
def evaluate(evaluation_id: int) -> str:
    """Score a checkpoint on an evaluation set (python -m trainer.evaluate, as a process)."""
    return evaluating.evaluation_run(evaluation_id)
