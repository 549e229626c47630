"""What a run is made of: a model config, a parallelism plan, a cluster and a dataset.

Specs are stored as the contract's JSON (trainer.contract) and validated through it, so the database, the API, the
planner and the trainer agree on one definition.
"""
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import models
from django.db.models import Q

from trainer.contract import ClusterSpec, DatasetSpec, ModelSpec, ParallelPlan, SpecError, check_plan

from ..spec_errors import spec_field_errors
from .clusterfields import cluster_field_errors
from .dataroots import data_roots_for
from .ownership import Owned, OwnedQuerySet


def _on_spec(exc: SpecError) -> dict[str, list[str]]:
    """A contract error on a model's one ``spec`` field, its messages keeping the contract's dotted paths."""
    return spec_field_errors(exc, lambda path: "spec", with_path=True)


class ModelConfig(Owned):
    name = models.CharField(max_length=120)
    description = models.TextField(blank=True)
    spec = models.JSONField(help_text="trainer.contract.ModelSpec as JSON")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="unique_model_config_name_per_owner")]

    def __str__(self):
        return self.name

    def model_spec(self) -> ModelSpec:
        return ModelSpec.from_dict(self.spec)

    def clean(self):
        try:
            self.spec = self.model_spec().to_dict()
        except SpecError as exc:
            raise ValidationError(_on_spec(exc)) from None


class Cluster(models.Model):
    """Where runs execute. Managed by staff; every user can read it and launch onto it."""

    class Kind(models.TextChoices):
        LOCAL = "local", "Local torchrun"
        SLURM = "slurm", "Slurm (commands on a login node)"
        SLURM_REST = "slurm-rest", "Slurm (slurmrestd)"

    name = models.CharField(max_length=120, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.LOCAL)
    spec = models.JSONField(help_text="trainer.contract.ClusterSpec as JSON: nodes, GPUs per node, GPU, bandwidths")
    partition = models.CharField(max_length=120, blank=True)
    account = models.CharField(max_length=120, blank=True)
    qos = models.CharField(max_length=120, blank=True)
    time_limit = models.CharField(max_length=32, blank=True, help_text="Slurm time limit, e.g. 02:00:00 or 1-00:00:00")
    env_setup = models.JSONField(
        default=list, blank=True,
        help_text="Shell lines run before the trainer (module load …, source …), a JSON list of strings. Trusted "
                  "staff input: each line is written into the batch script verbatim, as a shell command")
    container_image = models.CharField(max_length=300, blank=True,
                                       help_text="An image reference: [registry[:port]/]name[:tag][@digest]")
    stop_before_limit_s = models.PositiveIntegerField(
        default=120, help_text="How long before the Slurm time limit the trainer is asked to save a checkpoint and "
                               "stop (the run is then requeued and resumes): room for a step and a checkpoint save. "
                               "At least a tenth of the limit is left to train")
    rest_url = models.URLField(blank=True, help_text="slurmrestd's address for slurm-rest clusters, e.g. "
                                                     "http://login1:6820; the token comes from SLURM_JWT")
    node_failures = models.JSONField(
        default=dict, blank=True, editable=False,
        help_text="How many times each node failed under a run's job, by node name (the scheduler's NODE_FAIL)")
    runs_root = models.CharField(max_length=500, blank=True,
                                 help_text="Folder for run folders, under one of WORKBENCH_RUNS_ROOTS; empty: the "
                                           "default")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def cluster_spec(self) -> ClusterSpec:
        return ClusterSpec.from_dict(self.spec)

    def clean(self):
        errors = {}
        try:
            self.spec = self.cluster_spec().to_dict()
        except SpecError as exc:
            errors.update(_on_spec(exc))
        errors.update(cluster_field_errors(self))
        if self.kind == self.Kind.LOCAL and any((self.partition, self.account, self.qos)):
            errors["kind"] = ["partition, account and QOS apply to Slurm clusters only"]
        if self.kind == self.Kind.SLURM_REST and not self.rest_url:
            errors["rest_url"] = ["a slurm-rest cluster needs slurmrestd's address, e.g. http://login1:6820"]
        if errors:
            raise ValidationError(errors)


class PlanQuerySet(OwnedQuerySet):
    def visible_to(self, user):
        """Plans are seen together with their model config: another user's shared plan only while its model config
        is visible to ``user`` as well. An owner always sees their own plans (to point them at another config or
        delete them); the plan shows its config's id, never its spec."""
        if user.is_staff:
            return self
        config_visible = Q(model_config__owner=user) | Q(model_config__shared=True)
        return self.filter(Q(owner=user) | (Q(shared=True) & config_visible))

    def usable_by(self, user):
        """Plans ``user`` may estimate or run: visible, and their model config visible too (what the estimate and
        the run's spec show)."""
        if user.is_staff:
            return self
        return self.visible_to(user).filter(Q(model_config__owner=user) | Q(model_config__shared=True))


