"""REST representations. Validation goes through the contract (trainer.contract) so the API, admin and trainer agree.

JSON bodies are type-checked field by field (webapp.api.fields): a number where a string belongs, a string where a
number does, is a 400 naming the field, never coerced.
"""
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import models as db
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from trainer.contract import presets
from trainer.contract import (MAIN_SOURCE, ClusterSpec, ModelSpec, OptimizerSpec, ParallelPlan, ProfileSpec, RunSpec,
                              SpecError, check_plan)

from .. import models, services
from ..goodput import PARTS
from ..models.clusterfields import ENV_SETUP_LINE_LENGTH, ENV_SETUP_LINES
from ..models.configs import sharing_problem
from ..selectors.lineage import checkpoint_lineage, run_started_from
from ..selectors.plans import plans_with_parts
from ..services.runs import SOURCE_NAME
from ..spec_errors import spec_field_errors
from .fields import (StrictBooleanField, StrictCharField, StrictFloatField, StrictIntegerField,
                     StrictPrimaryKeyRelatedField, StrictSerializer, UsablePlanField, VisibleRelatedField)
from .errors import Conflict
from .specfields import api_field, spec_field


def _django_errors(exc: DjangoValidationError) -> serializers.ValidationError:
    return serializers.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)


class StrictModelSerializer(serializers.ModelSerializer):
    """A model serializer whose fields take JSON values of their own type only."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        db.IntegerField: StrictIntegerField, db.PositiveIntegerField: StrictIntegerField,
        db.BigIntegerField: StrictIntegerField, db.FloatField: StrictFloatField, db.BooleanField: StrictBooleanField,
        db.CharField: StrictCharField, db.TextField: StrictCharField,
    }
    serializer_related_field = StrictPrimaryKeyRelatedField

    def run_validation(self, data=serializers.empty):
        try:
            return super().run_validation(data)
        except serializers.ValidationError as exc:
            codes = exc.get_codes()
            if isinstance(codes, dict) and codes and all(set(c) == {"unique"} for c in codes.values()):
                raise Conflict("; ".join(f"{field}: {message}" for field, messages in exc.detail.items()
                                          for message in messages)) from None
            raise


class OwnedSerializer(StrictModelSerializer):
    """Owner is the requesting user; names are unique per owner (checked here so a clash is a 409 naming it)."""

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
            what = self.Meta.model._meta.verbose_name
            raise serializers.ValidationError(f"you already have a {what} named {value!r}", code="unique")
        return value

    def create(self, validated_data):
        validated_data["owner"] = self.context["request"].user
        return super().create(validated_data)


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


@extend_schema_field({
    "type": "array", "items": {"type": "string", "maxLength": ENV_SETUP_LINE_LENGTH}, "maxItems": ENV_SETUP_LINES,
    "description": "Shell lines run before the trainer, one string each, without line breaks. Trusted staff input: "
                   "written into the batch script verbatim"})
class EnvSetupField(serializers.JSONField):
    """Shell lines, one string each (checked with the cluster: Cluster.clean)."""


class ClusterSerializer(StrictModelSerializer):
    spec = spec_field(ClusterSpec)()
    env_setup = EnvSetupField(required=False)

    class Meta:
        model = models.Cluster
        fields = ["id", "name", "kind", "spec", "partition", "account", "qos", "time_limit", "env_setup",
                  "container_image", "stop_before_limit_s", "rest_url", "runs_root", "node_failures", "created_at",
                  "updated_at"]
        read_only_fields = ["node_failures", "created_at", "updated_at"]
        extra_kwargs = {"stop_before_limit_s": {"min_value": 1, "max_value": 65535}}

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
    cluster = StrictPrimaryKeyRelatedField(queryset=models.Cluster.objects.all())
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
        shared = attrs.get("shared", self.instance.shared if self.instance else False)
        name = attrs.get("name") or self.instance.name
        problem = sharing_problem(name, shared, model_config)
        if problem:
            raise serializers.ValidationError({"shared": [problem]})
        plan = ParallelPlan.from_dict(attrs.get("spec") or self.instance.spec)
        problems = check_plan(model_config.model_spec(), plan, cluster.cluster_spec())
        if problems:
            raise serializers.ValidationError({"spec": spec_field_errors(SpecError(problems), api_field)})
        return attrs


class DatasetSerializer(OwnedSerializer):
    class Meta:
        model = models.Dataset
        fields = ["id", "name", "description", "path", "tokenizer_vocab", "val_fraction", "text_field",
                  "max_bad_fraction", "tokenizer", "shared", "owner", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def validate(self, attrs):
        fields = ("path", "tokenizer_vocab", "val_fraction", "text_field", "max_bad_fraction", "tokenizer")
        current = {f: getattr(self.instance, f) for f in fields} if self.instance else {}
        owner = self.instance.owner if self.instance else self.context["request"].user
        try:
            models.Dataset(owner=owner, **{**current, **{k: v for k, v in attrs.items() if k in fields}}).clean()
        except DjangoValidationError as exc:
            raise _django_errors(exc) from None
        return attrs


class DatasetUploadSerializer(serializers.Serializer):
    """A file sent as multipart/form-data, with the dataset's fields (form values are strings, so these fields read
    them as DRF's do)."""

    file = serializers.FileField(help_text="UTF-8 text or JSONL, or by its name .jsonl.gz, .jsonl.zst or .parquet; "
                                           "at most WORKBENCH_MAX_UPLOAD_MB megabytes")
    text_field = serializers.CharField(required=False, max_length=120,
                                       help_text="The JSONL key or Parquet column of the text (default: text)")
    name = serializers.CharField(max_length=120)
    description = serializers.CharField(required=False, allow_blank=True, max_length=10_000)
    tokenizer_vocab = serializers.IntegerField(min_value=0, max_value=2**31 - 1, default=0,
                                               help_text="0: the model's vocabulary size")
    val_fraction = serializers.FloatField(min_value=0, max_value=1, default=0.05)
    shared = serializers.BooleanField(default=False)

    def validate_name(self, value):
        if models.Dataset.objects.filter(owner=self.context["request"].user, name=value).exists():
            raise serializers.ValidationError(f"you already have a dataset named {value!r}")
        return value


