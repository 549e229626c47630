"""Thin REST views: querysets limited to what the user may see, writes through serializers and services."""
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from .. import models, services
from . import filters
from .permissions import IsOwnerOrStaffToChange, IsStaffOrReadOnly
from .serializers import (CheckpointSerializer, ClusterSerializer, DatasetSerializer, MetricSerializer,
                          ModelConfigSerializer, ParallelismPlanSerializer, ProfileSerializer, RunSerializer)


class OwnedViewSet(viewsets.ModelViewSet):
    permission_classes = [IsAuthenticated, IsOwnerOrStaffToChange]
    ordering_fields = ["created_at", "name"]

    def get_queryset(self):
        return self.queryset.visible_to(self.request.user).select_related("owner")


class ModelConfigViewSet(OwnedViewSet):
    """GPT model configs (dense or mixture-of-experts), from a preset or a full spec."""

    queryset = models.ModelConfig.objects.all()
    serializer_class = ModelConfigSerializer
    filterset_fields = ["shared"]


class ParallelismPlanViewSet(OwnedViewSet):
    """Parallelism plans: dp/tp/pp/sp/ep degrees, ZeRO, batches, checkpointing, precision, schedule."""

    queryset = models.ParallelismPlan.objects.all()
    serializer_class = ParallelismPlanSerializer
    filterset_fields = ["model_config", "cluster", "shared"]


class DatasetViewSet(OwnedViewSet):
    queryset = models.Dataset.objects.all()
    serializer_class = DatasetSerializer
    filterset_fields = ["shared"]


class ClusterViewSet(viewsets.ModelViewSet):
    """Clusters: every user reads them; staff create and change them."""

    queryset = models.Cluster.objects.all()
    serializer_class = ClusterSerializer
    permission_classes = [IsAuthenticated, IsStaffOrReadOnly]
    filterset_fields = ["kind"]
    ordering_fields = ["name", "created_at"]


class CancelSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, default="cancelled by user", max_length=500)


class RunViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                 viewsets.GenericViewSet):
    """Training runs: create (as a draft, or queued with `launch`), list with filters, retrieve, launch, cancel."""

    queryset = models.Run.objects.all()
    serializer_class = RunSerializer
    permission_classes = [IsAuthenticated, IsOwnerOrStaffToChange]
    filterset_class = filters.RunFilter
    ordering_fields = ["created_at", "name", "status", "finished_at"]

    def get_queryset(self):
        return models.Run.objects.visible_to(self.request.user).select_related("owner")

    @extend_schema(request=None, responses=RunSerializer)
    @action(detail=True, methods=["post"])
    def launch(self, request, pk=None):
        run = self.get_object()
        self.check_object_permissions(request, run)
        run = services.run_queue(run)
        return Response(RunSerializer(run, context={"request": request}).data)

    @extend_schema(request=CancelSerializer, responses=RunSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        run = self.get_object()
        body = CancelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = services.run_cancel(run, body.validated_data["reason"])
        return Response(RunSerializer(run, context={"request": request}).data)


class RunChildViewSet(viewsets.ReadOnlyModelViewSet):
    """Read-only records of runs the user may see."""

    ordering_fields = ["step", "created_at"]

    def get_queryset(self):
        visible_runs = models.Run.objects.visible_to(self.request.user)
        return self.queryset.filter(run__in=visible_runs)


class MetricViewSet(RunChildViewSet):
    queryset = models.Metric.objects.all()
    serializer_class = MetricSerializer
    filterset_class = filters.MetricFilter
    ordering_fields = ["step", "recorded_at"]


class CheckpointViewSet(RunChildViewSet):
    queryset = models.Checkpoint.objects.all()
    serializer_class = CheckpointSerializer
    filterset_fields = ["run"]


class ProfileViewSet(RunChildViewSet):
    queryset = models.Profile.objects.all()
    serializer_class = ProfileSerializer
    filterset_fields = ["run"]
    ordering_fields = ["name", "created_at"]