class ParallelismPlan(Owned):
    """A plan for one model on one cluster; it is checked against both (heads, layers, GPU count)."""

    name = models.CharField(max_length=120)
    description = models.TextField(blank=True)
    model_config = models.ForeignKey(ModelConfig, on_delete=models.PROTECT, related_name="plans")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="plans")
    spec = models.JSONField(help_text="trainer.contract.ParallelPlan as JSON")

    objects = PlanQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="unique_plan_name_per_owner")]

    def __str__(self):
        return self.name

    def plan_spec(self) -> ParallelPlan:
        return ParallelPlan.from_dict(self.spec)

    def is_usable_by(self, user) -> bool:
        return user.is_staff or (self.is_visible_to(user) and self.model_config.is_visible_to(user))

    def clean(self):
        try:
            plan = self.plan_spec()
        except SpecError as exc:
            raise ValidationError(_on_spec(exc)) from None
        self.spec = plan.to_dict()
        if self.model_config_id:
            problem = sharing_problem(self.name, self.shared, self.model_config)
            if problem:
                raise ValidationError({"shared": [problem]})
        if self.model_config_id and self.cluster_id:
            problems = check_plan(self.model_config.model_spec(), plan, self.cluster.cluster_spec())
            if problems:
                raise ValidationError(_on_spec(SpecError(problems)))


def sharing_problem(plan_name: str, shared: bool, model_config: ModelConfig) -> str:
    """Why a plan may not be shared, or ''.

    Sharing a plan is refused while its model config is private, rather than sharing the config along with it: the
    config is its owner's (perhaps another user's), and making it public is their decision, taken where it shows.
    Every user who sees a plan can estimate and run it, which shows the model, so a shared plan needs a shared model.
    """
    if shared and not model_config.shared:
        return (f"plan {plan_name!r} cannot be shared while its model config {model_config.name!r} is private: "
                f"others could neither see nor run the plan without it; share the model config first, or keep the "
                f"plan private")
    return ""


class Dataset(Owned):
    name = models.CharField(max_length=120)
    description = models.TextField(blank=True)
    path = models.CharField(max_length=500, help_text="A text, JSONL (.gz, .zst), Parquet or Megatron .bin file, or a "
                                                      "folder of them, under a data root")
    tokenizer_vocab = models.PositiveIntegerField(default=0, help_text="0: the model's vocabulary size")
    val_fraction = models.FloatField(default=0.05)
    text_field = models.CharField(max_length=120, default="text",
                                  help_text="The JSONL key or Parquet column that holds each document's text")
    max_bad_fraction = models.FloatField(default=0.01, help_text="The share of JSONL or Parquet rows that may be "
                                                                  "unreadable (skipped and reported) before the "
                                                                  "source is refused")
    tokenizer = models.CharField(max_length=500, blank=True, default="",
                                 help_text="An existing tokenizer under a data root (a tokenizer.json, or a folder "
                                           "with one or with GPT-2's vocab.json and merges.txt); empty: train one")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="unique_dataset_name_per_owner")]

    def __str__(self):
        return self.name

    def dataset_spec(self) -> DatasetSpec:
        return DatasetSpec(path=self.path, tokenizer_vocab=self.tokenizer_vocab, val_fraction=self.val_fraction,
                           text_field=self.text_field, max_bad_fraction=self.max_bad_fraction,
                           tokenizer=self.tokenizer)

    def clean(self):
        try:
            self.dataset_spec().validate()
        except SpecError as exc:
            raise ValidationError(spec_field_errors(exc, lambda path: path or NON_FIELD_ERRORS)) from None
        if self.owner_id:
            self.check_path()
            problem = self.tokenizer and data_roots_for(self.owner).problem(self.tokenizer)
            if problem:
                raise ValidationError({"tokenizer": [problem]})

    def check_path(self, path: str | None = None) -> None:
        """ValidationError on ``path`` unless its owner may read it (trainer.contract.datapath's rules, with the
        owner's data roots); ``path`` defaults to the dataset's own, a run's stored copy of it is checked too."""
        problem = data_roots_for(self.owner).problem(self.path if path is None else path)
        if problem:
            raise ValidationError({"path": [problem]})