MAX_BLEND_SOURCES = 16


class BlendItemSerializer(StrictSerializer):
    dataset = VisibleRelatedField(queryset=models.Dataset.objects.all(), help_text="A dataset visible to you")
    weight = StrictFloatField(default=1.0, min_value=1e-9, max_value=1e9,
                              help_text="Its share of the sequences is its weight over the sum of the weights")
    name = serializers.RegexField(rf"^{SOURCE_NAME.pattern}$", required=False,
                                  help_text="Its name in the blend and its validation series (default: from the "
                                            "dataset's name); letters, digits, '.', '_' and '-'")

    def to_representation(self, instance):  # stored as {"dataset": id, "weight": …, "name": …}
        return {"dataset": instance.get("dataset"), "weight": instance.get("weight"), "name": instance.get("name")}


def blend_item(item: dict) -> dict:
    """A checked blend item as the run stores it: the dataset's id, and a name (from the dataset's if not given)."""
    name = item.get("name") or services.default_source_name(item["dataset"])
    return {"dataset": item["dataset"].pk, "weight": item["weight"], "name": name}


class RunSerializer(OwnedSerializer):
    unique_names = False  # runs are told apart by id; repeating a name is normal
    model_config = serializers.PrimaryKeyRelatedField(read_only=True)
    cluster = serializers.PrimaryKeyRelatedField(read_only=True)
    plan = UsablePlanField(queryset=plans_with_parts(),
                           help_text="The plan; it names the model config and the cluster (both visible to you)")
    dataset = VisibleRelatedField(queryset=models.Dataset.objects.all())
    optimizer = spec_field(OptimizerSpec)(required=False)
    profile = spec_field(ProfileSpec)(required=False, allow_null=True)
    spec = spec_field(RunSpec)(read_only=True, allow_null=True,
                               help_text="What every attempt launches with: checked and fixed when the run is "
                                         "created (null until then)")
    launch = StrictBooleanField(write_only=True, default=False,
                                help_text="Queue the run for launch right away instead of keeping a draft")
    batch_script = serializers.SerializerMethodField(
        help_text="The batch script of the run's latest attempt, as submitted to Slurm (empty for local runs)")
    init_from = VisibleRelatedField(
        queryset=models.Checkpoint.objects.all(), required=False, allow_null=True,
        help_text="A checkpoint (trained or imported, visible to you) whose weights the run starts from at step 0, "
                  "with its own plan and a fresh optimizer; its model must be the plan's model config")
    started_from = serializers.SerializerMethodField(
        help_text="Lineage in words: 'started from checkpoint …', or empty for fresh weights")
    blend = BlendItemSerializer(many=True, required=False, max_length=MAX_BLEND_SOURCES,
                                help_text="Other datasets to train on beside `dataset`, each with its weight (the "
                                          "run's own has `dataset_weight`); each one's validation loss is a series "
                                          "of its own, `val_loss:<name>` (the run's own: `val_loss:main`)")

    evaluation_sets = VisibleRelatedField(
        many=True, queryset=models.EvaluationSet.objects.all(), required=False,
        help_text=f"Evaluation sets (visible to you, at most {MAX_BLEND_SOURCES}) each checkpoint the run saves is "
                  f"scored on, as it is saved")

    class Meta:
        model = models.Run
        fields = ["id", "name", "model_config", "plan", "cluster", "dataset", "steps", "seed", "checkpoint_every",
                  "eval_every", "blend", "dataset_weight", "spike_factor", "replan_on_oom", "evaluation_sets",
                  "optimizer", "profile", "init_from", "keep_tokenizer", "started_from", "spec", "launch", "shared",
                  "owner", "status", "attempts", "max_restarts", "restarts", "run_dir", "job_id", "status_message",
                  "last_step", "created_at", "queued_at", "started_at", "finished_at", "batch_script"]
        read_only_fields = ["status", "attempts", "restarts", "run_dir", "job_id", "status_message", "last_step", "created_at",
                            "queued_at", "started_at", "finished_at"]
        extra_kwargs = {"steps": {"min_value": 1, "max_value": 10_000_000},
                        "seed": {"max_value": 2**31 - 1},
                        "checkpoint_every": {"max_value": 10_000_000, "help_text": (
                            "Steps between checkpoints, and one at the end; 0: none. Not given: the run's steps, so "
                            "that the run leaves one checkpoint, at its end, to generate from, export and deploy")},
                        "eval_every": {"max_value": 10_000_000},
                        "dataset_weight": {"min_value": 1e-9, "max_value": 1e9},
                        "spike_factor": {"min_value": 0, "max_value": 1e6},
                        "max_restarts": {"min_value": 0, "max_value": 100}}

    def get_started_from(self, run) -> str:
        return run_started_from(run)

    def get_batch_script(self, run) -> str:
        if hasattr(run, "latest_script"):  # annotated by the view's queryset
            return run.latest_script or ""
        return run.attempt_records.order_by("-number").values_list("script", flat=True).first() or ""

    def validate(self, attrs):
        attrs.setdefault("optimizer", OptimizerSpec().to_dict())
        attrs.setdefault("checkpoint_every", attrs.get("steps", models.Run._meta.get_field("steps").default))
        if len(attrs.get("evaluation_sets", ())) > MAX_BLEND_SOURCES:
            raise serializers.ValidationError({"evaluation_sets": [f"at most {MAX_BLEND_SOURCES} sets"]})
        if "blend" in attrs:
            attrs["blend"] = [blend_item(item) for item in attrs["blend"]]
            names = [item["name"] for item in attrs["blend"]]
            if len(set(names)) < len(names) or MAIN_SOURCE in names:
                raise serializers.ValidationError({"blend": [f"each source needs a name of its own, other than "
                                                             f"{MAIN_SOURCE!r} (the run's own dataset): got {names}"]})
        return attrs

    def create(self, validated_data):
        launch = validated_data.pop("launch", False)
        return services.run_create(owner=self.context["request"].user, launch=launch, **validated_data)


