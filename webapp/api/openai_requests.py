"""The request bodies of the OpenAI-compatible endpoints (webapp.api.openai), checked as OpenAI checks them.

Log-probabilities as OpenAI's two endpoints ask for them: a completion's ``logprobs`` (k: the k most likely tokens
beside each; with ``echo``, the prompt's too), a chat's ``logprobs: true`` with ``top_logprobs`` (k). A
``response_format`` becomes the engines' guide; a chat's ``tools`` and ``tool_choice`` a ``Tools``
(webapp.services.tools), each JSON schema checked first (``jsonschema``).

A null is the same as a field left out (OpenAI's clients send either). A field this server does not know is refused
("Unrecognized request argument supplied"), as OpenAI does; one it knows but does not implement is accepted at its
neutral value only (``best_of: 1``, ``logit_bias: {}``, …), and refused otherwise, so that no request is
silently answered as if it had asked for less; so is a key of a message or of stream_options it does not read.
``user`` is accepted and ignored. Sampling is bounded as in the deployments' own API
(webapp.api.serving_serializers); ``top_k`` is this server's addition, ``truncate_prompt_tokens`` vLLM's (the
prompt cut from the left to its last tokens: webapp.services.context_window, which also bounds max_tokens by the
model's context).
"""
import json
import re

import jsonschema
from rest_framework import serializers

from .fields import StrictBooleanField, StrictCharField, StrictFloatField, StrictIntegerField
from ..services.tools import Tools
from .serving_serializers import (MAX_PROMPT_CHARS, MAX_SEED, MAX_STOP_CHARS, MAX_STOPS, MAX_TOKENS, MAX_TOP_K,
                                  top_p_problem)

MAX_MESSAGES = 256
CHAT_MAX_TOKENS = 256   # OpenAI answers until the context is full; this server stops here unless told otherwise
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_TOOLS = 32
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Known fields this server does not implement, and the values that ask for nothing (accepted).
NEUTRAL = {"best_of": (1,),
           "logit_bias": ({},), "suffix": ("",),
           "parallel_tool_calls": (True, False), "store": (False,), "metadata": ({},), "service_tier": ("auto",)}
IGNORED = ("user",)
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_CHOICES = 16   # answers to one request (n), at most
MAX_LOGPROBS = 20  # the most likely tokens listed beside each token (the engines' bound: deploy.serving.request)


