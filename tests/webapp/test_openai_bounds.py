"""/v1 within the model's context: a prompt and max_tokens beyond it refused with OpenAI's context_length_exceeded
naming the field, or the prompt cut from the left where the request asks (truncate_prompt_tokens); a max_tokens
left out lowered to what the context leaves; and no field a client sends silently ignored.

The refusals come before Triton is asked, so most tests serve from a server nothing listens at, with a tokenizer
whose tokens are the text's bytes (tests.webapp.serving.byte_tokenizer_json) and the small model's 64-token context;
the answers come from the session's real Triton and the official `openai` package."""
import pytest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params
from rest_framework.test import APIClient

from deploy.client import GenerateParams, TritonClient
from tests.webapp import serving
from webapp.api.openai_requests import IGNORED
from webapp.services.context_window import PromptRefused, fit_prompt, keep_last_tokens, tokenizer_for

CONTEXT = serving.SMALL_MODEL.seq_len  # 64


@pytest.fixture
def ready(alice, small_checkpoint, nowhere):
    return serving.deployment(alice, small_checkpoint, nowhere, model_name="small")


@pytest.fixture
def v1(alice):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {alice.auth_token.key}")
    return client


def _refused(answer, param: str, code: str = "context_length_exceeded") -> str:
    assert answer.status_code == 400, (answer.status_code, answer.content[:500])
    error = answer.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error"), error
    return error["message"]


def _past_the_bounds(answer) -> None:
    """The request was sent on to Triton (which nothing answers here): the bounds let it through."""
    assert answer.status_code == 503 and "cannot be reached" in answer.json()["error"]["message"], answer.content


# -- refused before Triton is asked ----------------------------------------------------------------------------------

