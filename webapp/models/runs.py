"""A training run and what it produced: metrics, checkpoints and profiles (ingested from its run folder)."""
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from trainer.contract import RunSpec, SpecError

from .configs import Cluster, Dataset, ModelConfig, ParallelismPlan
from .ownership import Owned


class RunStatus(models.TextChoices):
    DRAFT = "draft"
    QUEUED = "queued"
    SUBMITTED = "submitted"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


# Which status may follow which. A failed attempt may be retried (failed → queued) while restarts remain, and a
# cancelled run resumed (cancelled → queued) once its job has ended; a job stopped for its time limit or preempted
# is requeued, also one stopped before its trainer started (submitted).
TRANSITIONS: dict[str, set[str]] = {
    RunStatus.DRAFT: {RunStatus.QUEUED, RunStatus.CANCELLED},
    RunStatus.QUEUED: {RunStatus.SUBMITTED, RunStatus.FAILED, RunStatus.CANCELLED},
    RunStatus.SUBMITTED: {RunStatus.RUNNING, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED,
                          RunStatus.QUEUED},
    RunStatus.RUNNING: {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.QUEUED},
    RunStatus.FAILED: {RunStatus.QUEUED},
    RunStatus.COMPLETED: set(),
    RunStatus.CANCELLED: {RunStatus.QUEUED},
}
FINISHED = {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}


class IllegalTransition(ValidationError):
    pass


class Run(Owned):
    name = models.CharField(max_length=120)
    model_config = models.ForeignKey(ModelConfig, on_delete=models.PROTECT, related_name="runs")
    plan = models.ForeignKey(ParallelismPlan, on_delete=models.PROTECT, related_name="runs")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="runs")
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="runs")
    steps = models.PositiveIntegerField(default=100)
    seed = models.PositiveIntegerField(default=1234)
    checkpoint_every = models.PositiveIntegerField(default=0)
    eval_every = models.PositiveIntegerField(default=0)
    # A blend: other datasets trained on beside ``dataset``, each drawn by its weight against ``dataset_weight``
    # (trainer.contract.BlendSource); each one's validation loss is charted under its name.
    blend = models.JSONField(default=list, blank=True,
                             help_text='Other datasets trained on beside the run\'s own: [{"dataset": id, "weight": w, '
                                       '"name": "…"}]; empty: the run\'s dataset alone')
    dataset_weight = models.FloatField(default=1.0, help_text="The run's own dataset's weight in its blend")
    replan_on_oom = models.BooleanField(
        default=True, help_text="When a job runs out of memory, let the planner choose the next plan that needs "
                                "less (a smaller micro-batch, more recompute; the same layout and global batch) and "
                                "go on from the newest checkpoint; off: the run fails")
    spike_factor = models.FloatField(
        default=3.0, help_text="A step whose loss is above this many times the median of the steps before it (or "
                               "not finite) is a spike: the run goes back to its newest checkpoint and skips the "
                               "batches from there to the spike. 0: only a loss that is not finite is one")
    evaluation_sets = models.ManyToManyField("EvaluationSet", blank=True, related_name="runs",
                                             help_text="Sets each checkpoint the run saves is evaluated on")
    optimizer = models.JSONField(default=dict, blank=True, help_text="trainer.contract.OptimizerSpec as JSON")
    profile = models.JSONField(null=True, blank=True, help_text="trainer.contract.ProfileSpec as JSON, or empty")
    # Checked and stored when the run is created; every attempt launches with it, so editing the plan, model,
    # cluster or dataset later never changes a run that exists.
    spec = models.JSONField(null=True, blank=True, editable=False,
                            help_text="trainer.contract.RunSpec as JSON: what every attempt launches with")
    # Made from the stored spec once, when the run is created: the spec never changes, so neither does the estimate,
    # and a page or an API call reading it costs no planner time (webapp.services.run_estimates).
    estimate = models.JSONField(default=dict, blank=True, editable=False,
                                help_text="The planner's estimate for the stored spec at default options, or "
                                          "{\"error\": why there is none}; empty until first made")

    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.DRAFT, db_index=True)
    attempts = models.PositiveIntegerField(default=0, help_text="Jobs submitted for the run, all reasons")
    restarts = models.PositiveIntegerField(default=0, help_text="Attempts started again after a failed job")
    max_restarts = models.PositiveIntegerField(
        default=2, help_text="How many times a failed job (a killed rank, a lost node) is started again from the "
                             "newest checkpoint; a time limit or preemption requeues without using one")
    run_dir = models.CharField(max_length=500, blank=True)
    job_id = models.CharField(max_length=64, blank=True, help_text="Slurm job id or local process id")
    status_message = models.TextField(blank=True)
    last_step = models.PositiveIntegerField(default=0)
    ingest_state = models.JSONField(default=dict, blank=True, editable=False,
                                    help_text="How far the run folder's files have been read")
    queued_at = models.DateTimeField(null=True, blank=True)
    launching_since = models.DateTimeField(null=True, blank=True, editable=False,
                                           help_text="When a worker claimed the run to start its job; empty otherwise")
    launch_sent_at = models.DateTimeField(null=True, blank=True, editable=False,
                                          help_text="When a launch task was sent for the run that no worker has taken "
                                                    "yet; empty otherwise")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Lineage: the checkpoint whose weights the run started from at step 0 (RunSpec.init_from; its folder is in the
    # stored spec, so a checkpoint taken off the record later leaves the run launchable and this empty).
    init_from = models.ForeignKey("Checkpoint", on_delete=models.SET_NULL, null=True, blank=True,
                                  related_name="started_runs",
                                  help_text="The checkpoint whose weights the run starts from; empty: fresh weights")
    keep_tokenizer = models.BooleanField(default=True, help_text="With init_from: tokenize the dataset with the "
                                                                 "checkpoint's tokenizer instead of training one")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["owner", "status"])]

    def __str__(self):
        return f"{self.name} ({self.status})"

    def run_spec(self) -> RunSpec:
        if self.spec is None:
            raise SpecError.single("", f"run {self.pk} has no stored spec (it predates stored specs and its parts "
                                       "no longer make a valid one); create the run again")
        return RunSpec.from_dict(self.spec)

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED

    def can_transition(self, to: str) -> bool:
        return to in TRANSITIONS[self.status]

    def transition(self, to: str, message: str = "") -> None:
        """Move to status ``to`` (not saved), stamping the time it happened. ``message`` says why, in words, and
        replaces the former status's: a message that explained the former status would be stale beside this one."""
        if not self.can_transition(to):
            raise IllegalTransition(f"a {self.status} run cannot become {to}")
        now = timezone.now()
        if to == RunStatus.QUEUED:
            self.queued_at = now
        elif to == RunStatus.RUNNING and not self.started_at:
            self.started_at = now
        elif to in FINISHED:
            self.finished_at = now
        self.status = to
        self.status_message = message

    def clean(self):
        errors = {}
        if self.plan_id and self.model_config_id and self.plan.model_config_id != self.model_config_id:
            errors["plan"] = [f"plan {self.plan.name!r} is for model config {self.plan.model_config.name!r}, "
                              f"not {self.model_config.name!r}"]
        if self.plan_id and self.cluster_id and self.plan.cluster_id != self.cluster_id:
            errors["plan"] = [f"plan {self.plan.name!r} is for cluster {self.plan.cluster.name!r}, "
                              f"not {self.cluster.name!r}"]
        if errors:
            raise ValidationError(errors)


