"""The OpenAI-compatible /v1: keys, models, errors in OpenAI's shape; answers in OpenAI's shapes and chats written
as prompts, from the session's real Triton; and the official `openai` package against the product's /v1."""
import json

import pytest
from rest_framework.test import APIClient

from deploy.client import Chunk, Completion, GenerateParams, TritonClient
from tests.deploy_fixtures import greedy_of, logprobs_of
from tests.webapp import serving
from webapp import models
from webapp.api import openai as v1
from webapp.services import choices
from webapp.services.chat import chat_prompt
from webapp.services.context_window import tokenizer_for

Status = models.Deployment.Status


def bearer(client, user):
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {user.auth_token.key}")
    return client


@pytest.fixture
def openai_api():
    """A client for ``user`` that authenticates as OpenAI's clients do (None: no key)."""
    def client(user):
        return bearer(APIClient(), user) if user is not None else APIClient()
    return client


def _error(answer, status: int) -> dict:
    assert answer.status_code == status, (answer.status_code, answer.content[:500])
    body = answer.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    return body["error"]


@pytest.fixture
def ready(alice, small_checkpoint, nowhere):
    """Alice's ready deployment of the small model, on the server nothing listens at."""
    return serving.deployment(alice, small_checkpoint, nowhere, model_name="small")


COMPLETION = {"model": "small", "prompt": "ROMEO:", "max_tokens": 4}
CHAT = {"model": "small", "messages": [{"role": "user", "content": "Hi"}]}


# -- keys, models, errors -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("header", [None, "Bearer not-a-key", "Token {key}", "Bearer"])
def test_it_refuses_a_missing_or_wrong_key_with_openais_401(alice, ready, header):
    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header.format(key=alice.auth_token.key))
    for method, path, body in [("get", "/v1/models", None), ("post", "/v1/completions", COMPLETION),
                               ("post", "/v1/chat/completions", CHAT)]:
        answer = getattr(client, method)(path, body, format="json")
        error = _error(answer, 401)
        assert error["code"] == "invalid_api_key" and answer["WWW-Authenticate"].startswith("Bearer")


def test_it_lists_the_ready_models_the_caller_may_use(openai_api, alice, bob, staff, small_checkpoint, nowhere,
                                                      data_root):
    serving.deployment(alice, small_checkpoint, nowhere, model_name="mine")
    serving.deployment(alice, small_checkpoint, nowhere, model_name="loading", status=Status.LOADING)
    theirs = serving.imported(bob, serving.checkpoint_folder(data_root / "bobs"))
    serving.deployment(bob, theirs, nowhere, model_name="bobs-private")
    serving.deployment(bob, theirs, nowhere, model_name="bobs-shared", shared=True)
    answer = openai_api(alice).get("/v1/models")
    assert answer.status_code == 200
    body = answer.json()
    assert body["object"] == "list"
    assert sorted(m["id"] for m in body["data"]) == ["bobs-shared", "mine"]
    mine = next(m for m in body["data"] if m["id"] == "mine")
    assert mine["object"] == "model" and mine["owned_by"] == "alice" and isinstance(mine["created"], int)
    assert len(openai_api(staff).get("/v1/models").json()["data"]) == 3
    assert openai_api(alice).get("/v1/models/mine").json()["id"] == "mine"
    _error(openai_api(alice).get("/v1/models/bobs-private"), 404)


