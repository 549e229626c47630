"""REST representations. Validation goes through the contract (trainer.contract) so the API, admin and trainer agree."""
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from trainer.contract import presets
from trainer.contract import (ClusterSpec, ModelSpec, OptimizerSpec, ParallelPlan, ProfileSpec, RunSpec, SpecError,
                              check_plan)

from .. import models, services
from ..spec_errors import spec_field_errors
from .specfields import api_field, spec_field


def _django_errors(exc: DjangoValidationError) -> serializers.ValidationError:
    return serializers.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)


class OwnedSerializer(serializers.ModelSerializer):
    """Owner is the requesting user; names are unique per owner (checked here so a clash is a 400, not a 500)."""

    owner = serializers.ReadOnlyField(source="owner.username")
    unique_names = True

    def validate_name(self, value):
        if not self.unique_names:
            return value
        user = self.context["request"].user
        clash = self.Meta.model.objects.filter(owner=user, name=value)
        if self.instance is not None:
            clash = clash.exclude(pk=self.instance.pk)
        if clash.exists():
            raise serializers.ValidationError(f"you already have a {self.Meta.model._meta.verbose_name} named {value!r}")
        return value

    def create(self, validated_data):
        validated_data["owner"] = self.context["request"].user
        return super().create(validated_data)


class VisibleRelatedField(serializers.PrimaryKeyRelatedField):
    """A foreign key limited to the objects the requesting user may see."""

    def get_queryset(self):
        return super().get_queryset().visible_to(self.context["request"].user)


class ModelConfigSerializer(OwnedSerializer):
    spec = spec_field(ModelSpec)(required=False, help_text="The model; or give `preset` instead")
    preset = serializers.ChoiceField(choices=sorted(presets.MODELS), write_only=True, required=False,
                                     help_text="Fill `spec` from a named preset")

    class Meta:
        model = models.ModelConfig
        fields = ["id", "name", "description", "spec", "preset", "shared", "owner", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def validate(self, attrs):
        preset = attrs.pop("preset", None)
        if preset and "spec" in attrs:
            raise serializers.ValidationError({"preset": ["give either spec or preset, not both"]})
        if preset:
            attrs["spec"] = presets.MODELS[preset].to_dict()
        if "spec" not in attrs and self.instance is None:
            raise serializers.ValidationError({"spec": ["give the model spec, or a preset name"]})
        return attrs


class ClusterSerializer(serializers.ModelSerializer):
    spec = spec_field(ClusterSpec)()

    class Meta:
        model = models.Cluster
        fields = ["id", "name", "kind", "spec", "partition", "account", "qos", "time_limit", "env_setup",
                  "container_image", "runs_root", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def validate(self, attrs):
        instance = models.Cluster(**{**self._current(), **attrs})
        try:
            instance.clean()
        except DjangoValidationError as exc:
            raise _django_errors(exc) from None
        return attrs

    def _current(self) -> dict:
        if self.instance is None:
            return {}
        return {f: getattr(self.instance, f) for f in ("name", "kind", "spec", "partition", "account", "qos",
                                                        "time_limit", "env_setup", "container_image", "runs_root")}


class ParallelismPlanSerializer(OwnedSerializer):
    spec = spec_field(ParallelPlan)()
    model_config = VisibleRelatedField(queryset=models.ModelConfig.objects.all())
    cluster = serializers.PrimaryKeyRelatedField(queryset=models.Cluster.objects.all())
    grad_accum = serializers.SerializerMethodField()
    world_size = serializers.SerializerMethodField()

    class Meta:
        model = models.ParallelismPlan
        fields = ["id", "name", "description", "model_config", "cluster", "spec", "grad_accum", "world_size",
                  "shared", "owner", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def get_grad_accum(self, obj) -> int:
        return obj.plan_spec().grad_accum

    def get_world_size(self, obj) -> int:
        return obj.plan_spec().world_size

    def validate(self, attrs):
        model_config = attrs.get("model_config") or self.instance.model_config
        cluster = attrs.get("cluster") or self.instance.cluster
        plan = ParallelPlan.from_dict(attrs.get("spec") or self.instance.spec)
        problems = check_plan(model_config.model_spec(), plan, cluster.cluster_spec())
        if problems:
            raise serializers.ValidationError({"spec": spec_field_errors(SpecError(problems), api_field)})
        return attrs


class DatasetSerializer(OwnedSerializer):
    class Meta:
        model = models.Dataset
        fields = ["id", "name", "description", "path", "tokenizer_vocab", "val_fraction", "shared", "owner",
                  "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def validate(self, attrs):
        current = {f: getattr(self.instance, f) for f in ("path", "tokenizer_vocab", "val_fraction")} \
            if self.instance else {}
        try:
            models.Dataset(**{**current, **{k: v for k, v in attrs.items() if k in
                                             ("path", "tokenizer_vocab", "val_fraction")}}).clean()
        except DjangoValidationError as exc:
            raise _django_errors(exc) from None
        return attrs


class RunSerializer(OwnedSerializer):
    unique_names = False  # runs are told apart by id; repeating a name is normal
    model_config = serializers.PrimaryKeyRelatedField(read_only=True)
    cluster = serializers.PrimaryKeyRelatedField(read_only=True)
    plan = VisibleRelatedField(queryset=models.ParallelismPlan.objects.select_related("model_config", "cluster"),
                               help_text="The plan; it names the model config and the cluster")
    dataset = VisibleRelatedField(queryset=models.Dataset.objects.all())
    optimizer = spec_field(OptimizerSpec)(required=False)
    profile = spec_field(ProfileSpec)(required=False, allow_null=True)
    spec = spec_field(RunSpec)(read_only=True, help_text="What every attempt launches with: checked and fixed when "
                                                         "the run is created")
    launch = serializers.BooleanField(write_only=True, default=False,
                                      help_text="Queue the run for launch right away instead of keeping a draft")

    class Meta:
        model = models.Run
        fields = ["id", "name", "model_config", "plan", "cluster", "dataset", "steps", "seed", "checkpoint_every",
                  "eval_every", "optimizer", "profile", "spec", "launch", "shared", "owner", "status", "attempts",
                  "max_attempts", "run_dir", "job_id", "status_message", "last_step", "created_at", "queued_at",
                  "started_at", "finished_at"]
        read_only_fields = ["status", "attempts", "run_dir", "job_id", "status_message", "last_step", "created_at",
                            "queued_at", "started_at", "finished_at"]
        extra_kwargs = {"steps": {"min_value": 1, "max_value": 10_000_000},
                        "seed": {"max_value": 2**31 - 1},
                        "checkpoint_every": {"max_value": 10_000_000},
                        "eval_every": {"max_value": 10_000_000},
                        "max_attempts": {"min_value": 1, "max_value": 100}}

    def validate(self, attrs):
        attrs.setdefault("optimizer", OptimizerSpec().to_dict())
        return attrs

    def create(self, validated_data):
        launch = validated_data.pop("launch", False)
        return services.run_create(owner=self.context["request"].user, launch=launch, **validated_data)


class MetricSerializer(serializers.ModelSerializer):
    class Meta:
        model = models.Metric
        fields = ["id", "run", "kind", "step", "loss", "values", "recorded_at"]


class CheckpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = models.Checkpoint
        fields = ["id", "run", "step", "path", "tokens_seen", "size_bytes", "manifest", "created_at"]


class ProfileSerializer(serializers.ModelSerializer):
    class Meta:
        model = models.Profile
        fields = ["id", "run", "name", "path", "summary", "created_at"]
