"""Imports of Hugging Face models and exports to the Hugging Face layout: the requests that start them
(``POST /api/checkpoints/import-hf/``, ``POST /api/checkpoints/<id>/export-hf/``) and the conversions to follow
(``GET /api/conversions/<id>/``: pending → running → done or failed, with the process's last error line)."""
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from .. import models
from ..selectors.lineage import conversions_visible_to
from ..services import conversions
from .fields import StrictCharField, StrictSerializer


class ImportHFSerializer(StrictSerializer):
    """A Hugging Face model folder on the server to import; an unknown key is refused."""

    path = StrictCharField(max_length=500, help_text="The absolute path of a model folder (config.json, weights, "
                                                     "tokenizer) inside the server's models directory")
    name = StrictCharField(max_length=120, required=False, default="", allow_blank=True,
                           help_text="A name for the checkpoint; by default the folder's")


class ConversionSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)

    class Meta:
        model = models.CheckpointConversion
        fields = ["id", "kind", "status", "message", "owner", "name", "source", "target", "checkpoint", "report",
                  "created_at", "finished_at"]
        read_only_fields = fields


class ConversionViewSet(viewsets.ReadOnlyModelViewSet):
    """Imports and exports you started (staff: everyone's): where each stands, and what it made."""

    queryset = models.CheckpointConversion.objects.all()
    serializer_class = ConversionSerializer
    permission_classes = [IsAuthenticated]
    filterset_fields = ["kind", "status", "checkpoint"]
    ordering_fields = ["created_at"]

    def get_queryset(self):
        return conversions_visible_to(self.request.user)


class CheckpointConversionActions:
    """The checkpoint view set's import and export actions."""

    @extend_schema(request=ImportHFSerializer, responses={202: ConversionSerializer})
    @action(detail=False, methods=["post"], url_path="import-hf", filter_backends=[])
    def import_hf(self, request):
        """Import a Hugging Face model folder from the server's models directory as a checkpoint of yours (a
        worker runs `python -m deploy import-hf`); 202 with the conversion to follow."""
        body = ImportHFSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        conversion = conversions.checkpoint_import_hf(request.user, **body.validated_data)
        return Response(ConversionSerializer(conversion).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: ConversionSerializer})
    @action(detail=True, methods=["post"], url_path="export-hf")
    def export_hf(self, request, pk=None):
        """Export the checkpoint to the Hugging Face layout on the server (a worker runs `python -m deploy
        export-hf`); 202 with the conversion to follow. The folder is recorded on the checkpoint when done."""
        conversion = conversions.checkpoint_export_hf(request.user, self.get_object())
        return Response(ConversionSerializer(conversion).data, status=status.HTTP_202_ACCEPTED)