def test_it_answers_unknown_models_paths_and_methods_in_openais_shape(openai_api, alice, ready):
    error = _error(openai_api(alice).post("/v1/completions", {**COMPLETION, "model": "gpt-4"}, format="json"), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model" and "gpt-4" in error["message"]
    _error(openai_api(alice).post("/v1/chat/completions", {**CHAT, "model": "gpt-4"}, format="json"), 404)
    _error(openai_api(alice).post("/v1/embeddings", {"model": "small", "input": "x"}, format="json"), 404)
    _error(openai_api(None).get("/v1/nothing/here"), 404)
    _error(openai_api(alice).get("/v1/completions"), 405)


def test_it_answers_503_for_a_model_that_is_still_being_deployed(openai_api, alice, small_checkpoint, nowhere):
    serving.deployment(alice, small_checkpoint, nowhere, status=Status.EXPORTING, status_message="exporting")
    error = _error(openai_api(alice).post("/v1/completions", COMPLETION, format="json"), 503)
    assert "not ready yet" in error["message"] and error["type"] == "server_error"


@pytest.mark.parametrize("path, fields, param", [
    ("/v1/completions", {"n": 17}, "n"),
    ("/v1/completions", {"max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"max_tokens": 5000}, "max_tokens"),
    ("/v1/completions", {"temperature": -1}, "temperature"),
    ("/v1/completions", {"top_p": 0}, "top_p"),
    ("/v1/completions", {"stop": ["x"] * 9}, "stop"),
    ("/v1/completions", {"stop": 3}, "stop"),
    ("/v1/completions", {"prompt": ["one", "two"]}, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 3]}, "prompt"),
    ("/v1/completions", {"echo": True, "stream": True}, "echo"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "objekt"}}}}, "response_format"),
    ("/v1/completions", {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
     "response_format"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/completions", {"frequency_penalty": 2.5}, "frequency_penalty"),
    ("/v1/completions", {"temprature": 0.5}, "temprature"),
    ("/v1/completions", {"stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("/v1/chat/completions", {"n": 0}, "n"),
    ("/v1/chat/completions", {"tools": [{"type": "function"}]}, "tools[0].function"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}], "stream": True},
     "stream"),
    ("/v1/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
])
def test_it_refuses_bad_parameters_with_openais_400_naming_the_param(openai_api, alice, ready, path, fields, param):
    body = {**(COMPLETION if path == "/v1/completions" else CHAT), **fields}
    error = _error(openai_api(alice).post(path, body, format="json"), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_it_reads_nulls_the_user_field_and_neutral_values_as_fields_left_out():
    from webapp.api.openai_requests import CompletionRequest

    body = CompletionRequest(data={**COMPLETION, "user": "someone", "seed": None, "stop": None, "echo": False,
                                   "logprobs": None, "presence_penalty": 0, "n": 1, "best_of": 1})
    assert body.is_valid(), body.errors
    asked = {**v1.OPENAI_DEFAULTS, **body.validated_data}
    assert asked["seed"] is None and not asked.get("stop") and asked["temperature"] == 1.0
    assert "user" not in asked


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
@pytest.mark.django_db(transaction=True)
def test_it_answers_a_request_with_nulls_and_neutral_values(openai_api, alice, served_deployment):
    body = {**COMPLETION, "model": served_deployment.model_name, "user": "someone", "seed": None, "stop": None,
            "echo": False, "logprobs": None, "presence_penalty": 0, "n": 1, "best_of": 1}
    answer = openai_api(alice).post("/v1/completions", body, format="json")
    assert answer.status_code == 200, answer.json()
    assert 1 <= answer.json()["usage"]["completion_tokens"] <= COMPLETION["max_tokens"]


def test_it_refuses_a_body_that_is_not_json_in_openais_shape(openai_api, alice, ready):
    answer = openai_api(alice).post("/v1/completions", "{not json", content_type="application/json")
    _error(answer, 400)


@pytest.mark.parametrize("path, body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
@pytest.mark.parametrize("stream", [False, True])
def test_it_answers_503_in_openais_shape_when_triton_cannot_be_reached(openai_api, alice, ready, path, body,
                                                                       stream):
    answer = openai_api(alice).post(path, {**body, "stream": stream}, format="json")
    error = _error(answer, 503)
    assert "cannot be reached" in error["message"] and error["type"] == "server_error"


# -- answers in OpenAI's shapes, from the session's real Triton ---------------------------------------------------

def _data_events(response) -> list:
    text = b"".join(response.streaming_content).decode()
    blocks = [b for b in text.split("\n\n") if b]
    assert all(b.startswith("data: ") for b in blocks), text
    return [b.removeprefix("data: ") if b == "data: [DONE]" else json.loads(b.removeprefix("data: "))
            for b in blocks]


def _direct(deployment, params: GenerateParams) -> Completion:
    """What the deployment's Triton answers ``params`` asked directly, past the web app."""
    with TritonClient(deployment.server.http_url, deployment.server.grpc_url) as client:
        return client.generate(deployment.model_name, params)


def _ok(answer) -> dict:
    assert answer.status_code == 200, (answer.status_code, answer.content[:500])
    return answer.json()


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
@pytest.mark.django_db(transaction=True)
def test_it_answers_a_completion_in_openais_shape(openai_api, alice, served_deployment):
    model = served_deployment.model_name
    asked = {"model": model, "prompt": ["ROMEO:"], "max_tokens": 24, "stop": "\n\n", "seed": 3,
             "temperature": 0.5, "top_p": 0.9}
    body = _ok(openai_api(alice).post("/v1/completions", asked, format="json"))
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion" and body["model"] == model
    assert isinstance(body["created"], int)
    [choice] = body["choices"]
    assert set(choice) == {"index", "text", "finish_reason", "logprobs"}
    assert choice["index"] == 0 and choice["logprobs"] is None and choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == usage["total_tokens"]
    assert usage["prompt_tokens"] > 0 and 1 <= usage["completion_tokens"] <= 24
    # the fields reached the model as these sampling parameters: the same seeded draw asked directly is the same
    same = _direct(served_deployment, GenerateParams("ROMEO:", 24, temperature=0.5, top_p=0.9, seed=3,
                                                     stop=("\n\n",)))
    assert (choice["text"], choice["finish_reason"]) == (same.text, same.finish_reason)
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (same.prompt_tokens, same.completion_tokens)
    other = _ok(openai_api(alice).post("/v1/completions", {**asked, "seed": 4}, format="json"))
    assert other["choices"][0]["text"] != choice["text"]  # the seed is the request's, not a fixed one


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
@pytest.mark.django_db(transaction=True)
def test_it_streams_a_chat_as_openais_chunks_with_the_usage_last(openai_api, alice, served_deployment):
    asked = {"model": served_deployment.model_name, "messages": [{"role": "user", "content": "Speak, Romeo."}],
             "max_tokens": 16, "temperature": 0}
    whole = _ok(openai_api(alice).post("/v1/chat/completions", asked, format="json"))
    answer = openai_api(alice).post("/v1/chat/completions", {**asked, "stream": True,
                                                             "stream_options": {"include_usage": True}},
                                    format="json")
    assert answer.status_code == 200 and answer["Content-Type"] == "text/event-stream"
    events = _data_events(answer)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"]["content"] for c in chunks[1:] if c["choices"]
              and "content" in c["choices"][0]["delta"]]
    assert "".join(deltas) == whole["choices"][0]["message"]["content"] and len(deltas) > 1
    finish = chunks[-2]["choices"][0]
    assert finish["delta"] == {} and finish["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert whole["usage"]["completion_tokens"] >= 1


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
@pytest.mark.django_db(transaction=True)
def test_it_writes_a_chat_with_the_deployments_template_and_its_sampling(openai_api, alice, served_deployment):
    # served_deployment is this test's own row (the served model is shared, not the deployment): no restoring
    template = models.PromptTemplate.objects.create(
        owner=alice, name="qa", chat_template="<{role}> {content}\n", examples=[{"input": "2+2?", "output": "4"}],
        sampling={"temperature": 0.0, "max_tokens": 12})
    served_deployment.prompt_template = template
    served_deployment.save()
    messages = [{"role": "developer", "content": "Answer with a number."},
                {"role": "user", "content": [{"type": "text", "text": "3+3?"}]}]
    written = chat_prompt([{"role": "system", "content": "Answer with a number."},
                           {"role": "user", "content": "3+3?"}], template.chat_template, template.examples)
    assert written.prompt == "<user> 2+2?\n<assistant> 4\n<system> Answer with a number.\n<user> 3+3?\n<assistant>"
    assert written.stop == "\n<user>"
    asked = {"model": served_deployment.model_name, "messages": messages}
    body = _ok(openai_api(alice).post("/v1/chat/completions", {**asked, "stop": ["."]}, format="json"))
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    # the template's sampling (greedy, 12 tokens, a default: lowered to what the context leaves after the prompt)
    # and both stops reached the model with the written prompt
    room = served_deployment.report["seq_len"] - len(tokenizer_for(served_deployment).encode(written.prompt).ids)
    same = _direct(served_deployment, GenerateParams(written.prompt, min(12, room), temperature=0.0,
                                                     stop=(written.stop, ".")))
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": same.text},
                                "finish_reason": same.finish_reason, "logprobs": None}]
    assert body["usage"]["completion_tokens"] == same.completion_tokens <= 12
    assert body["usage"]["prompt_tokens"] == same.prompt_tokens
    # the request's own fields win over the template's
    body = _ok(openai_api(alice).post("/v1/chat/completions", {**asked, "max_completion_tokens": 5,
                                                               "temperature": 0.3, "seed": 11}, format="json"))
    same = _direct(served_deployment, GenerateParams(written.prompt, 5, temperature=0.3, seed=11,
                                                     stop=(written.stop,)))
    assert body["choices"][0]["message"]["content"] == same.text
    assert body["usage"]["completion_tokens"] == same.completion_tokens <= 5


