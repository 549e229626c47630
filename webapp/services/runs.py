"""Creating, queueing and cancelling runs; the RunSpec a run is made of and launched with."""
import re
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from trainer.contract import (BlendSource, ClusterSpec, InitFrom, ModelSpec, OptimizerSpec, ParallelPlan, ProfileSpec,
                              RunSpec, SpecError)
from trainer.contract.manifest import model_differences, read_manifest

from ..models import Dataset, Run, RunStatus, data_roots_for
from ..spec_errors import spec_field_errors
from .history import Source, record_event
from .run_estimates import spec_estimate
from .tasks import TaskName, enqueue


def runs_root(cluster) -> Path:
    return Path(cluster.runs_root) if cluster.runs_root else Path(settings.WORKBENCH["RUNS_ROOT"])


def run_folder(run: Run) -> Path:
    return runs_root(run.cluster) / str(run.pk)


def _part(prefix: str, spec_class, data: dict):
    """One part of a run's spec from its JSON, its errors under the part's name as RunSpec would name them."""
    try:
        return spec_class.from_dict(data)
    except SpecError as exc:
        raise exc.prefixed(prefix) from None


def _run_part(path: str) -> str:
    """A run's spec error lands on the part its path starts with (plan.tp → plan, blend[1].weight → blend)."""
    return path.split(".")[0].split("[")[0] or "plan"


def run_access_problems(run: Run) -> dict[str, list[str]]:
    """What of its parts the run's owner may not use (any more): ``{field: [messages]}``, empty when all is well.

    Checked when a run is created, each time it is queued (launch, retry, resume) and by the worker right before
    it starts the job: sharing can be withdrawn and a dataset's file can change in between. The plan and the model
    config it was made of must be visible to the owner, the dataset too, and the dataset's path (the copy in the
    run's spec, which is what the trainer will read) must still pass the data-path rules for the dataset's owner,
    who registered it.
    """
    owner, problems = run.owner, {}
    if not run.plan.is_visible_to(owner):
        problems["plan"] = [f"plan {run.plan.name!r} is not shared with {owner}: ask its owner to share it (again), "
                            f"or make a plan of your own"]
    elif not run.model_config.is_visible_to(owner):
        problems["plan"] = [f"model config {run.model_config.name!r} of plan {run.plan.name!r} is not shared with "
                            f"{owner}: ask its owner to share it, or make a plan on a model config of your own"]
    if not run.dataset.is_visible_to(owner):
        problems["dataset"] = [f"dataset {run.dataset.name!r} is not shared with {owner}: ask its owner to share "
                               f"it (again), or register a dataset of your own"]
    else:
        path = (run.spec or {}).get("dataset", {}).get("path", run.dataset.path)
        problem = data_roots_for(run.dataset.owner).problem(path)
        if problem:
            problems["dataset"] = [f"dataset {run.dataset.name!r}: {problem}"]
    stored = {source.get("name"): source.get("dataset", {}).get("path") for source in (run.spec or {}).get("blend", [])}
    for item, dataset in blend_datasets(run):
        if dataset is None:
            continue  # the spec is made of the datasets that exist: run_check says which is missing
        if not dataset.is_visible_to(owner):
            problems.setdefault("blend", []).append(f"dataset {dataset.name!r} of the blend is not shared with "
                                                    f"{owner}: ask its owner to share it, or leave it out")
            continue
        path = stored.get(source_name(item, dataset), dataset.path)
        problem = data_roots_for(dataset.owner).problem(path)
        if problem:
            problems.setdefault("blend", []).append(f"dataset {dataset.name!r} of the blend: {problem}")
    if run.init_from_id is not None and not run.init_from.is_visible_to(owner):
        problems["init_from"] = [f"checkpoint {run.init_from_id} is not visible to {owner}: start from a checkpoint "
                                 f"of a run you may see, or one you imported"]
    return problems


