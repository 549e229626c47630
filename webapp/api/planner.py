"""The planner over REST: estimates and analytic tuning answer at once; tuning with measured trials is a job."""
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from trainer.planner.estimate.api import estimate_json
from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan
from trainer.planner.tune.api import tune_json

from .. import models, services
from .specfields import json_schema

_MODEL = {"oneOf": [{"type": "string", "description": "a preset name, e.g. gpt3-175b"}, json_schema(ModelSpec)]}
_CLUSTER = {"oneOf": [
    {"type": "object", "description": "a preset GPU by name with a node count",
     "properties": {"gpu": {"type": "string"}, "nodes": {"type": "integer"}, "gpus_per_node": {"type": "integer"},
                    "inter_node_bandwidth_gbs": {"type": "number"}, "gpu_hour_cost": {"type": "number"}},
     "required": ["gpu"]},
    json_schema(ClusterSpec)]}
_OBJECT = {"type": "object", "additionalProperties": True}

ESTIMATE_REQUEST = {"type": "object", "properties": {
    "model": _MODEL, "plan": json_schema(ParallelPlan), "cluster": _CLUSTER, "options": _OBJECT,
    "token_budget": {"type": "number", "nullable": True, "description": "tokens to train on, for time and cost"},
    "inference": {**_OBJECT, "nullable": True, "description": "tp, batch, context, precision"},
    "plan_id": {"type": "integer", "description": "a stored plan: model, plan and cluster come from it"}}}
TUNE_REQUEST = {"type": "object", "required": ["model", "cluster", "global_batch"], "properties": {
    "model": _MODEL, "cluster": _CLUSTER,
    "global_batch": {"oneOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}}]},
    "space": _OBJECT, "options": _OBJECT, "top_k": {"type": "integer"}, "explain_top": {"type": "integer"},
    "trials": {"type": "object", "required": ["dataset"], "description": "measure the best plans by real trials",
               "properties": {"dataset": {"type": "integer"}, "steps": {"type": "integer"}}}}}


def _from_stored_plan(payload: dict, user) -> dict:
    """Replace ``plan_id`` by the stored plan's model, plan and cluster (a plan the user may see)."""
    plan_id = payload.get("plan_id")
    if plan_id is None:
        return payload
    if not isinstance(plan_id, int) or isinstance(plan_id, bool):
        raise serializers.ValidationError({"plan_id": ["must be an integer"]})
    plan = models.ParallelismPlan.objects.visible_to(user).select_related("model_config", "cluster") \
        .filter(pk=plan_id).first()
    if plan is None:
        raise serializers.ValidationError({"plan_id": [f"no plan {plan_id} that you can see"]})
    rest = {k: v for k, v in payload.items() if k != "plan_id"}
    return {**rest, "model": plan.model_config.spec, "plan": plan.spec, "cluster": plan.cluster.spec}


class EstimateView(APIView):
    """Per-GPU memory, step time, throughput, MFU and cost of a plan, every figure with its formula."""

    @extend_schema(request={"application/json": ESTIMATE_REQUEST}, responses={200: _OBJECT},
                   examples=[OpenApiExample("GPT-3 175B on 1,024 A100s", request_only=True, value={
                       "model": "gpt3-175b", "cluster": {"gpu": "A100-SXM-80GB", "nodes": 128},
                       "plan": {"dp": 8, "tp": 8, "pp": 16, "micro_batch": 1, "global_batch": 1536,
                                "sequence_parallel": True, "activation_checkpointing": "selective",
                                "precision": "bf16"},
                       "token_budget": 3e11})])
    def post(self, request):
        if not isinstance(request.data, dict):
            raise serializers.ValidationError({"non_field_errors": ["the request must be a JSON object"]})
        return Response(estimate_json(_from_stored_plan(dict(request.data), request.user)))


class TrialsSerializer(serializers.Serializer):
    dataset = serializers.PrimaryKeyRelatedField(queryset=models.Dataset.objects.all(),
                                                 help_text="The dataset the trials train on")
    steps = serializers.IntegerField(min_value=4, max_value=200, default=8, help_text="Steps per trial")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["dataset"].queryset = models.Dataset.objects.visible_to(self.context["request"].user)


class TuneJobSerializer(serializers.ModelSerializer):
    owner = serializers.ReadOnlyField(source="owner.username")

    class Meta:
        model = models.TuneJob
        fields = ["id", "owner", "request", "dataset", "trial_steps", "status", "progress", "result", "error",
                  "created_at", "started_at", "finished_at"]
        read_only_fields = fields


class TuneView(APIView):
    """Every valid plan for a model, cluster and global batch: the ones that do not fit with the reason, the rest
    ranked by estimated step time, with the memory/time Pareto front. With ``trials`` the best plans are also
    measured by short real trainings on this machine's CPU ranks, as a job (202) whose progress is at
    /api/tune-jobs/<id>/."""

    @extend_schema(request={"application/json": TUNE_REQUEST}, responses={200: _OBJECT, 202: TuneJobSerializer})
    def post(self, request):
        if not isinstance(request.data, dict):
            raise serializers.ValidationError({"non_field_errors": ["the request must be a JSON object"]})
        payload = dict(request.data)
        trials = payload.pop("trials", None)
        if trials is None:
            return Response(tune_json(payload))
        body = TrialsSerializer(data=trials, context={"request": request})
        body.is_valid(raise_exception=True)
        job = services.tune_job_create(owner=request.user, request=payload, dataset=body.validated_data["dataset"],
                                       trial_steps=body.validated_data["steps"])
        return Response(TuneJobSerializer(job).data, status=status.HTTP_202_ACCEPTED)


class TuneJobViewSet(viewsets.ReadOnlyModelViewSet):
    """Tuning jobs with trials: status, progress, and the result once done."""

    serializer_class = TuneJobSerializer
    queryset = models.TuneJob.objects.all()
    filterset_fields = ["status"]
    ordering_fields = ["created_at"]

    def get_queryset(self):
        return models.TuneJob.objects.visible_to(self.request.user).select_related("owner")
