"""Preparing a dataset ahead of its runs: ``POST /api/datasets/<id>/prepare/`` starts it, ``GET
/api/datasets/<id>/preparations/`` follows it (pending → running → done or failed, with the bad-row report)."""
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from .. import models
from ..selectors.jobs import dataset_preparations
from ..services.preparations import MAX_VOCAB, dataset_prepare
from .fields import StrictIntegerField, StrictPrimaryKeyRelatedField, StrictSerializer


class PrepareSerializer(StrictSerializer):
    vocab = StrictIntegerField(min_value=1, max_value=MAX_VOCAB,
                               help_text="The vocab_size of the model that will train on it: a new tokenizer gets as "
                                         "many tokens (the dataset's tokenizer_vocab, when set, instead), and the "
                                         "runs of such a model reuse what this prepares")
    cluster = StrictPrimaryKeyRelatedField(
        queryset=models.Cluster.objects.all(), required=False, allow_null=True,
        help_text="A Slurm cluster: the preparation runs there as a batch job of its own (WORKBENCH_PREPARE_CPUS "
                  "CPUs on one node); none or a local cluster: a worker runs it as a process")


class DatasetPreparationSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    bad_rows = serializers.JSONField(read_only=True, help_text="Rows read, bad ones, and the first few with their "
                                                               "places; empty when the source was not read")

    class Meta:
        model = models.DatasetPreparation
        fields = ["id", "dataset", "status", "message", "owner", "vocab", "cluster", "job_id", "bad_rows", "report",
                  "created_at", "finished_at"]
        read_only_fields = fields


class DatasetPreparationActions:
    """The dataset view set's preparation actions."""

    @extend_schema(request=PrepareSerializer, responses={202: DatasetPreparationSerializer})
    @action(detail=True, methods=["post"])
    def prepare(self, request, pk=None):
        """Tokenize the dataset into the trainer's files now, as a job of its own (a worker runs `python -m
        trainer.data prepare`): its bad rows and size are known before any run; 202 with the preparation."""
        body = PrepareSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        preparation = dataset_prepare(request.user, self.get_object(), body.validated_data["vocab"],
                                      body.validated_data.get("cluster"))
        return Response(DatasetPreparationSerializer(preparation).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=DatasetPreparationSerializer(many=True))
    @action(detail=True, methods=["get"], filter_backends=[])
    def preparations(self, request, pk=None):
        """The dataset's preparations, newest first."""
        found = dataset_preparations(self.get_object())
        return self.get_paginated_response(DatasetPreparationSerializer(self.paginate_queryset(found),
                                                                        many=True).data)
