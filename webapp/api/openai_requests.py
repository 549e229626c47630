"""The request bodies of the OpenAI-compatible endpoints (webapp.api.openai), checked as OpenAI checks them.

Log-probabilities as OpenAI's two endpoints ask for them: a completion's ``logprobs`` (k: the k most likely tokens
beside each; with ``echo``, the prompt's too), a chat's ``logprobs: true`` with ``top_logprobs`` (k).

A null is the same as a field left out (OpenAI's clients send either). A field this server does not know is refused
("Unrecognized request argument supplied"), as OpenAI does; one it knows but does not implement is accepted at its
neutral value only (``echo: false``, ``presence_penalty: 0``, …), and refused otherwise, so that no request is
silently answered as if it had asked for less; so is a key of a message or of stream_options it does not read.
``user`` is accepted and ignored. Sampling is bounded as in the deployments' own API
(webapp.api.serving_serializers); ``top_k`` is this server's addition, ``truncate_prompt_tokens`` vLLM's (the
prompt cut from the left to its last tokens: webapp.services.context_window, which also bounds max_tokens by the
model's context).
"""
from rest_framework import serializers

from .fields import StrictBooleanField, StrictCharField, StrictFloatField, StrictIntegerField
from .serving_serializers import (MAX_PROMPT_CHARS, MAX_SEED, MAX_STOP_CHARS, MAX_STOPS, MAX_TOKENS, MAX_TOP_K,
                                  top_p_problem)

MAX_MESSAGES = 256
CHAT_MAX_TOKENS = 256   # OpenAI answers until the context is full; this server stops here unless told otherwise
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# Known fields this server does not implement, and the values that ask for nothing (accepted).
NEUTRAL = {"best_of": (1,),
           "logit_bias": ({},), "suffix": ("",),
           "response_format": ({"type": "text"},), "tools": ([],), "tool_choice": ("none",),
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


class MessageSerializer(ClosedSerializer):
    role = StrictCharField()
    content = serializers.JSONField()
    name = StrictCharField(required=False, max_length=200)

    def validate_role(self, value):
        if value not in ROLES:
            raise serializers.ValidationError(f"role {value!r}: give system, developer, user or assistant (tools "
                                              f"and functions are not supported)")
        return ROLES[value]

    def validate_name(self, value):
        raise serializers.ValidationError("a participant's name is not supported: the prompt template writes a "
                                          "turn's role and content only; leave name out")

    def validate_content(self, value):
        """A string, or content parts of type text (joined)."""
        if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                           and isinstance(p.get("text"), str) for p in value):
            value = "".join(p["text"] for p in value)
        if not isinstance(value, str):
            raise serializers.ValidationError("give the content as a string, or as parts of type text")
        if len(value) > MAX_PROMPT_CHARS:
            raise serializers.ValidationError(f"at most {MAX_PROMPT_CHARS:,} characters")
        return value


class ChatRequest(OpenAIRequest):
    messages = MessageSerializer(many=True, min_length=1, max_length=MAX_MESSAGES)
    # What is left out comes from the deployment's prompt template (its sampling), else OpenAI's defaults.
    max_tokens = StrictIntegerField(required=False, min_value=1, max_value=MAX_TOKENS)
    max_completion_tokens = StrictIntegerField(required=False, min_value=1, max_value=MAX_TOKENS)
    logprobs = StrictBooleanField(required=False, default=False)
    top_logprobs = StrictIntegerField(required=False, min_value=0, max_value=MAX_LOGPROBS)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if "top_logprobs" in attrs and not attrs["logprobs"]:
            raise serializers.ValidationError({"top_logprobs": ["top_logprobs needs logprobs: true"]})
        if "max_tokens" in attrs and attrs["max_tokens"] != attrs.get("max_completion_tokens", attrs["max_tokens"]):
            raise serializers.ValidationError({"max_completion_tokens": [
                f"{attrs['max_completion_tokens']} differs from max_tokens={attrs['max_tokens']}: give one of the "
                f"two (max_completion_tokens is OpenAI's newer name for max_tokens)"]})
        return attrs