def test_it_writes_a_chat_without_a_template_in_the_default_format():
    chat = chat_prompt([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert chat.prompt == "system: Be brief.\nuser: Hi\nassistant:" and chat.stop == "\nuser:"


# -- a failure mid-stream (the service stood in for) --------------------------------------------------------------

def test_it_streams_an_error_event_when_triton_fails_mid_stream(openai_api, alice, ready, monkeypatch):
    """The deployment service is stood in for here, and only here: a mid-stream failure of the real Triton cannot be
    provoked in a shared session without disturbing the server the other tests use. The real streaming path is
    covered by the tests above, against the session's Triton."""
    from webapp.services.triton import ServingUnavailable

    def failing(deployment, params):
        yield Chunk(" Good", [1], "", 3, 1)
        raise ServingUnavailable("the Triton server 'nowhere' cannot be reached")
    monkeypatch.setattr(choices, "deployment_stream", failing)
    events = _data_events(openai_api(alice).post("/v1/completions", {**COMPLETION, "stream": True}, format="json"))
    assert events[0]["choices"][0]["text"] == " Good"
    assert events[-1]["error"]["type"] == "server_error" and "cannot be reached" in events[-1]["error"]["message"]


# -- the official client against the product, with the real Triton ------------------------------------------------

@pytest.fixture
def openai_client(live_server, alice, served_deployment):
    import openai
    # closed after the test: a kept-alive connection would keep its server thread, and its database connection
    with openai.OpenAI(base_url=live_server.url + "/v1", api_key=alice.auth_token.key, max_retries=0) as client:
        yield client


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
@pytest.mark.django_db(transaction=True)
def test_the_openai_package_completes_and_streams_a_completion(openai_client, served_deployment):
    smoke = served_deployment.report["smoke"]
    model = served_deployment.model_name
    assert [m.id for m in openai_client.models.list()] == [model]
    whole = openai_client.completions.create(model=model, prompt=smoke["prompt"], max_tokens=smoke["max_tokens"],
                                             temperature=0)
    assert whole.choices[0].text == smoke["text"] and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == len(smoke["token_ids"])
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    pieces = list(openai_client.completions.create(model=model, prompt=smoke["prompt"],
                                                   max_tokens=smoke["max_tokens"], temperature=0, stream=True,
                                                   stream_options={"include_usage": True}))
    texts = [p.choices[0].text for p in pieces if p.choices]
    assert "".join(texts) == smoke["text"] and len([t for t in texts if t]) > 3
    assert pieces[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert pieces[-1].usage.prompt_tokens == whole.usage.prompt_tokens


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
@pytest.mark.django_db(transaction=True)
def test_the_openai_package_chats_and_streams_a_chat(openai_client, served_deployment):
    import openai
    model = served_deployment.model_name
    messages = [{"role": "system", "content": "You are Romeo."}, {"role": "user", "content": "Speak."}]
    whole = openai_client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
    answer = whole.choices[0]
    assert answer.message.role == "assistant" and answer.finish_reason in ("stop", "length")
    assert "\nuser:" not in answer.message.content
    assert 1 <= whole.usage.completion_tokens <= 12 and whole.usage.prompt_tokens > 5
    stream = openai_client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0,
                                                   stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == answer.message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    with pytest.raises(openai.NotFoundError):
        openai_client.chat.completions.create(model="gpt-4", messages=messages)
    with pytest.raises(openai.BadRequestError):
        openai_client.completions.create(model=model, prompt="x", n=17)
    with openai.OpenAI(base_url=openai_client.base_url, api_key="wrong", max_retries=0) as stranger:
        with pytest.raises(openai.AuthenticationError):
            stranger.models.list()


def _close(got: float, want: float) -> bool:
    return abs(got - want) < 1e-3


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
@pytest.mark.django_db(transaction=True)
def test_the_openai_package_gets_the_checkpoints_own_logprobs_of_the_prompt_and_the_answer(
        openai_client, served_deployment, served_checkpoint):
    """Completions with echo (what likelihood evaluation asks), streamed, and chats: each token's log-probability
    and its most likely alternatives within 1e-3 of the checkpoint's own distribution."""
    logprobs, tokenizer = logprobs_of(served_checkpoint)

    def token_text(token_id: int) -> str:
        return tokenizer.decode([token_id], skip_special_tokens=False)
    greedy = greedy_of(served_checkpoint)
    model, prompt = served_deployment.model_name, "First Citizen:\nWe are accounted poor citizens"
    prompt_ids = tokenizer_for(served_deployment).encode(prompt).ids
    ids = prompt_ids + greedy(prompt, 6)
    assert len(prompt_ids) > 4
    every = logprobs(ids)

    whole = openai_client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0, logprobs=2,
                                             echo=True)
    choice = whole.choices[0]
    scored = choice.logprobs
    assert scored.tokens == [token_text(i) for i in ids] and choice.text == "".join(scored.tokens)
    assert choice.text.startswith(prompt) and scored.text_offset[len(prompt_ids)] == len(prompt)
    assert scored.token_logprobs[0] is None and scored.top_logprobs[0] is None
    for t in range(1, len(ids)):
        assert _close(scored.token_logprobs[t], float(every[t - 1, ids[t]])), t
        values, best = every[t - 1].topk(2)
        assert list(scored.top_logprobs[t]) == [token_text(i) for i in best.tolist()], t
        assert all(map(_close, scored.top_logprobs[t].values(), values.tolist())), t
    # a continuation's log-likelihood, as lm-eval reads it from an echoed completion of one token
    continuation = len(prompt_ids) - 2
    lm_eval = openai_client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0,
                                               logprobs=1, echo=True).choices[0].logprobs
    assert _close(sum(lm_eval.token_logprobs[continuation:-1]),
                  sum(float(every[t - 1, ids[t]]) for t in range(continuation, len(prompt_ids))))

    pieces = list(openai_client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0,
                                                   logprobs=1, stream=True))
    streamed = [p.choices[0].logprobs for p in pieces if p.choices[0].logprobs is not None]
    assert [t for s in streamed for t in s.tokens] == scored.tokens[len(prompt_ids):]
    assert [p for s in streamed for p in s.token_logprobs] == scored.token_logprobs[len(prompt_ids):]
    assert [o for s in streamed for o in s.text_offset] == [o - len(prompt) for o in scored.text_offset[
        len(prompt_ids):]]

    messages = [{"role": "user", "content": "Speak."}]
    chat = openai_client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0,
                                                 logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    chat_ids = tokenizer_for(served_deployment).encode(chat_prompt(messages).prompt).ids
    answer = greedy(chat_prompt(messages).prompt, len(content))
    every = logprobs(chat_ids + answer)
    assert len(content) == chat.usage.completion_tokens and [c.token for c in content] == list(map(token_text, answer))
    for t, c in enumerate(content):
        assert _close(c.logprob, float(every[len(chat_ids) + t - 1, answer[t]])) and len(c.top_logprobs) == 3
        assert c.top_logprobs[0].token == c.token and bytes(c.bytes) == c.token.encode()  # greedy: the likeliest


