"""An OpenAI-compatible API on /v1 for the ready deployments: models, completions and chat completions.

    GET  /v1/models              the ready deployments you may use (your own and shared ones)
    GET  /v1/models/<model>
    POST /v1/completions         {model, prompt, max_tokens=16, temperature=1, top_p=1, stop, seed, stream,
                                  logprobs, echo, presence_penalty, frequency_penalty, response_format, n=1, …}
    POST /v1/chat/completions    {model, messages, max_tokens, temperature, top_p, stop, seed, stream,
                                  logprobs, top_logprobs, presence_penalty, frequency_penalty, response_format,
                                  tools, tool_choice, n=1, …}

Answers follow OpenAI's JSON exactly (webapp.api.openai_answers): ids ``cmpl-…`` and ``chatcmpl-…``, ``n`` choices
(up to 16, answer i drawn with seed + i where a seed is given: webapp.services.choices), ``usage``; a stream is
server-sent ``data: {chunk}`` events ending with ``data: [DONE]``. Authenticate
with ``Authorization: Bearer <key>``, the key being your API token (POST /api/token/). Errors are OpenAI's
``{"error": {message, type, param, code}}`` (webapp.api.openai_errors), this API's own documentation being OpenAI's.

Log-probabilities are the model's own (before temperature, penalties and the rest of sampling), as vLLM gives them.
A ``response_format`` of ``json_object`` or ``json_schema`` holds the answer to JSON (of that schema) by guided
decoding in the engine (llguidance in both); a chat's ``tools`` are shown to the model and a forced call
(``tool_choice`` "required" or named) is decoded against the tool's schema, the answer read back as ``tool_calls``
(webapp.services.tools). A deployment exported before its server could do one of these answers a 400 naming the
field (``logprobs``, ``echo``, ``presence_penalty``, ``response_format``, …), until its checkpoint is deployed
again.

A model is a deployment's ``model_name``. Names are unique on a server, not across servers: where several ready
deployments you may use share a name, your own newest one answers, else the newest.

A chat is written as one prompt by the deployment's prompt template and stopped where the user's next turn would
begin (webapp.services.chat, which shows the default format); what the request leaves out of max_tokens,
temperature, top_k, top_p and seed comes from the template's ``sampling``, else OpenAI's defaults (a chat answer is
at most CHAT_MAX_TOKENS tokens unless told otherwise).

A prompt and max_tokens beyond the model's context are refused with OpenAI's ``context_length_exceeded`` (400,
naming the field), or the prompt is cut to its last ``truncate_prompt_tokens`` tokens where the request asks for it
(vLLM's field); a max_tokens left out is lowered to what the context leaves (webapp.services.context_window).
"""
from django.db.models import Case, IntegerField, Value, When
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.authentication import TokenAuthentication
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from deploy.client import ADDED_IN, GenerateParams

from .. import models
from ..models.serving import DEFAULT_CHAT_TEMPLATE
from ..selectors.deployments import deployments_visible_to
from ..services.chat import chat_prompt
from ..services.choices import choice_params, generate_choices, stream_choices
from ..services.context_window import fit_prompt
from ..services.triton import ServingUnavailable
from .openai_answers import Answer
from .openai_errors import ModelNotFound, error_body, exception_handler
from .openai_requests import CHAT_MAX_TOKENS, COMPLETION_MAX_TOKENS, ChatRequest, CompletionRequest
from .outside_transaction import OutsideRequestTransaction
from .sse import EventStreamRenderer, event, event_stream

Deployment = models.Deployment
OPENAI_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": None}


class BearerTokenAuthentication(TokenAuthentication):
    keyword = "Bearer"


class DataEventRenderer(EventStreamRenderer):
    """An error answered to a client that accepts only event streams: one unnamed event, as OpenAI's are."""

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return event(data)


@extend_schema(exclude=True)  # documented by OpenAI's API reference, not in this API's schema
class OpenAIView(OutsideRequestTransaction, APIView):
    authentication_classes = [BearerTokenAuthentication]
    permission_classes = [IsAuthenticated]
    renderer_classes = [JSONRenderer, DataEventRenderer]

    def get_exception_handler(self):
        return exception_handler


def _deployment(user, model: str) -> Deployment:
    """The ready deployment ``model`` names for ``user``; ModelNotFound, or ServingUnavailable while it is still
    being deployed."""
    candidates = deployments_visible_to(user).filter(model_name=model)
    mine_first = Case(When(owner=user, then=Value(0)), default=Value(1), output_field=IntegerField())
    ready = candidates.filter(status=Deployment.Status.READY).order_by(mine_first, "-ready_at", "-id").first()
    if ready is not None:
        return ready
    coming = candidates.filter(status__in=Deployment.HOLDING).order_by(mine_first, "-id").first()
    if coming is not None:
        raise ServingUnavailable(f"model {model!r} is not ready yet (deployment {coming.pk} is {coming.status}: "
                                 f"{coming.status_message}); try again when it is")
    raise ModelNotFound(f"The model `{model}` does not exist or you do not have access to it (GET /v1/models "
                        f"lists the ready ones).")


def _model(deployment: Deployment) -> dict:
    when = deployment.ready_at or deployment.created_at
    return {"id": deployment.model_name, "object": "model", "created": int(when.timestamp()),
            "owned_by": deployment.owner.username}