def _init_from(run: Run, model: ModelSpec) -> InitFrom | None:
    """The run's starting checkpoint as the trainer reads it (its folder), refused when its model is another."""
    if run.init_from_id is None:
        return None
    checkpoint = run.init_from
    saved = (checkpoint.manifest or {}).get("model")
    if not isinstance(saved, dict):
        raise ValidationError({"init_from": [f"checkpoint {checkpoint.pk} has no model in its manifest: it cannot be "
                                             f"started from"]})
    try:
        differ = model_differences(saved, model)
    except (SpecError, TypeError, AttributeError) as exc:
        raise ValidationError({"init_from": [f"checkpoint {checkpoint.pk}'s model is not valid: {exc}"]}) from None
    if differ:
        theirs = ModelSpec.from_dict(saved, validate=False)
        detail = ", ".join(f"{k} {getattr(theirs, k)!r} ≠ {getattr(model, k)!r}" for k in differ)
        raise ValidationError({"init_from": [
            f"checkpoint {checkpoint.pk}'s model differs from the plan's model config in {', '.join(differ)} "
            f"(checkpoint ≠ run: {detail}): use a model config with the checkpoint's model "
            f"(GET /api/checkpoints/{checkpoint.pk}/ shows it under manifest.model)"]})
    if run.keep_tokenizer and not (checkpoint.manifest or {}).get("tokenizer"):
        raise ValidationError({"keep_tokenizer": [f"checkpoint {checkpoint.pk} records no tokenizer to keep: set "
                                                  f"keep_tokenizer to false to train one on the dataset"]})
    if read_manifest(checkpoint.path) is None:
        raise ValidationError({"init_from": [f"checkpoint {checkpoint.pk}'s folder {checkpoint.path} no longer holds "
                                             f"a complete checkpoint (pruned or moved): start from another one"]})
    return InitFrom(checkpoint=checkpoint.path, keep_tokenizer=run.keep_tokenizer)


def run_check(run: Run) -> RunSpec:
    """The RunSpec ``run`` is made of, checked: every part, and the plan against its model and cluster.

    Raises ValidationError on the part each problem is in. A run not yet saved has no folder (it is named after
    the id), so its runs root stands in for the output folder, which is checked only for being given.
    """
    try:
        spec = RunSpec(
            name=run.name,
            model=_part("model", ModelSpec, run.model_config.spec),
            plan=_part("plan", ParallelPlan, run.plan.spec),
            cluster=_part("cluster", ClusterSpec, run.cluster.spec),
            dataset=run.dataset.dataset_spec(),
            blend=_blend(run),
            dataset_weight=run.dataset_weight,
            output_dir=run.run_dir or str(runs_root(run.cluster)),
            steps=run.steps,
            seed=run.seed,
            checkpoint_every=run.checkpoint_every,
            eval_every=run.eval_every,
            spike_factor=run.spike_factor,
            optimizer=_part("optimizer", OptimizerSpec, run.optimizer or {}),
            profile=_part("profile", ProfileSpec, run.profile) if run.profile else None,
        ).validate()
    except SpecError as exc:
        raise ValidationError(spec_field_errors(exc, _run_part, with_path=True)) from None
    init_from = _init_from(run, spec.model)
    return spec if init_from is None else spec.replace(init_from=init_from)


def blend_datasets(run: Run) -> list[tuple[dict, Dataset | None]]:
    """Each source of the run's blend beside its dataset (None: no such dataset any more)."""
    items = [item for item in run.blend or [] if isinstance(item, dict)]
    found = Dataset.objects.in_bulk([item.get("dataset") for item in items if isinstance(item.get("dataset"), int)])
    return [(item, found.get(item.get("dataset"))) for item in items]


# A blend source's name ends up in a series' name ("val_loss:<name>") and in a URL's query
SOURCE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NOT_IN_SOURCE_NAMES = re.compile(r"[^A-Za-z0-9_.-]+")


def default_source_name(dataset: Dataset) -> str:
    """A blend source's name when it is not given one: its dataset's, in letters, digits, '.', '_' and '-'."""
    return NOT_IN_SOURCE_NAMES.sub("-", dataset.name).strip("-")[:64] or f"dataset-{dataset.pk}"


def source_name(item: dict, dataset: Dataset) -> str:
    """A blend source's name: its own, or its dataset's."""
    return str(item.get("name") or default_source_name(dataset))[:64]


def _blend(run: Run) -> tuple[BlendSource, ...]:
    """The run's blend as the trainer reads it."""
    sources, missing = [], []
    for item, dataset in blend_datasets(run):
        if dataset is None:
            missing.append(str(item.get("dataset")))
            continue
        sources.append(BlendSource(name=source_name(item, dataset), dataset=dataset.dataset_spec(),
                                   weight=float(item.get("weight", 1.0))))
    if missing:
        raise ValidationError({"blend": [f"no dataset {', '.join(missing)}: register it, or leave it out of the "
                                         f"blend"]})
    return tuple(sources)