def _repeats(tokens: list[str]) -> int:
    return len(tokens) - len(set(tokens))


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
@pytest.mark.django_db(transaction=True)
def test_the_openai_package_makes_a_repetitive_answer_less_so_with_penalties(openai_client, served_deployment):
    model, prompt = served_deployment.model_name, served_deployment.report["smoke"]["prompt"]

    def tokens(**penalties) -> list[str]:
        return openai_client.completions.create(model=model, prompt=prompt, max_tokens=40, temperature=0, logprobs=0,
                                                **penalties).choices[0].logprobs.tokens
    plain = tokens()
    assert _repeats(plain) > 5  # the small model repeats itself
    assert _repeats(tokens(frequency_penalty=1.5)) < _repeats(plain)
    assert _repeats(tokens(presence_penalty=2.0)) < _repeats(plain)
    assert _repeats(tokens(frequency_penalty=-2.0)) > _repeats(plain)  # a negative one repeats more


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
@pytest.mark.django_db(transaction=True)
def test_the_openai_package_gets_n_choices_reproducible_from_a_seed(openai_client, served_deployment):
    """Choice i is the answer of the same request with seed + i: the same again, whole or streamed; usage counts
    the prompt once and every choice's tokens."""
    model, prompt = served_deployment.model_name, served_deployment.report["smoke"]["prompt"]
    asked = dict(model=model, prompt=prompt, max_tokens=12, temperature=1.0, seed=7)
    whole = openai_client.completions.create(n=3, **asked)
    texts = [c.text for c in sorted(whole.choices, key=lambda c: c.index)]
    assert [c.index for c in whole.choices] == [0, 1, 2] and len(set(texts)) == 3
    assert [c.text for c in openai_client.completions.create(n=3, **asked).choices] == texts
    singles = [openai_client.completions.create(**{**asked, "seed": 7 + i}) for i in range(3)]
    assert [s.choices[0].text for s in singles] == texts
    assert whole.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert whole.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    pieces = list(openai_client.completions.create(n=3, stream=True, stream_options={"include_usage": True},
                                                   **asked))
    streamed = ["".join(p.choices[0].text for p in pieces if p.choices and p.choices[0].index == i)
                for i in range(3)]
    assert streamed == texts and pieces[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert sum(1 for p in pieces if p.choices and p.choices[0].finish_reason) == 3
    chat = openai_client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Speak."}],
                                                 max_tokens=8, temperature=1.0, seed=3, n=2)
    assert [c.index for c in chat.choices] == [0, 1] and all(c.message.role == "assistant" for c in chat.choices)