class Metric(models.Model):
    """One record of metrics.jsonl: a training step ('train') or a validation pass ('val')."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metrics")
    kind = models.CharField(max_length=16, default="train")
    step = models.PositiveIntegerField()
    loss = models.FloatField(null=True, blank=True)
    values = models.JSONField(default=dict)
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "kind", "step"]
        constraints = [models.UniqueConstraint(fields=["run", "kind", "step"], name="unique_metric_per_step")]


class CheckpointQuerySet(models.QuerySet):
    def visible_to(self, user):
        """A trained checkpoint is seen with its run (its owner's, or shared); an imported one by its owner alone."""
        if user.is_staff:
            return self
        return self.filter(Q(run__in=Run.objects.visible_to(user)) | Q(owner=user))


class Checkpoint(models.Model):
    """Weights a run saved (``run`` set, ingested from its folder), or a checkpoint folder a user registered from
    elsewhere (``run`` empty, ``owner`` set: an import, e.g. of Hugging Face weights by ``python -m deploy
    import-hf``). Whose it is follows from that: the run's owner, or the importing user."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints", null=True, blank=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True,
                              blank=True, help_text="Who registered an imported checkpoint; empty for a run's")
    name = models.CharField(max_length=120, blank=True, help_text="An imported checkpoint's name")
    step = models.PositiveIntegerField()
    path = models.CharField(max_length=500)
    tokens_seen = models.BigIntegerField(default=0)
    size_bytes = models.BigIntegerField(default=0)
    manifest = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)
    imported_from = models.CharField(max_length=500, blank=True,
                                     help_text="Lineage of an import: the Hugging Face model folder it was made from")
    hf_export_path = models.CharField(max_length=500, blank=True,
                                      help_text="Where its latest export to the Hugging Face layout lies")

    objects = CheckpointQuerySet.as_manager()

    class Meta:
        ordering = ["run", "-step", "id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "step"], name="unique_checkpoint_per_step"),
            # registering the same folder twice finds the first registration instead of making a second
            models.UniqueConstraint(fields=["owner", "path"], condition=Q(run__isnull=True),
                                    name="unique_imported_checkpoint_per_owner"),
            models.CheckConstraint(condition=Q(run__isnull=False) | Q(owner__isnull=False),
                                   name="checkpoint_of_a_run_or_an_owner"),
        ]

    def __str__(self):
        if self.run_id is None:
            return f"{self.name or self.path} (imported)"
        return f"{self.run.name} step {self.step}"

    @property
    def source(self) -> str:
        return "trained" if self.run_id is not None else "imported"

    @property
    def owner_user(self):
        """Whose weights these are: the run's owner, or the user who imported them."""
        return self.run.owner if self.run_id is not None else self.owner

    def is_visible_to(self, user) -> bool:
        if self.run_id is not None:
            return self.run.is_visible_to(user)
        return user.is_staff or self.owner_id == user.pk


class Profile(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="profiles")
    name = models.CharField(max_length=120)
    path = models.CharField(max_length=500)
    summary = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "name"]
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="unique_profile_name_per_run")]
