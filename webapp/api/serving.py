"""Serving over REST: Triton servers and their status, deployments (create, undeploy) and generation with them,
prompt templates.

Generation answers JSON, or with ``stream: true`` server-sent events: one ``token`` event a chunk ({text,
token_ids}), then ``done`` with the whole answer and its counts, or ``error`` ({detail}) if Triton fails mid-way.
A deployment that cannot answer (not ready, its server unreachable, its model not loaded) is a 503 with a message,
before any event is sent.
"""
from typing import Iterator

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.response import Response

from deploy.client import Chunk, GenerateParams

from .. import models, services
from ..selectors.deployments import deployments_visible_to
from ..services.triton import ServingError
from .outside_transaction import OutsideRequestTransaction
from .permissions import IsOwnerOrStaffToChange, IsStaffOrReadOnly
from .serving_serializers import (DeploymentSerializer, GenerateSerializer, GenerationSerializer,
                                  PromptTemplateSerializer, ServerStatusSerializer, TritonServerSerializer)
from .sse import EventStreamRenderer, event, event_stream
from .views import OwnedViewSet

UNAVAILABLE = OpenApiResponse(description="the model cannot answer now: the deployment is not ready, its Triton "
                                          "server cannot be reached, or the model is not loaded")
SERVER_FAILED = OpenApiResponse(description="the Triton server failed to answer")


class TritonServerViewSet(viewsets.ModelViewSet):
    """Triton Inference Servers: every user reads them; staff create and change them."""

    queryset = models.TritonServer.objects.all()
    serializer_class = TritonServerSerializer
    permission_classes = [IsAuthenticated, IsStaffOrReadOnly]
    filterset_fields = ["kind"]
    ordering_fields = ["name", "created_at"]


class TritonServerStatusView(OutsideRequestTransaction, GenericAPIView):
    """Whether a Triton server is ready, its metadata and its model repository's index, asked of it now."""

    queryset = models.TritonServer.objects.all()
    permission_classes = [IsAuthenticated]
    filter_backends = []
    pagination_class = None
    serializer_class = ServerStatusSerializer

    @extend_schema(responses={200: ServerStatusSerializer, 502: SERVER_FAILED,
                              503: OpenApiResponse(description="the server cannot be reached")})
    def get(self, request, pk):
        return Response(services.triton_server_status(self.get_object()))


class DeploymentViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                        viewsets.GenericViewSet):
    """Deployments of checkpoints on Triton servers: create one (a worker exports, loads and smoke-checks it),
    list, retrieve, undeploy."""

    queryset = models.Deployment.objects.all()
    serializer_class = DeploymentSerializer
    permission_classes = [IsAuthenticated, IsOwnerOrStaffToChange]
    filterset_fields = ["status", "server", "checkpoint", "shared", "engine"]
    ordering_fields = ["created_at", "model_name", "status"]

    def get_queryset(self):
        return deployments_visible_to(self.request.user)

    @extend_schema(request=None, responses=DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def undeploy(self, request, pk=None):
        """Unload the model from its server; the deployment becomes unloaded once a worker has done it."""
        deployment = services.deployment_undeploy(self.get_object())
        return Response(DeploymentSerializer(deployment, context={"request": request}).data)


def _params(body: dict) -> GenerateParams:
    return GenerateParams(prompt=body["prompt"], max_tokens=body["max_tokens"], temperature=body["temperature"],
                          top_k=body["top_k"], top_p=body["top_p"], seed=body["seed"], stop=tuple(body["stop"]))


def _events(chunks: Iterator[Chunk]) -> Iterator[bytes]:
    text, token_ids, last = [], [], None
    try:
        for chunk in chunks:
            if chunk.text or chunk.token_ids:
                yield event({"text": chunk.text, "token_ids": chunk.token_ids}, "token")
            text.append(chunk.text)
            token_ids += chunk.token_ids
            last = chunk
        yield event({"text": "".join(text), "token_ids": token_ids, "prompt_tokens": last.prompt_tokens,
                     "completion_tokens": last.completion_tokens, "finish_reason": last.finish_reason}, "done")
    except ServingError as exc:
        yield event({"detail": exc.message}, "error")
    finally:
        chunks.close()  # a client gone mid-stream: the request is cancelled on the server


class DeploymentGenerateView(OutsideRequestTransaction, GenericAPIView):
    """Generate with a ready deployment you may see."""

    permission_classes = [IsAuthenticated]  # generating changes nothing: whoever sees a deployment may use it
    filter_backends = []
    pagination_class = None
    serializer_class = GenerateSerializer
    renderer_classes = [JSONRenderer, BrowsableAPIRenderer, EventStreamRenderer]

    def get_queryset(self):
        return deployments_visible_to(self.request.user)

    @extend_schema(request=GenerateSerializer, responses={
        (200, "application/json"): GenerationSerializer,
        (200, "text/event-stream"): OpenApiResponse(OpenApiTypes.OBJECT, description=(
            "with stream: `event: token` a chunk ({text, token_ids}), then `event: done` ({text, token_ids, "
            "prompt_tokens, completion_tokens, finish_reason}), or `event: error` ({detail})")),
        502: SERVER_FAILED, 503: UNAVAILABLE})
    def post(self, request, pk):
        deployment = self.get_object()
        body = GenerateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        body = body.validated_data
        if body["stream"]:
            chunks = services.deployment_stream(deployment, _params(body), body.get("protocol"))
            return event_stream(_events(chunks))
        completion = services.deployment_generate(deployment, _params(body), body.get("protocol"))
        return Response(GenerationSerializer(completion).data)


class PromptTemplateViewSet(OwnedViewSet):
    """Prompt templates: a playground prompt, few-shot examples, a chat turn's format, default sampling."""

    queryset = models.PromptTemplate.objects.all()
    serializer_class = PromptTemplateSerializer
    filterset_fields = ["shared"]
