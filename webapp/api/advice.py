"""POST /api/planner/advice/: what to change in a model for its cluster, each suggestion with the planner's step
time, memory per GPU, MFU and tokens/s before and after (trainer.planner.advice)."""
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from trainer.contract import ParallelPlan, SpecError
from trainer.planner.advice.advise import MAX_GLOBAL_BATCH
from trainer.planner.advice.api import advice_json, plan_from_json
from trainer.planner.estimate.api import cluster_from_json, model_from_json, options_from_json

from .. import models
from ..selectors.plans import plans_with_parts
from ..spec_errors import spec_field_errors
from .errors import computing_on, require_finite
from .fields import StrictIntegerField, StrictPrimaryKeyRelatedField, StrictSerializer, UsablePlanField, \
    VisibleRelatedField
from .planner import _CLUSTER, _MODEL, _OBJECT, _OPTIONS, _int, _object
from .planner_requests import planner_number_problems
from .specfields import api_field, json_schema

_ID = (1, 2**63 - 1)
ADVICE_REQUEST = {"type": "object", "additionalProperties": False, "properties": {
    "model": _MODEL, "cluster": _CLUSTER, "plan": {**json_schema(ParallelPlan), "nullable": True},
    "options": _OPTIONS,
    "global_batch": {**_int(1, MAX_GLOBAL_BATCH, "sequences a step when no plan is given (default: 8 a GPU)"),
                     "nullable": True},
    "model_config_id": _int(*_ID, "a stored model config instead of model"),
    "cluster_id": _int(*_ID, "a stored cluster instead of cluster"),
    "plan_id": _int(*_ID, "a stored plan: model, plan and cluster come from it")}}


# What a stored object's id stands in for.
STORED = {"model": "model_config_id", "cluster": "cluster_id"}


class AdviceRequestSerializer(StrictSerializer):
    plan_id = UsablePlanField(queryset=plans_with_parts(),
                              required=False, help_text="a stored plan: model, plan and cluster come from it")
    model_config_id = VisibleRelatedField(queryset=models.ModelConfig.objects.all(), required=False,
                                          help_text="a stored model config instead of model")
    cluster_id = StrictPrimaryKeyRelatedField(queryset=models.Cluster.objects.all(), required=False,
                                              help_text="a stored cluster instead of cluster")
    model = serializers.JSONField(required=False, help_text="a preset name, or ModelSpec fields")
    cluster = serializers.JSONField(required=False, help_text="ClusterSpec fields, or a preset GPU with nodes")
    plan = serializers.JSONField(required=False, allow_null=True, help_text="ParallelPlan fields; none: the tuner's")
    options = serializers.JSONField(required=False, allow_null=True, help_text="EstimateOptions fields")
    global_batch = StrictIntegerField(min_value=1, max_value=MAX_GLOBAL_BATCH, required=False, allow_null=True,
                                      help_text="sequences a step when no plan is given")

    def validate(self, attrs):
        stored = attrs.pop("plan_id", None)
        if stored is not None:
            attrs.setdefault("model", stored.model_config.spec)
            attrs.setdefault("plan", stored.spec)
            attrs.setdefault("cluster", stored.cluster.spec)
        for key, id_key in STORED.items():
            obj = attrs.pop(id_key, None)
            if obj is None:
                continue
            if key in attrs:
                raise serializers.ValidationError({id_key: [f"give {key} or {id_key}, not both"]})
            attrs[key] = obj.spec
        missing = [key for key in STORED if key not in attrs]
        if missing:
            raise serializers.ValidationError({key: [f"{key} is required (or give {STORED[key]}, or plan_id)"]
                                               for key in missing})
        problems: dict[str, list[str]] = {}
        for key, parse in (("model", model_from_json), ("cluster", cluster_from_json), ("plan", plan_from_json),
                           ("options", options_from_json)):
            try:
                parse(attrs.get(key))
            except SpecError as exc:
                problems.update(spec_field_errors(exc, api_field))
        if not problems:
            for key in ("model", "cluster", "plan", "options"):
                problems.update(planner_number_problems(attrs.get(key), key))
        if problems:
            raise serializers.ValidationError(problems)
        return attrs


class AdviceView(APIView):
    """Suggestions for a model on a cluster (and its plan, or the tuner's best): vocabulary padding, tile-aligned
    widths, heads that tensor parallel can split, depth against width at equal parameters, mixture of experts
    against dense at equal active FLOPs, micro-batch and context against the memory left; each with the step time,
    memory per GPU, MFU and tokens/s before and after, the relative gain, the reason and its formula."""

    @extend_schema(request={"application/json": ADVICE_REQUEST}, responses={200: _OBJECT},
                   examples=[OpenApiExample("GPT-2 small on 8 A100s", request_only=True, value={
                       "model": "gpt2-small", "cluster": {"gpu": "A100-SXM-80GB", "nodes": 1},
                       "plan": {"dp": 8, "micro_batch": 8, "global_batch": 64, "precision": "bf16"}})])
    def post(self, request):
        body = AdviceRequestSerializer(data=_object(request.data), context={"request": request})
        body.is_valid(raise_exception=True)
        payload = {k: v for k, v in body.validated_data.items() if v is not None}
        with computing_on("the advice"):
            answer = advice_json(payload)
        return Response(require_finite(answer, "the advice"))
