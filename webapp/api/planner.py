"""The planner over REST: estimates and analytic tuning answer at once; tuning with measured trials is a job."""
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan
from trainer.planner.tune.api import tune_json

from .. import models, services
from ..selectors.calibration import calibrated_estimate
from ..selectors.owned import visible_with_owners
from .errors import computing_on, require_finite
from .filters import TUNE_STATUS_WORDS, TuneJobFilter
from .planner_requests import (INFERENCE_PRECISIONS, MAX_LISTED, MAX_TOKEN_BUDGET, EstimateRequestSerializer,
                               TuneRequestSerializer)
from .specfields import json_schema

_MODEL = {"oneOf": [{"type": "string", "description": "a preset name, e.g. gpt3-175b"}, json_schema(ModelSpec)]}
_CLUSTER = {"oneOf": [
    {"type": "object", "description": "a preset GPU by name with a node count", "additionalProperties": False,
     "properties": {"gpu": {"type": "string"}, "nodes": {"type": "integer"}, "gpus_per_node": {"type": "integer"},
                    "name": {"type": "string"}, "inter_node_bandwidth_gbs": {"type": "number"},
                    "gpu_hour_cost": {"type": "number"}},
     "required": ["gpu"]},
    json_schema(ClusterSpec)]}
_OBJECT = {"type": "object", "additionalProperties": True}
_OPTIONS = {**_OBJECT, "nullable": True, "description": "EstimateOptions fields (efficiencies, overheads, kernels)"}


def _int(low: int, high: int, description: str = "") -> dict:
    return {"type": "integer", "minimum": low, "maximum": high, **({"description": description} if description else {})}


ESTIMATE_REQUEST = {"type": "object", "additionalProperties": False, "properties": {
    "model": _MODEL, "plan": json_schema(ParallelPlan), "cluster": _CLUSTER, "options": _OPTIONS,
    "token_budget": {"type": "number", "nullable": True, "minimum": 1, "maximum": MAX_TOKEN_BUDGET,
                     "description": "tokens to train on, for time and cost"},
    "inference": {"type": "object", "nullable": True, "additionalProperties": False,
                  "description": "what serving takes: weights and KV cache per GPU, decode time per token",
                  "properties": {"tp": _int(1, 1024), "batch": _int(1, 1_000_000),
                                 "context": {**_int(1, 10_000_000, "default: the model's seq_len"), "nullable": True},
                                 "precision": {"type": "string", "enum": INFERENCE_PRECISIONS},
                                 "kv_precision": {"type": "string", "enum": INFERENCE_PRECISIONS, "nullable": True}}},
    "plan_id": _int(1, 2**63 - 1, "a stored plan: model, plan and cluster come from it")}}
_BATCH = _int(1, 10_000_000)
TUNE_REQUEST = {"type": "object", "required": ["model", "cluster", "global_batch"], "additionalProperties": False,
                "properties": {
    "model": _MODEL, "cluster": _CLUSTER,
    "global_batch": {"oneOf": [_BATCH, {"type": "array", "items": _BATCH, "minItems": 1,
                                        "maxItems": MAX_LISTED}]},
    "space": {**_OBJECT, "nullable": True, "description": "SearchSpace fields"}, "options": _OPTIONS,
    "top_k": _int(1, 1000, "ranked plans in the answer"),
    "explain_top": _int(0, 100, "of those, how many carry the whole explained estimate"),
    "trial_pool": _int(1, 1000),
    "max_fraction": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1},
    "tolerance": {"type": "number", "minimum": 0, "maximum": 10},
    "trials": {"type": "object", "required": ["dataset"], "additionalProperties": False,
               "description": "measure the best plans by real trials",
               "properties": {"dataset": _int(1, 2**63 - 1), "steps": _int(4, 200)}}}}


def _object(data):
    if not isinstance(data, dict):
        raise serializers.ValidationError({"non_field_errors": [
            f"the request must be a JSON object, got {type(data).__name__}"]})
    return data


class EstimateView(APIView):
    """Per-GPU memory, step time, throughput, MFU and cost of a plan, every figure with its formula. A stored plan
    (``plan_id``) on a calibrated cluster is estimated under the cluster's fitted options unless ``options`` are
    given, and the answer's ``calibration`` says so: runs, held-out median error."""

    @extend_schema(request={"application/json": ESTIMATE_REQUEST}, responses={200: _OBJECT},
                   examples=[OpenApiExample("GPT-3 175B on 1,024 A100s", request_only=True, value={
                       "model": "gpt3-175b", "cluster": {"gpu": "A100-SXM-80GB", "nodes": 128},
                       "plan": {"dp": 8, "tp": 8, "pp": 16, "micro_batch": 1, "global_batch": 1536,
                                "sequence_parallel": True, "activation_checkpointing": "selective",
                                "precision": "bf16"},
                       "token_budget": 3e11})])
    def post(self, request):
        body = EstimateRequestSerializer(data=_object(request.data), context={"request": request})
        body.is_valid(raise_exception=True)
        with computing_on("the estimate"):
            answer = calibrated_estimate(dict(body.validated_data), body.stored_cluster)
        return Response(require_finite(answer, "the estimate"))


class TuneJobSerializer(serializers.ModelSerializer):
    owner = serializers.ReadOnlyField(source="owner.username")
    status = serializers.SerializerMethodField()
    result = serializers.SerializerMethodField()
    error = serializers.SerializerMethodField()
    started_at = serializers.DateTimeField(source="claimed_at", read_only=True, allow_null=True)

    def get_status(self, job) -> str:
        return TUNE_STATUS_WORDS[job.status]

    def get_result(self, job) -> dict | None:
        return job.report if job.status == models.TuneJob.Status.DONE else None

    def get_error(self, job) -> str:
        return job.message if job.status == models.TuneJob.Status.FAILED else ""

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
        body = TuneRequestSerializer(data=_object(request.data), context={"request": request})
        body.is_valid(raise_exception=True)
        trials = body.validated_data.get("trials")
        if trials is None:
            with computing_on("the tune"):
                answer = tune_json(body.tune_payload())
            return Response(require_finite(answer, "the tune"))
        job = services.tune_job_create(owner=request.user, request=body.tune_payload(), dataset=trials["dataset"],
                                       trial_steps=trials["steps"])
        return Response(TuneJobSerializer(job).data, status=status.HTTP_202_ACCEPTED)


class TuneJobViewSet(viewsets.ReadOnlyModelViewSet):
    """Tuning jobs with trials: status, progress, and the result once done."""

    serializer_class = TuneJobSerializer
    queryset = models.TuneJob.objects.all()
    filterset_class = TuneJobFilter
    ordering_fields = ["created_at"]

    def get_queryset(self):
        return visible_with_owners(models.TuneJob.objects.all(), self.request.user)
