"""Evaluation sets (``/api/evaluation-sets/``: a file of multiple-choice items, reference answers or text, under your
data roots) and evaluations (``POST /api/evaluations/`` scores a checkpoint on a set with lm-evaluation-harness, run by
a worker; ``GET`` follows it: pending → running → done with the scores, or failed with why)."""
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from .. import models
from ..models import data_roots_for
from ..selectors.checkpoints import checkpoints_visible_to
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


class EvaluationSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    eval_set = VisibleRelatedField(queryset=models.EvaluationSet.objects.all(),
                                   help_text="An evaluation set visible to you")
    checkpoint = VisibleCheckpointField(queryset=models.Checkpoint.objects.all(),
                                        help_text="A checkpoint visible to you: trained by a run, or imported")
    run = serializers.IntegerField(source="checkpoint.run_id", read_only=True, allow_null=True,
                                   help_text="The run that saved the checkpoint; empty for an import")
    step = serializers.IntegerField(source="checkpoint.step", read_only=True)

    class Meta:
        model = models.Evaluation
        fields = ["id", "eval_set", "checkpoint", "run", "step", "status", "message", "scores", "owner",
                  "created_at", "finished_at"]
        read_only_fields = ["status", "message", "scores", "created_at", "finished_at"]


class EvaluationViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Evaluations of the checkpoints you may see: each one's set, checkpoint (with its run and step), status and
    scores."""

    queryset = models.Evaluation.objects.all()
    serializer_class = EvaluationSerializer
    permission_classes = [IsAuthenticated]
    filterset_fields = ["status", "checkpoint", "eval_set", "checkpoint__run"]
    ordering_fields = ["created_at"]

    def get_queryset(self):
        return evaluations_visible_to(self.request.user)

    @extend_schema(responses={202: EvaluationSerializer})
    def create(self, request, *args, **kwargs):
        """Score a checkpoint on an evaluation set (a worker runs `python -m trainer.evaluate`); 202 with the
        evaluation to follow."""
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        evaluation = evaluation_create(request.user, body.validated_data["eval_set"], body.validated_data["checkpoint"])
        return Response(self.get_serializer(evaluation).data, status=status.HTTP_202_ACCEPTED)
