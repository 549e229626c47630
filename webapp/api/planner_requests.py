"""The bodies of POST /api/estimate/ and /api/tune/, checked before the planner sees them.

The contract checks the specs (model, plan, cluster, search space) with its own types and ranges; what it does not
see is checked here: the estimate's token budget and inference question, a stored plan's id, the tuner's knobs and
its trials. Every number the planner will compute with is then held to the sizes real hardware has (see
``planner_number_problems``), so that no figure of an answer can overflow.
"""
from rest_framework import serializers

from trainer.contract import ParallelPlan, SpecError
from trainer.contract.specjson import from_dict
from trainer.planner.estimate.api import cluster_from_json, model_from_json
from trainer.planner.estimate.options import EstimateOptions
from trainer.planner.tune.api import parse_tune_request
from trainer.planner.tune.space import MAX_LISTED

from .. import models
from ..selectors.plans import plans_with_parts
from ..spec_errors import spec_field_errors
from .fields import StrictFloatField, StrictIntegerField, StrictSerializer, UsablePlanField, VisibleRelatedField
from .specfields import api_field

# Every number of a planner request is 0 or has a magnitude within these: counts, sizes in bytes, rates in GB/s and
# TFLOP/s, fractions, seconds and costs of real machines all do, and products of a few of them stay far from the
# largest float (1.8e308). A value outside (1e300 layers, a 1e-300 TFLOP/s GPU) can only make figures overflow.
PLANNER_SMALLEST, PLANNER_LARGEST = 1e-9, 1e15
MAX_TOKEN_BUDGET = 1e16  # tokens; the largest published pre-training runs are near 1e13 (Llama 3: 1.5e13)
INFERENCE_PRECISIONS = ["fp32", "bf16", "fp16", "int8"]


