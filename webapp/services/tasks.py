"""The workers' tasks by name, and sending work to them (the web side never imports the workers' code).

``TaskName`` is the one registry of task names: the workers declare their tasks with it (workers/tasks.py), the
web side and the workers send with it, the beat schedule names its tasks with it. Every name is in one namespace,
``workbench.``, then the area the task works on and its verb (``workbench.runs.launch``).

Tasks are sent after the surrounding transaction commits, so a worker never looks for a row that is not there yet.
"""
from enum import StrEnum, unique
from functools import lru_cache
from typing import Callable

from celery import Celery
from django.conf import settings
from django.db import transaction


@unique  # two members of one name would be one task under two spellings
class TaskName(StrEnum):
    HEALTH = "workbench.health"
    RUN_LAUNCH = "workbench.runs.launch"
    RUN_STOP = "workbench.runs.stop"
    RUNS_RECONCILE = "workbench.runs.reconcile"
    RUNS_INGEST = "workbench.runs.ingest"
    CALIBRATION_REFIT = "workbench.calibration.refit"
    TUNE_RUN = "workbench.tune.run"
    DEPLOYMENT_DEPLOY = "workbench.deployments.deploy"
    DEPLOYMENT_UNDEPLOY = "workbench.deployments.undeploy"
    CHECKPOINT_IMPORT_HF = "workbench.checkpoints.import_hf"
    CHECKPOINT_EXPORT_HF = "workbench.checkpoints.export_hf"
    DATASET_PREPARE = "workbench.datasets.prepare"
    EVALUATION_RUN = "workbench.evaluations.run"


def registered(task_name: str) -> TaskName:
    """``task_name`` as the registry has it; ValueError, naming the registry, for a name it does not hold (a worker
    drops a task of a name it does not know, and nothing tells the sender)."""
    try:
        return TaskName(task_name)
    except ValueError:
        raise ValueError(f"{task_name!r} is not a task name: send one of webapp.services.tasks.TaskName, or add "
                         f"the new task's name there first") from None


@lru_cache(maxsize=1)
def _client() -> Celery:
    return Celery("workbench-web", broker=settings.CELERY_BROKER_URL, backend=settings.CELERY_RESULT_BACKEND)


def enqueue(task_name: TaskName, *args, unsent: Callable[[], None] | None = None, **kwargs) -> None:
    """Send ``task_name`` with ``args`` once the current transaction (if any) has committed. ``unsent`` is called
    when the broker cannot be reached, before its error is raised."""
    name = registered(task_name).value

    def send() -> None:
        try:
            _client().send_task(name, args=args, kwargs=kwargs)
        except Exception:
            if unsent is not None:
                unsent()
            raise

    transaction.on_commit(send)
