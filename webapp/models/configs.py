"""What a run is made of: a model config, a parallelism plan, a cluster and a dataset.

Specs are stored as the contract's JSON (trainer.contract) and validated through it, so the database, the API, the
planner and the trainer agree on one definition.
"""
from pathlib import Path

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import models

from trainer.contract import ClusterSpec, DatasetSpec, ModelSpec, ParallelPlan, SpecError, check_plan

from ..spec_errors import spec_field_errors
from .ownership import Owned


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
        SLURM = "slurm", "Slurm"

    name = models.CharField(max_length=120, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.LOCAL)
    spec = models.JSONField(help_text="trainer.contract.ClusterSpec as JSON: nodes, GPUs per node, GPU, bandwidths")
    partition = models.CharField(max_length=120, blank=True)
    account = models.CharField(max_length=120, blank=True)
    qos = models.CharField(max_length=120, blank=True)
    time_limit = models.CharField(max_length=32, blank=True, help_text="Slurm time limit, e.g. 02:00:00 or 1-00:00:00")
    env_setup = models.TextField(blank=True, help_text="Shell lines run before the trainer (module load …, source …)")
    container_image = models.CharField(max_length=300, blank=True)
    runs_root = models.CharField(max_length=500, blank=True, help_text="Folder for run folders; empty: the default")
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
        if self.time_limit and not _is_slurm_time(self.time_limit):
            errors["time_limit"] = [f"{self.time_limit!r} is not a Slurm time: use MM, HH:MM:SS or D-HH:MM:SS"]
        if self.kind == self.Kind.LOCAL and any((self.partition, self.account, self.qos)):
            errors["kind"] = ["partition, account and QOS apply to Slurm clusters only"]
        if errors:
            raise ValidationError(errors)


def _is_slurm_time(value: str) -> bool:
    days, _, clock = value.rpartition("-")
    parts = clock.split(":")
    return (not days or days.isdigit()) and 1 <= len(parts) <= 3 and all(p.isdigit() for p in parts)


class ParallelismPlan(Owned):
    """A plan for one model on one cluster; it is checked against both (heads, layers, GPU count)."""

    name = models.CharField(max_length=120)
    description = models.TextField(blank=True)
    model_config = models.ForeignKey(ModelConfig, on_delete=models.PROTECT, related_name="plans")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="plans")
    spec = models.JSONField(help_text="trainer.contract.ParallelPlan as JSON")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="unique_plan_name_per_owner")]

    def __str__(self):
        return self.name

    def plan_spec(self) -> ParallelPlan:
        return ParallelPlan.from_dict(self.spec)

    def clean(self):
        try:
            plan = self.plan_spec()
        except SpecError as exc:
            raise ValidationError(_on_spec(exc)) from None
        self.spec = plan.to_dict()
        if self.model_config_id and self.cluster_id:
            problems = check_plan(self.model_config.model_spec(), plan, self.cluster.cluster_spec())
            if problems:
                raise ValidationError(_on_spec(SpecError(problems)))


class Dataset(Owned):
    name = models.CharField(max_length=120)
    description = models.TextField(blank=True)
    path = models.CharField(max_length=500, help_text="A text file or a folder of text files under a data root")
    tokenizer_vocab = models.PositiveIntegerField(default=0, help_text="0: the model's vocabulary size")
    val_fraction = models.FloatField(default=0.05)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="unique_dataset_name_per_owner")]

    def __str__(self):
        return self.name

    def dataset_spec(self) -> DatasetSpec:
        return DatasetSpec(path=self.path, tokenizer_vocab=self.tokenizer_vocab, val_fraction=self.val_fraction)

    def clean(self):
        try:
            self.dataset_spec().validate()
        except SpecError as exc:
            raise ValidationError(spec_field_errors(exc, lambda path: path or NON_FIELD_ERRORS)) from None
        roots = settings.WORKBENCH["DATA_ROOTS"]
        resolved = Path(self.path).resolve()
        if not any(resolved.is_relative_to(Path(root).resolve()) for root in roots):
            raise ValidationError({"path": [f"{self.path} is outside the data roots; put the data under one of: "
                                            + ", ".join(str(r) for r in roots)]})
        if not resolved.exists():
            raise ValidationError({"path": [f"{self.path} does not exist"]})
