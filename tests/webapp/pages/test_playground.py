"""The prompt playground: the deployments offered, the prompt written from a template and checked before anything is
streamed, templates saved as versions, the history of what each user asked, and prompt sets answered as a table
(with an unreachable server, and with the session's real Triton)."""
import json

import pytest
from rest_framework.test import APIClient

from tests.webapp import serving
from webapp import models
from webapp.pages.playground import parse_stops, stops_text
from webapp.services import playground as service

pytestmark = pytest.mark.django_db
Status = models.Deployment.Status

FORM = {"template": "{examples}{input}", "examples": "[]", "input": "ROMEO:", "temperature": "0", "top_k": "0",
        "top_p": "1", "max_tokens": "8", "seed": "", "stop": ""}


@pytest.fixture
def ready(alice, small_checkpoint, nowhere):
    return serving.deployment(alice, small_checkpoint, nowhere, model_name="alice-ready")


def _prepare(client, user, **fields):
    client.force_login(user)
    return client.post("/playground/prepare/", json.dumps({**FORM, **fields}), content_type="application/json")


def test_it_sends_a_visitor_who_is_not_signed_in_to_the_sign_in_page(client):
    assert client.get("/playground/")["Location"] == "/login/?next=/playground/"
    assert client.post("/playground/prepare/", "{}", content_type="application/json").status_code == 302


def test_it_offers_the_ready_deployments_the_user_may_see_and_no_one_elses(client, alice, bob, ready, data_root,
                                                                           nowhere):
    bobs = serving.deployment(bob, serving.imported(bob, serving.checkpoint_folder(data_root / "bobs")), nowhere,
                              model_name="bob-private")
    serving.deployment(alice, ready.checkpoint, nowhere, model_name="alice-loading", status=Status.LOADING)
    client.force_login(alice)
    page = client.get("/playground/", {"deployment": ready.pk}).content.decode()
    assert f'<option value="{ready.pk}" selected>alice-ready' in page
    assert "bob-private" not in page and "alice-loading" not in page
    for hook in ("output-1", "counts-1", "ttft-1", "output-2", "counts-2", "ttft-2"):
        assert f'data-testid="{hook}"' in page
    for control in ("deployment", "compare", "preset", "version", "template", "examples", "input", "temperature",
                    "top_k", "top_p", "max_tokens", "seed", "stop", "template_name", "prompts"):
        assert f'<label for="{control}">' in page
    assert '<button type="submit" id="generate" >Generate</button>' in page
    assert '"zero-shot"' in page and '"few-shot"' in page  # the presets, for the page's script
    assert "deployment" in _prepare(client, alice, deployment=bobs.pk).json()["errors"]
    bobs.shared = True
    bobs.save()
    assert "bob-private" in client.get("/playground/").content.decode()


def test_it_says_where_to_go_when_nothing_is_ready(client, alice):
    client.force_login(alice)
    page = client.get("/playground/").content.decode()
    assert 'id="no-deployment"' in page and 'href="/deploy/"' in page
    assert '<button type="submit" id="generate" disabled>Generate</button>' in page


def test_it_writes_the_prompt_from_the_template_and_the_examples(client, alice, nowhere, data_root):
    few = service.PRESETS["few-shot"]  # its prompt is more than the small model's 64 tokens: a model of 1,024
    wide = serving.imported(alice, serving.checkpoint_folder(data_root / "wide",
                                                             model=serving.SMALL_MODEL.replace(seq_len=1024)))
    ready = serving.deployment(alice, wide, nowhere, model_name="wide")
    answer = _prepare(client, alice, deployment=ready.pk, template=few["template"],
                      examples=json.dumps(few["examples"][:2]), input="Who wrote Macbeth?", seed="7",
                      stop="\\n\\n\nQ:", temperature="0.7", top_k="40", top_p="0.9")
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert body["prompt"] == ("Q: What is the capital of France?\nA: Paris.\n\n"
                              "Q: What is 2 + 2?\nA: 4.\n\n"
                              "Q: Who wrote Macbeth?\nA:")
    assert body["params"] == {"temperature": 0.7, "top_k": 40, "top_p": 0.9, "max_tokens": 8, "seed": 7,
                              "stop": ["\n\n", "Q:"]}
    assert body["deployments"] == [{"id": ready.pk, "model_name": "wide", "server": "nowhere",
                                    "url": f"/api/deployments/{ready.pk}/generate/"}]