@transaction.atomic
def run_create(*, owner, plan, dataset, launch: bool = False, **fields) -> Run:
    """Create a draft run of ``plan`` on ``dataset`` (model and cluster come from the plan); queue it if asked.

    The checked RunSpec is stored on the run: every attempt launches with it, whatever happens to its parts later;
    so is the planner's estimate for it (webapp.services.run_estimates).
    """
    evaluation_sets = fields.pop("evaluation_sets", ())
    run = Run(owner=owner, plan=plan, model_config=plan.model_config, cluster=plan.cluster, dataset=dataset, **fields)
    run.full_clean(exclude=["run_dir", "spec"])
    problems = run_access_problems(run)
    if problems:
        raise ValidationError(problems)
    spec = run_check(run)
    # Made once from the checked spec, which never changes; a spec the planner cannot estimate keeps the reason
    # instead, and the run is created all the same.
    run.estimate = spec_estimate(spec.to_dict(), run.cluster)
    run.save()
    run.run_dir = str(run_folder(run))
    run.spec = spec.replace(output_dir=run.run_dir).to_dict()
    run.save(update_fields=["run_dir", "spec"])
    run.evaluation_sets.set(evaluation_sets)  # each checkpoint saved is evaluated on them (services.ingest)
    if launch:
        run = run_queue(run)
    return run


def _queued_why(run: Run, was: str) -> str:
    if was == RunStatus.FAILED:
        return f"restart {run.restarts} of {run.max_restarts}: queued to resume from its newest checkpoint"
    if was == RunStatus.CANCELLED:
        return "resumed: queued to go on from its newest checkpoint"
    return "queued for launch"


@transaction.atomic
def run_queue(run: Run) -> Run:
    """draft, failed with restarts left (one is used) or cancelled (resumed, no restart used) → queued; the launch
    task is sent when this commits, and a run whose folder holds a checkpoint goes on from its newest one.

    Raises ValidationError if the run may not be queued: no restarts left, a cancelled run's job not yet seen to
    end (its stop is still under way), or its owner may no longer use its parts.
    """
    run = Run.objects.select_for_update().get(pk=run.pk)
    was = run.status
    if was == RunStatus.FAILED and run.restarts >= run.max_restarts:
        raise ValidationError(f"run {run.pk} has used all {run.max_restarts} restarts: raise max_restarts to try "
                              f"again")
    if was == RunStatus.CANCELLED and run.job_id and not run.ingest_state.get("job_ended"):
        raise ValidationError(f"run {run.pk}'s job {run.job_id} is still stopping: resume the run once it has "
                              f"ended (a few seconds; the run's events say when)")
    problems = run_access_problems(run)
    if problems:
        raise ValidationError(problems)
    if was == RunStatus.FAILED:
        run.restarts += 1
    why = _queued_why(run, was)
    run.transition(RunStatus.QUEUED, why)
    run.save()
    record_event(run, Source.WORKBENCH, "queued", why)
    launch_send([run.pk])
    return run


def launch_send(run_ids: list[int]) -> None:
    """Send the launch task for each of these runs, noting when (``Run.launch_sent_at``, cleared by the worker that
    takes it), so that a run whose task still waits in the queue is not sent another. Where the broker cannot be
    reached the notes are taken back, so that the next reconcile pass sends them again."""
    now = timezone.now()
    marked = Run.objects.filter(pk__in=run_ids)
    marked.update(launch_sent_at=now)

    def unsent() -> None:
        marked.filter(launch_sent_at=now).update(launch_sent_at=None)

    for run_id in run_ids:
        enqueue(TaskName.RUN_LAUNCH, run_id, unsent=unsent)


@transaction.atomic
def run_cancel(run: Run, reason: str = "cancelled by user") -> Run:
    """Cancel a run that has not finished; a submitted or running job is stopped by a worker after commit."""
    run = Run.objects.select_for_update().get(pk=run.pk)
    if run.is_finished:
        raise ValidationError(f"run {run.pk} is already {run.status}")
    had_job = run.status in (RunStatus.SUBMITTED, RunStatus.RUNNING)
    run.transition(RunStatus.CANCELLED, reason)
    run.save()
    record_event(run, Source.WORKBENCH, "cancelled", reason)
    if had_job:
        enqueue(TaskName.RUN_STOP, run.pk)
    return run