CALL_ME = {"type": "function", "function": {"name": "verdict", "description": "Say whether it is so.", "parameters": {
    "type": "object", "properties": {"so": {"type": "boolean"}}, "required": ["so"], "additionalProperties": False}}}
BRIEF = {"type": "object", "properties": {"word": {"type": "string", "maxLength": 6}}, "required": ["word"],
         "additionalProperties": False}


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
@pytest.mark.django_db(transaction=True)
def test_the_openai_package_gets_json_of_a_schema_and_a_forced_tool_call(openai_client, served_deployment):
    """Guided decoding on the small Shakespeare model: every answer held to a JSON schema parses and validates; a
    forced call is one of the tools with arguments of its schema, in tool_calls. (Its 64-token context keeps the
    prompt's last tokens only, so the model does not see the tools: the grammar alone makes the call.)"""
    import jsonschema

    model = served_deployment.model_name
    messages = [{"role": "user", "content": "Speak."}]
    answers = openai_client.chat.completions.create(
        model=model, messages=messages, max_tokens=40, temperature=1.0, seed=1, n=4,
        response_format={"type": "json_schema", "json_schema": {"name": "brief", "schema": BRIEF}})
    for choice in answers.choices:
        jsonschema.validate(json.loads(choice.message.content), BRIEF)
        assert choice.finish_reason == "stop"
    anything = openai_client.completions.create(model=model, prompt="ROMEO:", max_tokens=40, temperature=0,
                                                extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                                    "name": "brief", "schema": BRIEF}}})
    jsonschema.validate(json.loads(anything.choices[0].text), BRIEF)
    for choice in ("required", {"type": "function", "function": {"name": "verdict"}}):
        called = openai_client.chat.completions.create(model=model, messages=messages, max_tokens=40, temperature=0,
                                                       tools=[CALL_ME], tool_choice=choice,
                                                       extra_body={"truncate_prompt_tokens": 16}).choices[0]
        assert called.finish_reason == "tool_calls" and called.message.content is None
        call = called.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "verdict" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), CALL_ME["function"]["parameters"])
    # the call and the tool's answer carried on in the conversation
    follow = openai_client.chat.completions.create(
        model=model, max_tokens=4, temperature=0, tools=[CALL_ME], tool_choice="none", extra_body={
            "truncate_prompt_tokens": 24},
        messages=[*messages, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                  {"role": "tool", "tool_call_id": call.id, "content": "yes"}])
    assert follow.choices[0].message.tool_calls is None and follow.choices[0].finish_reason in ("stop", "length")