def test_it_asks_two_deployments_in_compare_mode_but_not_the_same_one_twice(client, alice, ready, nowhere):
    other = serving.deployment(alice, ready.checkpoint, nowhere, model_name="other")
    answer = _prepare(client, alice, deployment=ready.pk, compare=other.pk)
    assert [d["id"] for d in answer.json()["deployments"]] == [ready.pk, other.pk]
    same = _prepare(client, alice, deployment=ready.pk, compare=ready.pk).json()
    assert "another deployment" in same["errors"]["compare"][0] and "prompt" not in same


@pytest.mark.parametrize("fields, field, said", [
    ({"template": "{prompt}"}, "template", "only {examples} and {input}"),
    ({"template": "{examples} no input"}, "template", "no {input}"),
    ({"template": "{input"}, "template", "literal brace"),
    ({"examples": "[{\"input\": \"x\"}]"}, "examples", "example 1"),
    ({"examples": "not json"}, "examples", "not JSON"),
    ({"top_p": "0"}, "top_p", "(0, 1]"),
    ({"temperature": "-1"}, "temperature", "greater than or equal to 0"),
    ({"max_tokens": "5000"}, "max_tokens", "less than or equal to 4096"),
    ({"seed": "-3"}, "seed", "greater than or equal to 0"),
    ({"stop": "\n".join("abcdefghi")}, "stop", "at most 8 stop strings"),
    ({"input": "", "template": "{input}"}, "input", "the prompt is empty"),
])
def test_it_refuses_what_the_model_would_refuse_naming_the_field(client, alice, ready, fields, field, said):
    answer = _prepare(client, alice, deployment=ready.pk, **fields)
    assert answer.status_code == 200  # the page's own answer: the fields to fix, shown beside them
    errors = answer.json()["errors"]
    assert field in errors and said in " ".join(errors[field]), errors


def test_it_reads_stop_strings_one_a_line_with_escapes():
    assert parse_stops("\\n\\nuser:\n\nend\\\\\r\ntab\\there") == ["\n\nuser:", "end\\", "tab\there"]
    assert parse_stops(stops_text(["a\nb", "c\\d", "\t"])) == ["a\nb", "c\\d", "\t"]


# -- templates saved as versions ----------------------------------------------------------------------------------

def _save(client, user, name="qa", **fields):
    client.force_login(user)
    return client.post("/playground/templates/", {**FORM, "template_name": name, **fields}, HTTP_HX_REQUEST="true")


def test_saving_a_template_again_makes_a_new_version_and_keeps_the_old(client, alice, bob):
    first = _save(client, alice, template="Q: {input}\nA:", temperature="0.5", stop="\\n")
    assert first.status_code == 200 and "Saved qa as version 1." in first.content.decode()
    second = _save(client, alice, template="{examples}Question: {input}\nAnswer:",
                   examples=json.dumps([{"input": "1+1", "output": " 2"}]), max_tokens="32")
    assert "Saved qa as version 2." in second.content.decode()
    template = models.PromptTemplate.objects.get(owner=alice, name="qa")
    assert template.template == "{examples}Question: {input}\nAnswer:"
    assert template.examples == [{"input": "1+1", "output": " 2"}]
    assert template.sampling == {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "max_tokens": 32}
    v2, v1 = template.versions.all()
    assert (v1.number, v1.template, v1.examples) == (1, "Q: {input}\nA:", [])
    assert v1.sampling == {"temperature": 0.5, "top_k": 0, "top_p": 1.0, "max_tokens": 8, "seed": None,
                           "stop": ["\n"]}
    assert v2.number == 2 and v2.sampling["max_tokens"] == 32
    page = client.get("/playground/").content.decode()
    assert "qa v2 · " in page and "qa v1 · " in page and '"stop": "\\\\n"' in page
    assert "qa v1" not in (_save(client, bob, name="mine").content.decode())  # bob sees his own only
    assert models.PromptTemplate.objects.filter(owner=bob).count() == 1


def test_a_template_made_elsewhere_keeps_what_it_held_as_version_one(client, alice):
    models.PromptTemplate.objects.create(owner=alice, name="api-made", template="A: {input}",
                                         sampling={"temperature": 0.2})
    _save(client, alice, name="api-made", template="B: {input}")
    v2, v1 = models.PromptTemplate.objects.get(name="api-made").versions.all()
    assert (v1.number, v1.template, v1.sampling) == (1, "A: {input}", {"temperature": 0.2})
    assert (v2.number, v2.template) == (2, "B: {input}")