def planner_number_problems(value, path: str) -> dict[str, list[str]]:
    """``{path: [message]}`` for each number in a JSON value outside what the planner computes with."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return {}
    if isinstance(value, (int, float)):
        size = abs(value)
        if size == 0 or PLANNER_SMALLEST <= size <= PLANNER_LARGEST:
            return {}
        return {path: [f"{path}={value!r} is outside what the planner computes with: every number must be 0 or "
                       f"between {PLANNER_SMALLEST:g} and {PLANNER_LARGEST:g} in size; give real sizes, rates and "
                       f"costs"]}
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    problems: dict[str, list[str]] = {}
    for key, item in items:
        problems.update(planner_number_problems(item, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}"))
    return problems


def _object_or_none(value, name: str):
    if value is not None and not isinstance(value, dict):
        raise serializers.ValidationError(f"{name} must be an object, got {type(value).__name__}")
    return value


class InferenceSerializer(StrictSerializer):
    """What serving the model takes: weights and KV cache per GPU and decode time per token."""

    tp = StrictIntegerField(min_value=1, max_value=1024, required=False, help_text="GPUs one replica spans")
    batch = StrictIntegerField(min_value=1, max_value=1_000_000, required=False, help_text="sequences at once")
    context = StrictIntegerField(min_value=1, max_value=10_000_000, required=False, allow_null=True,
                                 help_text="tokens per sequence; default: the model's seq_len")
    precision = serializers.ChoiceField(choices=INFERENCE_PRECISIONS, required=False)
    kv_precision = serializers.ChoiceField(choices=INFERENCE_PRECISIONS, required=False, allow_null=True)


class EstimateRequestSerializer(StrictSerializer):
    # A stored plan is used only together with its model config: both must be the requester's to see.
    plan_id = UsablePlanField(queryset=plans_with_parts(),
                              required=False, help_text="a stored plan: model, plan and cluster come from it")
    model = serializers.JSONField(required=False, help_text="a preset name, or ModelSpec fields")
    plan = serializers.JSONField(required=False, help_text="ParallelPlan fields")
    cluster = serializers.JSONField(required=False, help_text="ClusterSpec fields, or a preset GPU with nodes")
    options = serializers.JSONField(required=False, allow_null=True, help_text="EstimateOptions fields")
    token_budget = StrictFloatField(min_value=1, max_value=MAX_TOKEN_BUDGET, required=False, allow_null=True,
                                    help_text="tokens to train on, for time and cost")
    inference = InferenceSerializer(required=False, allow_null=True)

    def validate_options(self, value):
        return _object_or_none(value, "options")

    def validate(self, attrs):
        stored = attrs.pop("plan_id", None)
        given = [key for key in ("model", "plan", "cluster") if key in attrs]
        if stored is not None and given:  # they would be ignored: the stored plan names all three
            raise serializers.ValidationError({key: [f"give plan_id or {key}, not both"] for key in given})
        # the stored plan's cluster row: its calibration, if any, chooses the options (webapp.selectors.calibration)
        self.stored_cluster = stored.cluster if stored is not None else None
        if stored is not None:
            attrs.update(model=stored.model_config.spec, plan=stored.spec, cluster=stored.cluster.spec)
        missing = [key for key in ("model", "plan", "cluster") if key not in attrs]
        if missing:
            raise serializers.ValidationError({key: [f"{key} is required (or give plan_id, a stored plan)"]
                                               for key in missing})
        problems = _spec_problems(attrs)
        if problems:
            raise serializers.ValidationError(problems)
        return attrs


def _spec_problems(attrs: dict) -> dict[str, list[str]]:
    """The contract's problems with the specs first (their own messages and ranges), then the planner's bounds."""
    problems: dict[str, list[str]] = {}
    for key, parse in (("model", model_from_json), ("plan", _plan), ("cluster", cluster_from_json),
                       ("options", _options)):
        if key in attrs:
            try:
                parse(attrs[key])
            except SpecError as exc:
                problems.update(spec_field_errors(exc, api_field))
    return problems or _number_problems(attrs)


def _number_problems(attrs: dict) -> dict[str, list[str]]:
    problems: dict[str, list[str]] = {}
    for key in ("model", "plan", "cluster", "options", "space"):
        if key in attrs:
            problems.update(planner_number_problems(attrs[key], key))
    return problems


def _plan(value):
    try:
        return ParallelPlan.from_dict(value)
    except SpecError as exc:
        raise exc.prefixed("plan") from None


def _options(value):
    """EstimateOptions with each field of its type (its own check compares values, and would fail on a string)."""
    if value is None:
        return None
    try:
        return from_dict(EstimateOptions, value).validate()
    except SpecError as exc:
        raise exc.prefixed("options") from None


class GlobalBatchField(serializers.Field):
    """One global batch, or a list of them (the tuner searches each)."""

    default_error_messages = {"invalid": "global_batch={input!r} must be a positive integer or a list of them"}

    def to_internal_value(self, data):
        values = data if isinstance(data, list) else [data]
        if not values or len(values) > MAX_LISTED:
            raise serializers.ValidationError(f"give between 1 and {MAX_LISTED} global batches, "
                                              f"got {len(values)}")
        field = StrictIntegerField(min_value=1, max_value=10_000_000)
        checked = [field.run_validation(v) for v in values]
        return checked if isinstance(data, list) else checked[0]

    def to_representation(self, value):
        return value


class TrialsSerializer(StrictSerializer):
    dataset = VisibleRelatedField(queryset=models.Dataset.objects.all(), help_text="The dataset the trials train on")
    steps = StrictIntegerField(min_value=4, max_value=200, default=8, help_text="Steps per trial")


class TuneRequestSerializer(StrictSerializer):
    model = serializers.JSONField(help_text="a preset name, or ModelSpec fields")
    cluster = serializers.JSONField(help_text="ClusterSpec fields, or a preset GPU with nodes")
    global_batch = GlobalBatchField()
    space = serializers.JSONField(required=False, allow_null=True, help_text="SearchSpace fields")
    options = serializers.JSONField(required=False, allow_null=True, help_text="EstimateOptions fields")
    top_k = StrictIntegerField(min_value=1, max_value=1000, required=False, help_text="ranked plans in the answer")
    explain_top = StrictIntegerField(min_value=0, max_value=100, required=False,
                                     help_text="of those, how many carry the whole explained estimate")
    trial_pool = StrictIntegerField(min_value=1, max_value=1000, required=False)
    max_fraction = StrictFloatField(min_value=0, max_value=1, required=False)
    tolerance = StrictFloatField(min_value=0, max_value=10, required=False)
    trials = TrialsSerializer(required=False, help_text="measure the best plans by real trials (a job)")

    def validate_space(self, value):
        return _object_or_none(value, "space")

    def validate_options(self, value):
        return _object_or_none(value, "options")

    def validate_max_fraction(self, value):
        if value == 0:
            raise serializers.ValidationError("max_fraction=0 measures nothing: give a fraction in (0, 1]")
        return value

    def validate(self, attrs):
        # The planner's own check of a tune request (every field, no plan estimated), then the bounds on numbers.
        try:
            parse_tune_request({k: v for k, v in attrs.items() if k != "trials"})
        except SpecError as exc:
            raise serializers.ValidationError(spec_field_errors(exc, api_field)) from None
        problems = _number_problems(attrs)
        if problems:
            raise serializers.ValidationError(problems)
        return attrs

    def tune_payload(self) -> dict:
        """The request as the planner reads it: what was given, checked, without the trials."""
        return {k: v for k, v in self.validated_data.items() if k != "trials"}