class ClosedSerializer(serializers.Serializer):
    """A JSON object whose every key this server reads: another is refused by name, not dropped."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({key: [f"Unrecognized argument supplied: {key}"]
                                                   for key in unknown})
        return super().to_internal_value(data)


class PromptField(serializers.Field):
    """A string, or a list holding one string."""

    def to_internal_value(self, data):
        if isinstance(data, list) and len(data) == 1:
            data = data[0]
        if isinstance(data, list) and data and not all(isinstance(p, str) for p in data):
            raise serializers.ValidationError("prompts of token ids are not supported: send the prompt as text")
        if isinstance(data, list):
            raise serializers.ValidationError(f"give one prompt (a string, or a list of one string), not "
                                              f"{len(data)}: this server answers one prompt a request")
        if not isinstance(data, str):
            raise serializers.ValidationError(f"must be a string, got {data!r:.100}")
        if not data or len(data) > MAX_PROMPT_CHARS:
            raise serializers.ValidationError(f"give 1 to {MAX_PROMPT_CHARS:,} characters")
        return data


class StopField(serializers.Field):
    """A string, or a list of strings."""

    def to_internal_value(self, data):
        stops = [data] if isinstance(data, str) else data
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise serializers.ValidationError("give a string or a list of strings")
        if len(stops) > MAX_STOPS or not all(1 <= len(s) <= MAX_STOP_CHARS for s in stops):
            raise serializers.ValidationError(f"give at most {MAX_STOPS} stop strings of 1 to {MAX_STOP_CHARS} "
                                              f"characters each")
        return stops


def schema_problem(schema) -> str:
    """Why ``schema`` is not a JSON schema a model can be held to, or ''."""
    if not isinstance(schema, dict):
        return "give the schema as a JSON object"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"not a valid JSON schema: {exc.message}"
    return ""


class ResponseFormatField(serializers.Field):
    """OpenAI's response_format → the models' guide (JSON text, deploy.client.GenerateParams.guide), or None for
    text."""

    def to_internal_value(self, data):
        kind = data.get("type") if isinstance(data, dict) else None
        if kind == "text" and set(data) == {"type"}:
            return None
        if kind == "json_object" and set(data) == {"type"}:
            return json.dumps({"json_object": True})
        if kind == "json_schema" and set(data) == {"type", "json_schema"} and isinstance(data["json_schema"], dict):
            spec = data["json_schema"]
            unknown = sorted(set(spec) - {"name", "schema", "strict", "description"})
            if unknown or not isinstance(spec.get("name"), str) or not spec["name"]:
                raise serializers.ValidationError(f"json_schema takes a name, a schema, strict and a description"
                                                  f"{' (not ' + ', '.join(unknown) + ')' if unknown else ''}")
            problem = schema_problem(spec.get("schema", {}))
            if problem:
                raise serializers.ValidationError(f"json_schema.schema: {problem}")
            return json.dumps({"json_schema": spec.get("schema", {})})
        raise serializers.ValidationError('give {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
                                          '"json_schema": {"name": …, "schema": {…}}}')


class StreamOptions(ClosedSerializer):
    include_usage = StrictBooleanField(required=False, default=False)


class OpenAIRequest(serializers.Serializer):
    model = StrictCharField(max_length=200)
    temperature = StrictFloatField(required=False, min_value=0, max_value=2)
    top_p = StrictFloatField(required=False)
    top_k = StrictIntegerField(required=False, min_value=0, max_value=MAX_TOP_K)
    stop = StopField(required=False)
    seed = StrictIntegerField(required=False, min_value=0, max_value=MAX_SEED)
    stream = StrictBooleanField(required=False, default=False)
    stream_options = StreamOptions(required=False)
    n = StrictIntegerField(required=False, default=1)
    truncate_prompt_tokens = StrictIntegerField(required=False, min_value=-1)
    presence_penalty = StrictFloatField(required=False, default=0.0, min_value=-2, max_value=2)
    response_format = ResponseFormatField(required=False, default=None)
    frequency_penalty = StrictFloatField(required=False, default=0.0, min_value=-2, max_value=2)

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["send a JSON object"]})
        given = {key: value for key, value in data.items() if value is not None}
        errors = {}
        for key, value in given.items():
            if key in self.fields:
                continue
            if key in NEUTRAL and value not in NEUTRAL[key]:
                errors[key] = [f"{value!r:.100} is not supported by this server: leave {key} out"]
            elif key not in self.fields and key not in NEUTRAL and key not in IGNORED:
                errors[key] = [f"Unrecognized request argument supplied: {key}"]
        if errors:
            raise serializers.ValidationError(errors)
        return super().to_internal_value({k: v for k, v in given.items() if k in self.fields})

    def validate_top_p(self, value):
        if top_p_problem(value):
            raise serializers.ValidationError(top_p_problem(value))
        return value

    def validate_truncate_prompt_tokens(self, value):
        if value == 0:
            raise serializers.ValidationError("give the number of the prompt's last tokens to keep (1 or more), or "
                                              "-1 for the model's context length")
        return value

    def validate(self, attrs):
        if "stream_options" in attrs and not attrs.get("stream"):
            raise serializers.ValidationError({"stream_options": ["stream_options is only allowed when stream is "
                                                                  "true"]})
        return attrs

    def validate_n(self, value):
        if not 1 <= value <= MAX_CHOICES:
            raise serializers.ValidationError(f"n={value}: give 1 to {MAX_CHOICES} choices")
        return value


class CompletionRequest(OpenAIRequest):
    prompt = PromptField()
    # Left out: COMPLETION_MAX_TOKENS, lowered to what the model's context leaves (webapp.services.context_window).
    max_tokens = StrictIntegerField(required=False, min_value=1, max_value=MAX_TOKENS)
    logprobs = StrictIntegerField(required=False, min_value=0, max_value=MAX_LOGPROBS)
    echo = StrictBooleanField(required=False, default=False)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if attrs.get("echo") and attrs.get("stream"):
            raise serializers.ValidationError({"echo": ["echo is not supported with stream on this server: ask "
                                                        "without stream (the prompt's log-probabilities come with "
                                                        "the whole answer)"]})
        return attrs


class FunctionCallSerializer(ClosedSerializer):
    name = StrictCharField(max_length=64)
    arguments = StrictCharField(allow_blank=True, max_length=MAX_PROMPT_CHARS)


class ToolCallSerializer(ClosedSerializer):
    id = StrictCharField(max_length=200)
    type = serializers.ChoiceField(choices=["function"])
    function = FunctionCallSerializer()


class MessageSerializer(ClosedSerializer):
    role = StrictCharField()
    content = serializers.JSONField(allow_null=True)
    name = StrictCharField(required=False, max_length=200)
    tool_calls = ToolCallSerializer(many=True, required=False, min_length=1, max_length=MAX_TOOLS)  # an assistant's
    tool_call_id = StrictCharField(required=False, max_length=200)  # a tool's answer: to which call

    def validate_role(self, value):
        if value not in ROLES:
            raise serializers.ValidationError(f"role {value!r}: give system, developer, user, assistant or tool "
                                              f"(functions are not supported: give tools)")
        return ROLES[value]

    def validate(self, attrs):
        if attrs["content"] is None and not (attrs["role"] == "assistant" and attrs.get("tool_calls")):
            raise serializers.ValidationError({"content": ["give the content (only an assistant's turn that calls "
                                                           "tools may leave it null)"]})
        if "tool_calls" in attrs and attrs["role"] != "assistant":
            raise serializers.ValidationError({"tool_calls": ["only an assistant's turn calls tools"]})
        if (attrs["role"] == "tool") != ("tool_call_id" in attrs):
            raise serializers.ValidationError({"tool_call_id": ["a tool's turn, and only that, gives the id of the "
                                                                "call it answers"]})
        return attrs

    def validate_name(self, value):
        raise serializers.ValidationError("a participant's name is not supported: the prompt template writes a "
                                          "turn's role and content only; leave name out")

    def validate_content(self, value):
        """A string, or content parts of type text (joined); null where an assistant's turn calls tools."""
        if value is None:
            return value
        if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                           and isinstance(p.get("text"), str) for p in value):
            value = "".join(p["text"] for p in value)
        if not isinstance(value, str):
            raise serializers.ValidationError("give the content as a string, or as parts of type text")
        if len(value) > MAX_PROMPT_CHARS:
            raise serializers.ValidationError(f"at most {MAX_PROMPT_CHARS:,} characters")
        return value


