"""REST representations of serving: Triton servers, deployments, prompt templates, and generation's requests and
answers. Sampling is bounded here, for this API and the OpenAI-compatible one alike (webapp.api.openai_requests)."""
import re
from pathlib import Path
from string import Formatter

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import URLValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from .. import models, services
from ..selectors.checkpoints import checkpoints_with_runs
from ..services.chat import chat_template_problem
from ..services.deployments import MAX_INSTANCES, MAX_TENSOR_PARALLEL, PROTOCOLS
from .fields import (StrictBooleanField, StrictCharField, StrictFloatField, StrictIntegerField,
                     StrictPrimaryKeyRelatedField, StrictSerializer, VisibleRelatedField)
from .serializers import OwnedSerializer, StrictModelSerializer

MAX_TOKENS = 4096
MAX_STOPS, MAX_STOP_CHARS = 8, 64
MAX_PROMPT_CHARS = 200_000
MAX_SEED = 2**63 - 1          # the model's seed input is a 64-bit integer
MAX_TOP_K = 2**31 - 1         # a 32-bit input
MAX_EXAMPLES = 64
_HOST_PORT = re.compile(r"^(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):\d{1,5}$")
_HTTP = URLValidator(schemes=["http", "https"])


def top_p_problem(value: float) -> str:
    return "" if 0 < value <= 1 else f"top_p={value}: give a number in (0, 1]"


