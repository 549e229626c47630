"""Creating, queueing and cancelling runs; the RunSpec a run is launched with."""
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from trainer.contract import OptimizerSpec, ProfileSpec, RunSpec, SpecError

from ..models import Run, RunStatus
from ..spec_errors import spec_field_errors
from .tasks import enqueue

LAUNCH_TASK = "workbench.runs.launch"
STOP_TASK = "workbench.runs.stop"


def run_folder(run: Run) -> Path:
    root = Path(run.cluster.runs_root) if run.cluster.runs_root else Path(settings.WORKBENCH["RUNS_ROOT"])
    return root / str(run.pk)


def run_spec(run: Run) -> RunSpec:
    """The whole contract for ``run``, checked: every part and the plan against its model and cluster."""
    return RunSpec(
        name=run.name,
        model=run.model_config.model_spec(),
        plan=run.plan.plan_spec(),
        cluster=run.cluster.cluster_spec(),
        dataset=run.dataset.dataset_spec(),
        output_dir=run.run_dir or str(run_folder(run)),
        steps=run.steps,
        seed=run.seed,
        checkpoint_every=run.checkpoint_every,
        eval_every=run.eval_every,
        optimizer=OptimizerSpec.from_dict(run.optimizer or {}),
        profile=ProfileSpec.from_dict(run.profile) if run.profile else None,
    ).validate()


def _run_part(path: str) -> str:
    """A run's spec error lands on the part its path starts with (plan.tp → plan)."""
    return path.split(".")[0] or "plan"


@transaction.atomic
def run_create(*, owner, plan, dataset, launch: bool = False, **fields) -> Run:
    """Create a draft run of ``plan`` on ``dataset`` (model and cluster come from the plan); queue it if asked."""
    run = Run(owner=owner, plan=plan, model_config=plan.model_config, cluster=plan.cluster, dataset=dataset, **fields)
    run.full_clean(exclude=["run_dir"])
    try:
        run_spec(run)
    except SpecError as exc:
        raise ValidationError(spec_field_errors(exc, _run_part, with_path=True)) from None
    run.save()
    run.run_dir = str(run_folder(run))
    run.save(update_fields=["run_dir"])
    if launch:
        run = run_queue(run)
    return run


@transaction.atomic
def run_queue(run: Run) -> Run:
    """draft (or failed with attempts left) → queued; the launch task is sent when this commits."""
    run = Run.objects.select_for_update().get(pk=run.pk)
    if run.status == RunStatus.FAILED and run.attempts >= run.max_attempts:
        raise ValidationError(f"run {run.pk} has used all {run.max_attempts} attempts")
    run.transition(RunStatus.QUEUED)
    run.save()
    enqueue(LAUNCH_TASK, run.pk)
    return run


@transaction.atomic
def run_cancel(run: Run, reason: str = "cancelled by user") -> Run:
    """Cancel a run that has not finished; a submitted or running job is stopped by a worker after commit."""
    run = Run.objects.select_for_update().get(pk=run.pk)
    if run.is_finished:
        raise ValidationError(f"run {run.pk} is already {run.status}")
    had_job = run.status in (RunStatus.SUBMITTED, RunStatus.RUNNING)
    run.transition(RunStatus.CANCELLED, reason)
    run.save()
    if had_job:
        enqueue(STOP_TASK, run.pk)
    return run