class FunctionSerializer(ClosedSerializer):
    name = StrictCharField()
    description = StrictCharField(required=False, allow_blank=True, max_length=MAX_PROMPT_CHARS)
    parameters = serializers.JSONField(required=False)
    strict = StrictBooleanField(required=False, allow_null=True)

    def validate_name(self, value):
        if not TOOL_NAME.match(value):
            raise serializers.ValidationError("a function's name is 1 to 64 letters, digits, '_' or '-'")
        return value

    def validate_parameters(self, value):
        problem = schema_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


class ToolSerializer(ClosedSerializer):
    type = serializers.ChoiceField(choices=["function"])
    function = FunctionSerializer()


class ToolChoiceField(serializers.Field):
    """"none", "auto", "required", or {"type": "function", "function": {"name": …}} → that name."""

    def to_internal_value(self, data):
        if data in ("none", "auto", "required"):
            return data
        if (isinstance(data, dict) and set(data) == {"type", "function"} and data["type"] == "function"
                and isinstance(data["function"], dict) and set(data["function"]) == {"name"}
                and isinstance(data["function"]["name"], str)):
            return data["function"]["name"]
        raise serializers.ValidationError('give "none", "auto", "required" or {"type": "function", "function": '
                                          '{"name": …}}')


class ChatRequest(OpenAIRequest):
    messages = MessageSerializer(many=True, min_length=1, max_length=MAX_MESSAGES)
    # What is left out comes from the deployment's prompt template (its sampling), else OpenAI's defaults.
    max_tokens = StrictIntegerField(required=False, min_value=1, max_value=MAX_TOKENS)
    max_completion_tokens = StrictIntegerField(required=False, min_value=1, max_value=MAX_TOKENS)
    logprobs = StrictBooleanField(required=False, default=False)
    top_logprobs = StrictIntegerField(required=False, min_value=0, max_value=MAX_LOGPROBS)
    tools = ToolSerializer(many=True, required=False, max_length=MAX_TOOLS)
    tool_choice = ToolChoiceField(required=False)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if "top_logprobs" in attrs and not attrs["logprobs"]:
            raise serializers.ValidationError({"top_logprobs": ["top_logprobs needs logprobs: true"]})
        attrs["tools"] = self._tools(attrs)
        if "max_tokens" in attrs and attrs["max_tokens"] != attrs.get("max_completion_tokens", attrs["max_tokens"]):
            raise serializers.ValidationError({"max_completion_tokens": [
                f"{attrs['max_completion_tokens']} differs from max_tokens={attrs['max_tokens']}: give one of the "
                f"two (max_completion_tokens is OpenAI's newer name for max_tokens)"]})
        return attrs

    @staticmethod
    def _tools(attrs: dict) -> Tools:
        functions = tuple(tool["function"] for tool in attrs.get("tools", ()))
        choice = attrs.get("tool_choice", "auto" if functions else "none")
        if choice != "none" and not functions:
            raise serializers.ValidationError({"tool_choice": ["tool_choice is only allowed when tools are "
                                                               "specified"]})
        names = [f["name"] for f in functions]
        if len(set(names)) < len(names):
            raise serializers.ValidationError({"tools": ["give each function a name of its own"]})
        if choice not in ("none", "auto", "required") and choice not in names:
            raise serializers.ValidationError({"tool_choice": [f"no tool is named {choice!r}: name one of "
                                                               f"{', '.join(names)}"]})
        tools = Tools(functions, choice)
        if tools.forced and attrs.get("response_format"):
            raise serializers.ValidationError({"tool_choice": ["a forced tool call and a response_format cannot "
                                                               "both hold the answer: give one of them"]})
        if tools.shown and attrs.get("stream"):
            raise serializers.ValidationError({"stream": ["an answer that may call a tool is not streamed by this "
                                                          "server: ask without stream, or with tool_choice none"]})
        return tools
