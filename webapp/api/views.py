"""Thin REST views: querysets limited to what the user may see, writes through serializers and services."""
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.parsers import MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from .. import models, services
from ..selectors.checkpoints import checkpoints_visible_to
from ..selectors.goodput import clusters_goodput, goodput_of
from ..selectors.owned import visible_with_owners
from ..selectors.runs import records_of_visible_runs, runs_listed
from ..services.datasets import NotReadable, UploadTooLarge, upload_limit
from . import filters
from .calibration import ClusterCalibrationActions
from .conversions import CheckpointConversionActions
from .errors import Conflict
from .live import RunLiveData
from .fields import StrictCharField
from .parsers import RequestTooLarge
from .preparations import DatasetPreparationActions
from .permissions import IsOwnerOrStaffToChange, IsStaffOrReadOnly
from .serving_serializers import CheckpointRegisterSerializer
from .serializers import (CheckpointSerializer, ClusterSerializer, DatasetSerializer, DatasetUploadSerializer,
                          GoodputSerializer, MetricSerializer, ModelConfigSerializer, ParallelismPlanSerializer,
                          ProfileSerializer, RunSerializer)

FORM_OVERHEAD_BYTES = 64 * 1024  # a multipart body's boundaries, headers and form fields beside the file


class OwnedViewSet(viewsets.ModelViewSet):
    permission_classes = [IsAuthenticated, IsOwnerOrStaffToChange]
    ordering_fields = ["created_at", "name"]

    def get_queryset(self):
        return visible_with_owners(self.queryset, self.request.user)


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


class DatasetViewSet(DatasetPreparationActions, OwnedViewSet):
    """Datasets: a text, JSONL, Parquet or Megatron file or folder under one of your data roots, registered by path, or
    a file uploaded; each prepared ahead of its runs when asked."""

    queryset = models.Dataset.objects.all()
    serializer_class = DatasetSerializer
    filterset_class = filters.DatasetFilter

    @extend_schema(request={"multipart/form-data": DatasetUploadSerializer}, responses={201: DatasetSerializer})
    @action(detail=False, methods=["post"], parser_classes=[MultiPartParser])
    def upload(self, request):
        """Upload a file (UTF-8 text or JSONL, JSONL compressed with gzip or zstd, or Parquet, by its name) into
        your own upload folder and register it as a dataset."""
        limit = upload_limit()
        declared = request.META.get("CONTENT_LENGTH") or "0"
        if declared.isdigit() and int(declared) > limit + FORM_OVERHEAD_BYTES:  # refused before a byte is read
            raise RequestTooLarge(f"the upload is {int(declared):,} bytes; files of at most {limit:,} bytes are "
                                  f"taken (WORKBENCH_MAX_UPLOAD_MB): split the file, or ask staff for a data root "
                                  f"that holds it")
        body = DatasetUploadSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        fields = dict(body.validated_data)
        try:
            dataset = services.dataset_upload(owner=request.user, upload=fields.pop("file"), **fields)
        except UploadTooLarge as exc:
            raise RequestTooLarge(str(exc)) from None
        except NotReadable as exc:
            raise serializers.ValidationError({"file": [str(exc)]}) from None
        return Response(DatasetSerializer(dataset, context={"request": request}).data, status=status.HTTP_201_CREATED)


class ClusterViewSet(ClusterCalibrationActions, viewsets.ModelViewSet):
    """Clusters: every user reads them and their calibration; staff create and change them and ask for refits."""

    queryset = models.Cluster.objects.all()
    serializer_class = ClusterSerializer
    permission_classes = [IsAuthenticated, IsStaffOrReadOnly]
    filterset_fields = ["kind", "name"]
    ordering_fields = ["name", "created_at"]

    @extend_schema(responses=GoodputSerializer)
    @action(detail=True, methods=["get"])
    def goodput(self, request, pk=None):
        """The goodput of all runs on the cluster together, in GPU seconds; 404 while none has held nodes."""
        cluster = self.get_object()
        found = clusters_goodput([cluster]).get(cluster.pk)
        if found is None:
            raise NotFound("no run on this cluster has held nodes yet")
        return Response(found.to_dict())


class CancelSerializer(serializers.Serializer):
    reason = StrictCharField(required=False, max_length=500,
                             help_text="Why, for the run's history; by default who cancelled it")


class RunViewSet(RunLiveData, mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                 viewsets.GenericViewSet):
    """Training runs: create (as a draft, or queued with `launch`), list with filters, retrieve, launch, cancel;
    and their live data (webapp.api.live)."""

    queryset = models.Run.objects.all()
    serializer_class = RunSerializer
    permission_classes = [IsAuthenticated, IsOwnerOrStaffToChange]
    filterset_class = filters.RunFilter
    ordering_fields = ["created_at", "name", "status", "finished_at"]

    def get_queryset(self):
        return runs_listed(self.request.user)

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
        try:
            run = services.run_cancel(run, body.validated_data.get("reason") or f"cancelled by {request.user.username}")
        except DjangoValidationError as exc:  # the run has finished: its state, not the request, is in the way
            raise Conflict(exc.messages[0]) from None
        return Response(RunSerializer(run, context={"request": request}).data)

    @extend_schema(responses=GoodputSerializer)
    @action(detail=True, methods=["get"])
    def goodput(self, request, pk=None):
        """How much of the time the run's attempts held their nodes went into steps that were kept, and where the
        rest went: queue, start-up, checkpoint load and save, evaluation, steps redone, time lost to each failure."""
        return Response(goodput_of(self.get_object()).to_dict())


class RunChildViewSet(viewsets.ReadOnlyModelViewSet):
    """Read-only records of runs the user may see."""

    ordering_fields = ["step", "created_at"]

    def get_queryset(self):
        return records_of_visible_runs(self.queryset, self.request.user)


class MetricViewSet(RunChildViewSet):
    queryset = models.Metric.objects.all()
    serializer_class = MetricSerializer
    filterset_class = filters.MetricFilter
    ordering_fields = ["step", "recorded_at"]


class CheckpointViewSet(CheckpointConversionActions, RunChildViewSet):
    """Checkpoints: saved by runs you may see, registered by you from a folder (`register`) or imported from a
    Hugging Face model folder (`import-hf`); each exported to the Hugging Face layout (`export-hf`)."""

    queryset = models.Checkpoint.objects.all()
    serializer_class = CheckpointSerializer
    filterset_fields = ["run"]

    def get_queryset(self):
        return checkpoints_visible_to(self.request.user)

    @extend_schema(request=CheckpointRegisterSerializer, responses={201: CheckpointSerializer,
                                                                    200: CheckpointSerializer})
    @action(detail=False, methods=["post"], filter_backends=[])
    def register(self, request):
        """Register a checkpoint folder trained elsewhere (it must lie under one of your data roots and hold a
        complete checkpoint); 200 with the earlier registration if you registered the folder before."""
        body = CheckpointRegisterSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        checkpoint, created = services.checkpoint_import_register(request.user, **body.validated_data)
        return Response(CheckpointSerializer(checkpoint, context={"request": request}).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class ProfileViewSet(RunChildViewSet):
    queryset = models.Profile.objects.all()
    serializer_class = ProfileSerializer
    filterset_fields = ["run"]
    ordering_fields = ["name", "created_at"]