class ModelsView(OpenAIView):
    def get(self, request):
        seen, data = set(), []
        ready = deployments_visible_to(request.user).filter(status=Deployment.Status.READY)
        for deployment in ready.order_by("model_name", "-ready_at"):
            if deployment.model_name not in seen:
                seen.add(deployment.model_name)
                data.append(_model(deployment))
        return Response({"object": "list", "data": data})


class ModelView(OpenAIView):
    def get(self, request, model):
        return Response(_model(_deployment(request.user, model)))


def _answer(answer: Answer, deployment: Deployment, params: GenerateParams, n: int, stream: bool):
    asks = choice_params(params, n)
    if stream:
        return event_stream(answer.events(stream_choices(deployment, asks), n))
    return Response(answer.whole(generate_choices(deployment, asks)))


def _include_usage(body: dict) -> bool:
    return bool((body.get("stream_options") or {}).get("include_usage"))


def _shared(body: dict) -> dict:
    """What both endpoints send alike: the penalties and the guide of a response_format."""
    return {"presence_penalty": body["presence_penalty"], "frequency_penalty": body["frequency_penalty"],
            "guide": body["response_format"]}


def _served(deployment: Deployment, params: GenerateParams, asked_by: dict[str, str] | None = None) -> GenerateParams:
    """``params``, if the deployment's entry takes each input they use; a 400 naming the request's field
    (``asked_by``: input → field, where they differ) where its entry was exported before that input existed."""
    interface = int(deployment.report.get("interface", 1))
    for name in params.optional_inputs:
        if ADDED_IN[name] > interface:
            field = (asked_by or {}).get(name, name)
            raise serializers.ValidationError({field: [
                f"model {deployment.model_name!r} was deployed before its server could answer {field}: deploy its "
                f"checkpoint again (deployment {deployment.pk}), or leave {field} out"]})
    return params


class CompletionsView(OpenAIView):
    def post(self, request):
        body = CompletionRequest(data=request.data)
        body.is_valid(raise_exception=True)
        body = {**OPENAI_DEFAULTS, **body.validated_data}
        deployment = _deployment(request.user, body["model"])
        fitted = fit_prompt(deployment, body["prompt"], max_tokens=body.get("max_tokens"),
                            default_max_tokens=COMPLETION_MAX_TOKENS,
                            truncate_prompt_tokens=body.get("truncate_prompt_tokens"), prompt_param="prompt")
        logprobs = body.get("logprobs")
        params = GenerateParams(prompt=fitted.prompt, max_tokens=fitted.max_tokens,
                                temperature=body["temperature"], top_k=body["top_k"], top_p=body["top_p"],
                                seed=body["seed"], stop=tuple(body.get("stop", ())), logprobs=logprobs,
                                prompt_logprobs=logprobs if body["echo"] else None, **_shared(body))
        params = _served(deployment, params, {"prompt_logprobs": "echo", "guide": "response_format"})
        answer = Answer("text", deployment.model_name, _include_usage(body), fitted.prompt if body["echo"] else None)
        return _answer(answer, deployment, params, body["n"], body["stream"])


class ChatCompletionsView(OpenAIView):
    def post(self, request):
        body = ChatRequest(data=request.data)
        body.is_valid(raise_exception=True)
        body = body.validated_data
        deployment = _deployment(request.user, body["model"])
        template = deployment.prompt_template
        defaults = {**OPENAI_DEFAULTS, "max_tokens": CHAT_MAX_TOKENS}
        defaults.update({k: v for k, v in (template.sampling if template else {}).items() if k in defaults})
        sampling = {**defaults, **{k: v for k, v in body.items() if k in defaults}}
        tools = body["tools"]
        chat = chat_prompt(body["messages"], template.chat_template if template else DEFAULT_CHAT_TEMPLATE,
                           template.examples if template else (), tools)
        named = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"  # OpenAI's newer name
        fitted = fit_prompt(deployment, chat.prompt, max_tokens=body.get(named),
                            default_max_tokens=defaults["max_tokens"],
                            truncate_prompt_tokens=body.get("truncate_prompt_tokens"), prompt_param="messages",
                            max_tokens_param=named)
        params = GenerateParams(prompt=fitted.prompt, max_tokens=fitted.max_tokens,
                                temperature=sampling["temperature"], top_k=sampling["top_k"],
                                top_p=sampling["top_p"], seed=sampling["seed"],
                                stop=(chat.stop, *body.get("stop", ())),
                                logprobs=body.get("top_logprobs", 0) if body["logprobs"] else None,
                                **{**_shared(body), "guide": body["response_format"] or tools.guide()})
        params = _served(deployment, params, {"guide": "tool_choice" if tools.forced else "response_format"})
        answer = Answer("chat", deployment.model_name, _include_usage(body), tools=tools)
        return _answer(answer, deployment, params, body["n"], body["stream"])


class NotFoundView(OpenAIView):
    """Any other path under /v1: OpenAI's 404, not the web app's page."""

    authentication_classes = []
    permission_classes = []

    def _not_found(self, request, *args, **kwargs):
        return Response(error_body(f"Unknown request URL: {request.method} {request.path}", code="unknown_url"),
                        status=404)

    get = post = put = patch = delete = _not_found