def test_it_refuses_max_tokens_beyond_the_context_naming_it(v1, ready):
    message = _refused(v1.post("/v1/completions", {"model": "small", "prompt": "Hi", "max_tokens": 1000},
                               format="json"), "max_tokens")
    assert message == ("This model's maximum context length is 64 tokens. However, you requested 1002 tokens (2 in "
                       "the prompt, 1000 in the completion). Please reduce the length of the prompt or completion.")
    chat = {"model": "small", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": CONTEXT}
    assert "(19 in the messages, 64 in the completion)" in _refused(
        v1.post("/v1/chat/completions", chat, format="json"), "max_completion_tokens")  # "user: Hi\nassistant:"


def test_it_refuses_a_prompt_beyond_the_context_naming_the_prompt_or_the_messages(v1, ready):
    long = "x" * 1201
    message = _refused(v1.post("/v1/completions", {"model": "small", "prompt": long, "max_tokens": 4},
                               format="json"), "prompt")
    assert "you requested 1205 tokens (1201 in the prompt, 4 in the completion)" in message
    chat = {"model": "small", "messages": [{"role": "user", "content": long}]}
    message = _refused(v1.post("/v1/chat/completions", chat, format="json"), "messages")
    assert message == ("This model's maximum context length is 64 tokens. However, your messages resulted in 1218 "
                       "tokens. Please reduce the length of the messages.")
    # streaming asks the same: refused before the stream starts
    _refused(v1.post("/v1/completions", {"model": "small", "prompt": long, "stream": True}, format="json"), "prompt")


def test_a_prompt_and_answer_that_fill_the_context_exactly_are_sent(v1, ready):
    prompt = "y" * (CONTEXT - 4)
    _refused(v1.post("/v1/completions", {"model": "small", "prompt": prompt, "max_tokens": 5}, format="json"),
             "prompt")
    _past_the_bounds(v1.post("/v1/completions", {"model": "small", "prompt": prompt, "max_tokens": 4},
                             format="json"))


def test_a_max_tokens_left_out_is_lowered_to_what_the_context_leaves(ready):
    assert fit_prompt(ready, "y" * 60, max_tokens=None, default_max_tokens=16).max_tokens == 4
    assert fit_prompt(ready, "y" * 10, max_tokens=None, default_max_tokens=16).max_tokens == 16
    with pytest.raises(PromptRefused) as refused:
        fit_prompt(ready, "y" * 64, max_tokens=None, default_max_tokens=16)
    assert refused.value.param == "prompt" and "your prompt resulted in 64 tokens" in refused.value.message


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(v1, ready):
    fitted = fit_prompt(ready, "a" * 100 + "the end", max_tokens=8, default_max_tokens=16, truncate_prompt_tokens=20)
    assert (fitted.prompt, fitted.prompt_tokens, fitted.max_tokens) == ("a" * 13 + "the end", 20, 8)
    kept = fit_prompt(ready, "ünï漢字" * 20, max_tokens=None, default_max_tokens=8, truncate_prompt_tokens=10)
    assert kept.prompt == "nï漢字" and kept.prompt_tokens == 9  # between characters: the 10th byte from the end is ü's
    assert fit_prompt(ready, "short", max_tokens=4, default_max_tokens=16,
                      truncate_prompt_tokens=20).prompt == "short"  # nothing to cut
    # what is kept must still leave room for the answer, as in vLLM
    _refused(v1.post("/v1/completions", {"model": "small", "prompt": "z" * 500, "max_tokens": 50,
                                         "truncate_prompt_tokens": 20}, format="json"), "prompt")
    _past_the_bounds(v1.post("/v1/completions", {"model": "small", "prompt": "z" * 500, "max_tokens": 44,
                                                 "truncate_prompt_tokens": 20}, format="json"))
    chat = {"model": "small", "messages": [{"role": "user", "content": "z" * 500}], "truncate_prompt_tokens": 40}
    _past_the_bounds(v1.post("/v1/chat/completions", chat, format="json"))


@pytest.mark.parametrize("value, code", [(0, None), (-2, None), (CONTEXT + 1, "invalid_value"), ("9", None)])
def test_it_refuses_a_truncation_it_cannot_make_naming_it(v1, ready, value, code):
    body = {"model": "small", "prompt": "Hi", "max_tokens": 4, "truncate_prompt_tokens": value}
    _refused(v1.post("/v1/completions", body, format="json"), "truncate_prompt_tokens", code)


def test_the_cut_never_exceeds_the_tokens_kept_with_a_tokenizer_that_merges(alice, nowhere, data_root):
    """A BPE trained as the trainer trains one merges across the cut and splits characters into several tokens."""
    from trainer.contract.presets import demo_text
    from trainer.data.tokenizer import train_tokenizer

    folder = serving.checkpoint_folder(data_root / "bpe")
    train_tokenizer(iter([demo_text(50_000).decode()]), 512).save(str(folder / "tokenizer.json"))
    tokenizer = tokenizer_for(serving.deployment(alice, serving.imported(alice, folder), nowhere))
    text = "ROMEO: But soft, what light through yonder window breaks? ünï漢字 🎉 It is the east.\n" * 3
    total = len(tokenizer.encode(text).ids)
    assert total < len(text.encode()) - 20  # it merges
    for keep in range(1, total + 1):
        tail, count = keep_last_tokens(tokenizer, text, keep)
        assert text.endswith(tail) and count == len(tokenizer.encode(tail).ids) <= keep
        assert count >= keep - 4, (keep, count)  # at most a character's tokens short
    assert keep_last_tokens(tokenizer, text, total) == (text, total)


# -- no field silently ignored -------------------------------------------------------------------------------------

CHAT = {"model": "small", "messages": [{"role": "user", "content": "Hi"}]}
COMPLETION = {"model": "small", "prompt": "Hi"}


@pytest.mark.parametrize("path, base, params", [
    ("/v1/completions", COMPLETION, completion_create_params.CompletionCreateParamsBase),
    ("/v1/chat/completions", CHAT, chat_create_params.CompletionCreateParamsBase),
], ids=["completions", "chat"])
def test_every_field_the_openai_package_sends_is_read_or_refused_by_name(v1, ready, path, base, params):
    """Each field of the official client's request, given a value no field takes: a 400 naming it, whether this
    server implements the field (the value's type is wrong) or not (unsupported or unknown) — never a 200 that
    left it out. The fields come from the installed package, so new ones are tried as the package learns them."""
    for field in sorted(set(params.__annotations__) - set(IGNORED)):
        answer = v1.post(path, {**base, field: {"probe": 1}}, format="json")
        assert answer.status_code == 400, (field, answer.status_code, answer.content[:300])
        assert answer.json()["error"]["param"].startswith(field), (field, answer.json())


@pytest.mark.parametrize("path, fields, param", [
    ("/v1/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/completions", {"stream": True, "stream_options": {"include_usage": True, "continuous": True}},
     "stream_options.continuous"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi", "name": "Ann"}]}, "messages[0].name"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": "", "tool_calls": []}]},
     "messages[0].tool_calls"),
    ("/v1/chat/completions", {"max_tokens": 4, "max_completion_tokens": 5}, "max_completion_tokens"),
    ("/v1/completions", {"best_of": 3}, "best_of"),
    ("/v1/completions", {"logit_bias": {"50256": -100}}, "logit_bias"),
    ("/v1/completions", {"suffix": " end"}, "suffix"),
])
def test_it_refuses_what_it_would_otherwise_leave_out_naming_it(v1, ready, path, fields, param):
    base = COMPLETION if path == "/v1/completions" else CHAT
    _refused(v1.post(path, {**base, **fields}, format="json"), param, code=None)