@extend_schema_field({"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1})
class TopPField(StrictFloatField):
    """A top-p: the schema gives its range, top_p_problem checks it."""

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if top_p_problem(value):
            raise serializers.ValidationError(top_p_problem(value))
        return value


# -- Triton servers ---------------------------------------------------------------------------------------------

class TritonServerSerializer(StrictModelSerializer):
    class Meta:
        model = models.TritonServer
        fields = ["id", "name", "kind", "http_url", "grpc_url", "metrics_url", "model_repository", "instance_kind",
                  "is_ready",
                  "last_seen_at", "created_at"]
        read_only_fields = ["is_ready", "last_seen_at", "created_at"]

    def validate_http_url(self, value):
        try:
            _HTTP(value)
        except DjangoValidationError:
            raise serializers.ValidationError(f"{value!r}: give the server's HTTP URL, e.g. http://127.0.0.1:8000") \
                from None
        return value

    def validate_grpc_url(self, value):
        if value and not _HOST_PORT.match(value.removeprefix("grpc://")):
            raise serializers.ValidationError(f"{value!r}: give host:port, e.g. 127.0.0.1:8001, or leave it empty")
        return value

    def validate_metrics_url(self, value):
        if value:
            self.validate_http_url(value)
        return value

    def validate_model_repository(self, value):
        if not Path(value).is_absolute():
            raise serializers.ValidationError(f"{value!r}: give the repository folder's absolute path, as the "
                                              f"workers see it")
        return value


class ServerStatusSerializer(serializers.Serializer):
    """What a Triton server says of itself now."""

    ready = serializers.BooleanField(help_text="Whether the server says it is ready")
    metadata = serializers.DictField(help_text="The server's metadata: name, version, extensions")
    models = serializers.ListField(child=serializers.DictField(),
                                   help_text="The model repository's index: name, version, state, reason")


# -- checkpoints --------------------------------------------------------------------------------------------------

class CheckpointRegisterSerializer(StrictSerializer):
    """A checkpoint folder to register; an unknown key is refused."""

    path = StrictCharField(max_length=500, help_text="A checkpoint folder (with its manifest.json) under one of "
                                                     "your data roots")
    name = StrictCharField(max_length=120, required=False, default="", allow_blank=True,
                           help_text="A name for it; by default the folder's")


# -- prompt templates ---------------------------------------------------------------------------------------------

class SamplingDefaultsSerializer(StrictSerializer):
    """A template's default sampling: what a chat request leaves out is taken from here."""

    max_tokens = StrictIntegerField(required=False, min_value=1, max_value=MAX_TOKENS)
    temperature = StrictFloatField(required=False, min_value=0)
    top_k = StrictIntegerField(required=False, min_value=0, max_value=MAX_TOP_K)
    top_p = TopPField(required=False)
    seed = StrictIntegerField(required=False, min_value=0, max_value=MAX_SEED)


class ExampleSerializer(StrictSerializer):
    input = StrictCharField(max_length=10_000, trim_whitespace=False)
    output = StrictCharField(max_length=10_000, trim_whitespace=False)


@extend_schema_field(ExampleSerializer(many=True))
class ExamplesField(serializers.JSONField):
    """Few-shot examples, each {"input", "output"}, stored as JSON."""

    def to_internal_value(self, data):
        if not isinstance(data, list) or len(data) > MAX_EXAMPLES:
            raise serializers.ValidationError(f"give a list of at most {MAX_EXAMPLES} examples, each "
                                              f'{{"input": "…", "output": "…"}}')
        examples = ExampleSerializer(data=data, many=True)
        examples.is_valid(raise_exception=True)
        return [dict(e) for e in examples.validated_data]


@extend_schema_field(SamplingDefaultsSerializer)
class SamplingDefaultsField(serializers.JSONField):
    def to_internal_value(self, data):
        sampling = SamplingDefaultsSerializer(data=data)
        sampling.is_valid(raise_exception=True)
        return dict(sampling.validated_data)


class PromptTemplateSerializer(OwnedSerializer):
    template = StrictCharField(required=False, max_length=10_000, trim_whitespace=False,
                               help_text="The playground's prompt, with {examples} and {input}")
    chat_template = StrictCharField(required=False, max_length=1_000, trim_whitespace=False,
                                    help_text="One chat turn, with {role} and {content} (webapp.services.chat)")
    examples = ExamplesField(required=False, help_text="Few-shot examples: earlier user and assistant turns of "
                                                       "a chat")
    sampling = SamplingDefaultsField(required=False, help_text="Default sampling of a chat request")

    class Meta:
        model = models.PromptTemplate
        fields = ["id", "name", "template", "chat_template", "examples", "sampling", "shared", "owner",
                  "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def validate_template(self, value):
        try:
            names = {name for _, name, _, _ in Formatter().parse(value) if name is not None}
        except ValueError as exc:
            raise serializers.ValidationError(f"{exc}: write a literal brace as {{{{ or }}}}") from None
        if not names <= {"examples", "input"}:
            raise serializers.ValidationError("a template holds only {examples} and {input}")
        return value

    def validate_chat_template(self, value):
        problem = chat_template_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


# -- deployments --------------------------------------------------------------------------------------------------

class DeploymentSerializer(OwnedSerializer):
    unique_names = False  # deployments have no name of their own; model names are unique per server
    checkpoint = VisibleRelatedField(queryset=checkpoints_with_runs(),
                                     help_text="A checkpoint you may see: of your runs, a shared run, or imported")
    server = StrictPrimaryKeyRelatedField(queryset=models.TritonServer.objects.all())
    model_name = StrictCharField(max_length=100, help_text="The name Triton serves it under, and the model's id on "
                                                           "/v1: letters, digits, '-' and '_'")
    reduction = serializers.ChoiceField(choices=models.Deployment.Reduction.choices, default="none")
    engine = serializers.ChoiceField(choices=models.Deployment.Engine.choices, default="workbench",
                                     help_text="What serves it in Triton: workbench (any model) or vllm (refused, "
                                               "with the reason, for a model vLLM cannot serve)")
    prompt_template = VisibleRelatedField(queryset=models.PromptTemplate.objects.all(), required=False,
                                          allow_null=True, default=None)

    class Meta:
        model = models.Deployment
        fields = ["id", "checkpoint", "server", "model_name", "engine", "reduction", "tensor_parallel", "instances",
                  "streaming", "prompt_template", "shared", "owner", "status", "status_message", "repository_path",
                  "report", "smoke_ok", "ready_at", "unloaded_at", "created_at", "updated_at"]
        read_only_fields = ["status", "status_message", "repository_path", "report", "smoke_ok", "ready_at",
                            "unloaded_at", "created_at", "updated_at"]
        extra_kwargs = {"tensor_parallel": {"min_value": 1, "max_value": MAX_TENSOR_PARALLEL},
                        "instances": {"min_value": 1, "max_value": MAX_INSTANCES}}
        validators = []  # a model name in use is refused by deployment_create, naming the field and the server

    def create(self, validated_data):
        return services.deployment_create(owner=self.context["request"].user, **validated_data)


class SamplingSerializer(StrictSerializer):
    """How the answer is sampled; an unknown key is refused."""

    max_tokens = StrictIntegerField(default=64, min_value=1, max_value=MAX_TOKENS)
    temperature = StrictFloatField(default=0.0, min_value=0, help_text="0: greedy")
    top_k = StrictIntegerField(default=0, min_value=0, max_value=MAX_TOP_K, help_text="0: no limit")
    top_p = TopPField(default=1.0, help_text="In (0, 1]; 1: no limit")
    seed = StrictIntegerField(default=None, allow_null=True, min_value=0, max_value=MAX_SEED)
    stop = serializers.ListField(child=StrictCharField(min_length=1, max_length=MAX_STOP_CHARS,
                                                       trim_whitespace=False),
                                 default=list, max_length=MAX_STOPS,
                                 help_text=f"Strings that end the answer (not included): at most {MAX_STOPS}, "
                                           f"each of 1 to {MAX_STOP_CHARS} characters")


class GenerateSerializer(SamplingSerializer):
    """A prompt to complete, how to sample the answer, and whether to stream it; an unknown key is refused."""

    prompt = StrictCharField(max_length=MAX_PROMPT_CHARS, trim_whitespace=False)
    protocol = serializers.ChoiceField(choices=PROTOCOLS, required=False,
                                       help_text="How the web app asks Triton; by default HTTP, streams too")
    stream = StrictBooleanField(default=False, help_text="Answer as server-sent events: `token` events, then "
                                                         "`done` (or `error`)")


class GenerationSerializer(serializers.Serializer):
    """The whole answer: its text and tokens, the prompt's and the answer's token counts, and why it ended."""

    text = serializers.CharField()
    token_ids = serializers.ListField(child=serializers.IntegerField())
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    finish_reason = serializers.CharField(help_text="stop, length or cancelled")
