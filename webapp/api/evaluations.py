"""Evaluation sets (``/api/evaluation-sets/``: a file of multiple-choice items, reference answers or text, under your
data roots) and evaluations (``POST /api/evaluations/`` scores a checkpoint, or a deployment of one through /v1, on a
set with lm-evaluation-harness, run by a worker; ``GET`` follows it: pending → running → done with the scores, or
failed with why)."""
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from .. import models
from ..models import data_roots_for
from ..selectors.checkpoints import checkpoints_visible_to
from ..selectors.deployments import deployments_visible_to
from ..selectors.jobs import evaluations_visible_to
from ..services.evaluations import evaluation_create
from .fields import VisibleRelatedField
from .serializers import OwnedSerializer
from .views import OwnedViewSet


class EvaluationSetSerializer(OwnedSerializer):
    class Meta:
        model = models.EvaluationSet
        fields = ["id", "name", "description", "path", "kind", "shared", "owner", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def validate_path(self, value):
        problem = data_roots_for(self.context["request"].user).problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


class EvaluationSetViewSet(OwnedViewSet):
    """Evaluation sets: multiple-choice items, prompts with reference answers, or text for perplexity
    (docs/evaluation.md has the formats)."""

    queryset = models.EvaluationSet.objects.all()
    serializer_class = EvaluationSetSerializer
    filterset_fields = ["kind", "shared"]


class VisibleCheckpointField(VisibleRelatedField):
    def get_queryset(self):
        return checkpoints_visible_to(self.context["request"].user)


class VisibleDeploymentField(VisibleRelatedField):
    def get_queryset(self):
        return deployments_visible_to(self.context["request"].user)


class EvaluationSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    eval_set = VisibleRelatedField(queryset=models.EvaluationSet.objects.all(),
                                   help_text="An evaluation set visible to you")
    checkpoint = VisibleCheckpointField(queryset=models.Checkpoint.objects.all(), required=False,
                                        help_text="A checkpoint visible to you: trained by a run, or imported; for a "
                                                  "deployment's evaluation, the checkpoint it serves")
    deployment = VisibleDeploymentField(queryset=models.Deployment.objects.all(), required=False, allow_null=True,
                                        help_text="Instead of a checkpoint: a ready deployment visible to you, "
                                                  "evaluated through /v1 as a client would")
    target = serializers.CharField(read_only=True, help_text="What was scored, in words")
    run = serializers.IntegerField(source="checkpoint.run_id", read_only=True, allow_null=True,
                                   help_text="The run that saved the checkpoint; empty for an import")
    step = serializers.IntegerField(source="checkpoint.step", read_only=True)

    class Meta:
        model = models.Evaluation
        fields = ["id", "eval_set", "checkpoint", "deployment", "target", "run", "step", "status", "message",
                  "scores", "owner", "created_at", "finished_at"]
        read_only_fields = ["status", "message", "scores", "created_at", "finished_at"]

    def validate(self, attrs):
        if (attrs.get("checkpoint") is None) == (attrs.get("deployment") is None):
            raise serializers.ValidationError({"checkpoint": ["give a checkpoint, or a deployment to evaluate "
                                                              "through /v1, not both"]})
        return attrs


class EvaluationViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Evaluations of the checkpoints you may see: each one's set, checkpoint (with its run and step), status and
    scores."""

    queryset = models.Evaluation.objects.all()
    serializer_class = EvaluationSerializer
    permission_classes = [IsAuthenticated]
    filterset_fields = ["status", "checkpoint", "deployment", "eval_set", "checkpoint__run"]
    ordering_fields = ["created_at"]

    def get_queryset(self):
        return evaluations_visible_to(self.request.user)

    @extend_schema(responses={202: EvaluationSerializer})
    def create(self, request, *args, **kwargs):
        """Score a checkpoint, or a deployment through /v1, on an evaluation set (a worker runs
        `python -m trainer.evaluate`); 202 with the evaluation to follow."""
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        evaluation = evaluation_create(request.user, data["eval_set"], checkpoint=data.get("checkpoint"),
                                       deployment=data.get("deployment"))
        return Response(self.get_serializer(evaluation).data, status=status.HTTP_202_ACCEPTED)