@pytest.mark.parametrize("path, fields, param", [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2}, "logprobs"),
    ("/v1/completions", {"logprobs": 0}, "logprobs"),
    ("/v1/completions", {"logprobs": 1, "echo": True}, "logprobs"),
    ("/v1/chat/completions", {"presence_penalty": -0.5}, "presence_penalty"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
])
def test_a_deployment_exported_before_logprobs_and_penalties_refuses_them_naming_the_field(v1, ready, path, fields, param):
    base = COMPLETION if path == "/v1/completions" else CHAT
    assert "interface" not in ready.report  # exported before the models took logprobs
    message = _refused(v1.post(path, {**base, **fields}, format="json"), param, code=None)
    assert "deploy its checkpoint again" in message
    ready.report = {"interface": 2}
    ready.save()
    _past_the_bounds(v1.post(path, {**base, **fields}, format="json"))


def test_echo_without_logprobs_needs_nothing_new_of_the_deployment(v1, ready):
    _past_the_bounds(v1.post("/v1/completions", {**COMPLETION, "echo": True}, format="json"))


def test_it_accepts_the_same_max_tokens_under_both_names(v1, ready):
    _past_the_bounds(v1.post("/v1/chat/completions", {**CHAT, "max_tokens": 4, "max_completion_tokens": 4},
                             format="json"))


# -- the official client against the product, with the real Triton --------------------------------------------------

@pytest.fixture
def openai_client(live_server, alice, served_deployment):
    import openai
    with openai.OpenAI(base_url=live_server.url + "/v1", api_key=alice.auth_token.key, max_retries=0) as client:
        yield client


def _direct(deployment, params: GenerateParams):
    with TritonClient(deployment.server.http_url, deployment.server.grpc_url) as client:
        return client.generate(deployment.model_name, params)


PLAY = ("ROMEO: But soft, what light through yonder window breaks? It is the east, and Juliet is the sun. " * 20)


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
@pytest.mark.django_db(transaction=True)
def test_the_openai_package_meets_the_context_bounds(openai_client, served_deployment):
    import openai
    model, tokenizer = served_deployment.model_name, tokenizer_for(served_deployment)
    context = served_deployment.report["seq_len"]
    assert len(tokenizer.encode(PLAY).ids) > 10 * context
    with pytest.raises(openai.BadRequestError) as refused:  # the prompt alone is beyond the context
        openai_client.completions.create(model=model, prompt=PLAY, max_tokens=4, temperature=0)
    assert (refused.value.code, refused.value.param) == ("context_length_exceeded", "prompt")
    assert f"maximum context length is {context} tokens" in refused.value.message
    with pytest.raises(openai.BadRequestError) as refused:  # max_tokens alone is beyond the context
        openai_client.completions.create(model=model, prompt="ROMEO:", max_tokens=1000)
    assert (refused.value.code, refused.value.param) == ("context_length_exceeded", "max_tokens")
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.chat.completions.create(model=model, messages=[{"role": "user", "content": PLAY}])
    assert (refused.value.code, refused.value.param) == ("context_length_exceeded", "messages")

    # cut from the left where asked: the engine reads exactly the kept tokens, and answers what it answers them
    cut = openai_client.completions.create(model=model, prompt=PLAY, max_tokens=8, temperature=0,
                                           extra_body={"truncate_prompt_tokens": 24})
    kept, count = keep_last_tokens(tokenizer, PLAY, 24)
    assert cut.usage.prompt_tokens == count and 20 <= count <= 24
    same = _direct(served_deployment, GenerateParams(kept, 8, temperature=0.0))
    assert cut.choices[0].text == same.text and cut.usage.completion_tokens == same.completion_tokens
    streamed = list(openai_client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PLAY}], max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"truncate_prompt_tokens": 40}))
    assert streamed[-1].usage.prompt_tokens <= 40 and streamed[-1].usage.total_tokens <= context

    # a max_tokens left out: what the context leaves after the prompt, not the chat's default of 256
    whole = openai_client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Speak."}],
                                                  temperature=0)
    assert whole.usage.total_tokens <= context