class GoodputPartSerializer(serializers.Serializer):
    name = serializers.ChoiceField(choices=list(PARTS))
    label = serializers.CharField(help_text="The part in words")
    seconds = serializers.FloatField(help_text="Wall seconds (a cluster's: GPU seconds)")
    share = serializers.FloatField(allow_null=True, help_text="Of the allocated time")


class GoodputSerializer(serializers.Serializer):
    goodput = serializers.FloatField(allow_null=True, help_text="The share of the allocated time spent in steps "
                                                                "that were kept (not redone after a failure)")
    gpus = serializers.IntegerField(help_text="GPUs the run held (a cluster's figures are GPU seconds already: 1)")
    allocated_s = serializers.FloatField(help_text="Seconds the attempts held their nodes")
    allocated_gpu_hours = serializers.FloatField()
    queue_s = serializers.FloatField(help_text="Seconds the attempts waited in the queue (not allocated)")
    parts = GoodputPartSerializer(many=True, help_text="Where the allocated time went: parts measured apart, so "
                                                       "what does not add up is shown as `unaccounted`")


class MetricSerializer(serializers.ModelSerializer):
    class Meta:
        model = models.Metric
        fields = ["id", "run", "kind", "step", "loss", "values", "recorded_at"]


class LineageSerializer(serializers.Serializer):
    checkpoint = serializers.IntegerField(allow_null=True, help_text="The checkpoint of this link; empty when it "
                                                                     "is no longer on record")
    text = serializers.CharField(help_text="The link in words")


class CheckpointSerializer(serializers.ModelSerializer):
    source = serializers.ChoiceField(choices=["trained", "imported"], read_only=True,
                                     help_text="trained: saved by `run`; imported: registered from a folder")
    owner = serializers.SerializerMethodField(help_text="The run's owner, or who imported it")
    lineage = serializers.SerializerMethodField(
        help_text="This checkpoint and its parents, newest first: the run that saved it, the checkpoint that run "
                  "started from, …, down to fresh weights or an import ('imported from <folder>')")

    class Meta:
        model = models.Checkpoint
        fields = ["id", "run", "source", "name", "owner", "step", "path", "tokens_seen", "size_bytes", "manifest",
                  "imported_from", "hf_export_path", "lineage", "created_at"]

    def get_owner(self, checkpoint) -> str:
        return checkpoint.owner_user.username

    @extend_schema_field(LineageSerializer(many=True))
    def get_lineage(self, checkpoint) -> list[dict]:
        return checkpoint_lineage(checkpoint)


class ProfileSerializer(serializers.ModelSerializer):
    class Meta:
        model = models.Profile
        fields = ["id", "run", "name", "path", "summary", "created_at"]