def test_it_refuses_to_save_a_bad_template_saying_why(client, alice):
    answer = _save(client, alice, template="{nope}")
    assert answer.status_code == 200 and "only {examples} and {input}" in answer.content.decode()
    assert "The template was not saved" in answer.content.decode()
    assert "template_name" in _save(client, alice, name="").content.decode()
    assert not models.PromptTemplate.objects.exists()


# -- history ------------------------------------------------------------------------------------------------------

def _record(client, user, deployment, **fields):
    client.force_login(user)
    body = {"deployment": deployment.pk, "input": "ROMEO:", "template": "{examples}{input}", "examples": [],
            "prompt": "ROMEO:", "sampling": {"temperature": 0, "top_k": 0, "top_p": 1, "max_tokens": 8,
                                              "seed": None, "stop": []},
            "output": " and Juliet", "error": "", "finish_reason": "length", "prompt_tokens": 3,
            "completion_tokens": 8, "ttft_ms": 41.5, "tokens_per_s": 120.2, "total_ms": 99.0, **fields}
    return client.post("/playground/history/record/", json.dumps(body), content_type="application/json")


def test_it_keeps_each_users_requests_and_lists_them_to_that_user_only(client, alice, bob, ready):
    answer = _record(client, alice, ready)
    assert answer.status_code == 201
    kept = models.PlaygroundRecord.objects.get(pk=answer.json()["id"])
    assert (kept.owner, kept.deployment, kept.model_name, kept.output) == (alice, ready, "alice-ready", " and Juliet")
    assert (kept.prompt_tokens, kept.completion_tokens, kept.ttft_ms, kept.tokens_per_s) == (3, 8, 41.5, 120.2)
    rows = client.get("/playground/history/").content.decode()
    assert f'data-testid="history-{kept.pk}"' in rows and "42 ms" in rows and "120.2" in rows
    replay = json.loads(next(line for line in rows.splitlines() if "data-replay" in line)
                        .split('data-replay="')[1].split('"')[0].replace("&quot;", '"'))
    assert replay == {"deployment": ready.pk, "input": "ROMEO:", "template": "{examples}{input}", "examples": [],
                      "sampling": {"temperature": 0, "top_k": 0, "top_p": 1, "max_tokens": 8, "seed": None},
                      "stop": ""}
    client.force_login(bob)
    assert f"history-{kept.pk}" not in client.get("/playground/history/").content.decode()
    assert f"history-{kept.pk}" not in client.get("/playground/").content.decode()


def test_a_prompt_and_answer_beyond_the_models_context_are_refused_as_v1_refuses_them(client, alice, ready):
    """The small model's context is 64 tokens, its tokens the text's bytes: the page refuses before streaming, with
    /v1's message, where the engine would otherwise answer from a window slid past the prompt."""
    v1 = APIClient()
    v1.credentials(HTTP_AUTHORIZATION=f"Bearer {alice.auth_token.key}")
    for fields, v1_request in [({"max_tokens": "64"}, {"prompt": "ROMEO:", "max_tokens": 64}),
                               ({"input": "x" * 70}, {"prompt": "x" * 70, "max_tokens": 8})]:
        refused = _prepare(client, alice, deployment=ready.pk, **fields).json()["errors"]["input"]
        v1_said = v1.post("/v1/completions", {"model": "alice-ready", **v1_request}, format="json")
        assert refused == [f"alice-ready: {v1_said.json()['error']['message']}"], refused
        assert "maximum context length is 64 tokens" in refused[0]
    prompts = _run_set(client, alice, ready, "short\n" + "x" * 70 + "\n").content.decode()
    assert "prompt 2: alice-ready: This model&#x27;s maximum context length is 64 tokens" in prompts
    assert "errors" not in _prepare(client, alice, deployment=ready.pk, max_tokens="58").json()  # 6 + 58 fit


def test_it_keeps_an_answer_holding_a_nul_or_another_control_character(client, alice, ready):
    """A model may generate any byte: the history keeps the answer, a NUL (which neither database keeps in text)
    as ␀ and other control characters as they are, for the page to mark."""
    answer = _record(client, alice, ready, output="a\x00b\x0bc", error="the server said \x00")
    assert answer.status_code == 201, answer.content
    kept = models.PlaygroundRecord.objects.get(pk=answer.json()["id"])
    assert (kept.output, kept.error) == ("a\u2400b\x0bc", "the server said \u2400")
    assert "a\u2400b\x0bc" in client.get("/playground/history/").content.decode()
    from_a_set = service.playground_record(owner=alice, deployment=ready, source="set", input="x", output="\x00")
    assert models.PlaygroundRecord.objects.get(pk=from_a_set.pk).output == "\u2400"


def test_it_keeps_no_record_of_a_deployment_the_user_may_not_see(client, bob, ready):
    answer = _record(client, bob, ready)
    assert answer.status_code == 400 and "deployment" in answer.json()["errors"]
    assert not models.PlaygroundRecord.objects.exists()


# -- prompt sets --------------------------------------------------------------------------------------------------

def _run_set(client, user, deployment, prompts, **fields):
    client.force_login(user)
    return client.post("/playground/set/", {**FORM, "deployment": deployment.pk, "prompts": prompts, **fields},
                       HTTP_HX_REQUEST="true")


def test_a_prompt_set_says_for_each_prompt_why_the_server_did_not_answer(client, alice, ready):
    answer = _run_set(client, alice, ready, "first\n\nsecond\n")
    assert answer.status_code == 200 and answer["HX-Trigger"] == "history-changed"
    page = answer.content.decode()
    assert 'data-testid="set-1-1"' in page and 'data-testid="set-2-1"' in page and "set-3-1" not in page
    assert page.count('<span class="error">') == 2 and "cannot be reached" in page
    records = models.PlaygroundRecord.objects.filter(owner=alice, source="set").order_by("id")
    assert [r.input for r in records] == ["first", "second"] and "cannot be reached" in records[0].error


def test_a_prompt_set_gives_a_rate_only_for_enough_tokens_to_time():
    assert service.Cell(completion_tokens=2, seconds=0.01).tokens_per_s is None  # not "200 tokens/s"
    least, soonest = service.MIN_RATE_TOKENS, service.MIN_RATE_MS / 1000
    assert service.Cell(completion_tokens=least - 1, seconds=1.0).tokens_per_s is None
    assert service.Cell(completion_tokens=100, seconds=soonest / 2).tokens_per_s is None
    assert service.Cell(completion_tokens=least, seconds=0.5).tokens_per_s == 2 * least


def test_it_refuses_a_prompt_set_with_no_prompts_or_too_many(client, alice, ready):
    assert "give the prompts, one a line" in _run_set(client, alice, ready, "\n \n").content.decode()
    too_many = _run_set(client, alice, ready, "\n".join(f"p{n}" for n in range(21)))
    assert "The prompt set was not run" in too_many.content.decode()
    assert "at most 20 a set" in too_many.content.decode()
    assert not models.PlaygroundRecord.objects.exists()


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
def test_a_prompt_set_is_answered_by_the_real_model_beside_a_second_deployment(client, api, alice,
                                                                                served_deployment):
    # the same Triton model through a second server row: the compared column gives the same greedy tokens
    server = served_deployment.server
    again = models.TritonServer.objects.create(name="local-again", http_url=server.http_url, grpc_url="",
                                               model_repository=server.model_repository)
    second = serving.deployment(alice, served_deployment.checkpoint, again, model_name=served_deployment.model_name)
    answer = _run_set(client, alice, served_deployment, "ROMEO:\nJULIET:", compare=second.pk, max_tokens="12",
                      template="{examples}{input}\n")
    assert answer.status_code == 200
    page = answer.content.decode()
    records = list(models.PlaygroundRecord.objects.filter(owner=alice).order_by("id"))
    assert [(r.input, r.deployment_id, r.error) for r in records] == [
        ("ROMEO:", served_deployment.pk, ""), ("ROMEO:", second.pk, ""),
        ("JULIET:", served_deployment.pk, ""), ("JULIET:", second.pk, "")]
    direct = api(alice).post(f"/api/deployments/{served_deployment.pk}/generate/",
                             {"prompt": "ROMEO:\n", "max_tokens": 12}, format="json").json()
    assert records[0].prompt == "ROMEO:\n"
    assert records[0].output == records[1].output == direct["text"] and direct["text"]
    assert records[0].completion_tokens == 12 and records[0].prompt_tokens == direct["prompt_tokens"] >= 1
    assert page.count('class="output wrap"') == 4 and "12 tokens" in page
