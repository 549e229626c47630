"""Serving over REST: Triton servers, imported checkpoints, deployments and generation, prompt templates.

Without Triton: validation, the personas' permissions, and a 503 with a message (never a 500) when a server's URL
points where nothing listens. With the session's real Triton: generation through the API gives the checkpoint's own
greedy tokens (the exporter's smoke tokens), and a stream gives them token by token."""
import json

import pytest

from tests.webapp import serving
from webapp import models

Status = models.Deployment.Status


def _events(response) -> list[tuple[str, dict]]:
    """The (event, data) pairs of a text/event-stream answer."""
    text = b"".join(response.streaming_content).decode()
    found = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        found.append((lines.get("event", ""), json.loads(lines["data"])))
    return found


# -- Triton servers -----------------------------------------------------------------------------------------------

SERVER = {"name": "gpu-box", "kind": "external", "http_url": "http://10.0.0.5:8000", "grpc_url": "10.0.0.5:8001",
          "metrics_url": "http://10.0.0.5:8002", "model_repository": "/srv/triton/models"}


def test_it_lets_staff_manage_triton_servers_and_everyone_signed_in_read_them(api, alice, staff):
    assert api(alice).post("/api/triton-servers/", SERVER, format="json").status_code == 403
    assert api(None).get("/api/triton-servers/").status_code == 401
    created = api(staff).post("/api/triton-servers/", SERVER, format="json")
    assert created.status_code == 201, created.json()
    assert api(alice).get("/api/triton-servers/").json()["results"][0]["name"] == "gpu-box"
    server = created.json()["id"]
    assert api(alice).patch(f"/api/triton-servers/{server}/", {"name": "x"}, format="json").status_code == 403
    assert api(staff).patch(f"/api/triton-servers/{server}/", {"name": "x"}, format="json").status_code == 200


@pytest.mark.parametrize("field, value", [("http_url", "ftp://10.0.0.5"), ("http_url", "10.0.0.5:8000"),
                                          ("grpc_url", "http://10.0.0.5:8001"), ("metrics_url", "nowhere"),
                                          ("model_repository", "models"), ("kind", "cloud")])
def test_it_refuses_a_server_with_a_bad_field_naming_it(api, staff, field, value):
    answer = api(staff).post("/api/triton-servers/", {**SERVER, field: value}, format="json")
    assert answer.status_code == 400 and field in answer.json(), answer.json()


def test_it_answers_a_servers_status_503_with_a_message_when_it_cannot_be_reached(api, alice, nowhere):
    nowhere.is_ready = True
    nowhere.save()
    answer = api(alice).get(f"/api/triton-servers/{nowhere.pk}/status/")
    assert answer.status_code == 503
    assert "cannot be reached" in answer.json()["detail"] and nowhere.http_url in answer.json()["detail"]
    nowhere.refresh_from_db()
    assert nowhere.is_ready is False
    assert api(alice).get("/api/triton-servers/999999/status/").status_code == 404


# -- checkpoints registered from a folder -------------------------------------------------------------------------

def test_it_registers_a_checkpoint_folder_under_the_users_data_roots_once(api, alice, data_root):
    folder = serving.checkpoint_folder(data_root / "imports" / "gpt2")
    first = api(alice).post("/api/checkpoints/register/", {"path": str(folder)}, format="json")
    assert first.status_code == 201, first.json()
    body = first.json()
    assert body["source"] == "imported" and body["run"] is None and body["owner"] == "alice"
    assert body["name"] == "gpt2" and body["step"] == 7 and body["manifest"]["model"]["n_heads"] == 4
    again = api(alice).post("/api/checkpoints/register/", {"path": str(folder), "name": "other"}, format="json")
    assert again.status_code == 200 and again.json()["id"] == body["id"]


@pytest.mark.parametrize("where", ["outside", "no manifest", "relative", "tokenizer outside"])
def test_it_refuses_a_folder_it_may_not_read_or_that_holds_no_checkpoint(api, alice, data_root, tmp_path, where):
    if where == "outside":
        path = str(serving.checkpoint_folder(tmp_path / "elsewhere"))
    elif where == "no manifest":
        (data_root / "empty").mkdir()
        (data_root / "empty" / "weights.bin").write_bytes(b"0")
        path = str(data_root / "empty")
    elif where == "relative":
        path = "imports/gpt2"
    else:
        folder = serving.checkpoint_folder(data_root / "ckpt")
        manifest = json.loads((folder / "manifest.json").read_text())
        secret = tmp_path / "secret.json"
        secret.write_text("{}")
        (folder / "manifest.json").write_text(json.dumps({**manifest, "tokenizer": str(secret)}))
        path = str(folder)
    answer = api(alice).post("/api/checkpoints/register/", {"path": path}, format="json")
    assert answer.status_code == 400 and answer.json()["path"], answer.json()
    assert not models.Checkpoint.objects.exists()


def test_it_shows_an_imported_checkpoint_to_its_owner_and_staff_only(api, alice, bob, staff, small_checkpoint):
    path = f"/api/checkpoints/{small_checkpoint.pk}/"
    assert api(alice).get(path).status_code == 200
    assert api(staff).get(path).status_code == 200
    assert api(bob).get(path).status_code == 404
    assert api(bob).get("/api/checkpoints/").json()["count"] == 0
    assert api(None).get(path).status_code == 401


# -- deployments --------------------------------------------------------------------------------------------------

def _new(checkpoint, server, **fields) -> dict:
    return {"checkpoint": checkpoint.pk, "server": server.pk, "model_name": "small", **fields}


def test_it_creates_a_pending_deployment_and_sends_the_deploy_task_once_committed(
        api, alice, small_checkpoint, nowhere, sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        answer = api(alice).post("/api/deployments/", _new(small_checkpoint, nowhere, reduction="int8",
                                                           tensor_parallel=2, instances=2, streaming=False),
                                 format="json")
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert body["status"] == "pending" and body["owner"] == "alice" and body["smoke_ok"] is None
    assert (body["reduction"], body["tensor_parallel"], body["instances"], body["streaming"]) == ("int8", 2, 2, False)
    assert sent == [("workbench.deployments.deploy", body["id"])]


@pytest.mark.parametrize("fields, field", [
    ({"tensor_parallel": 3}, "tensor_parallel"),   # does not divide 4 heads
    ({"tensor_parallel": 0}, "tensor_parallel"),
    ({"instances": 0}, "instances"),
    ({"model_name": "no spaces"}, "model_name"),
    ({"model_name": 12}, "model_name"),
    ({"reduction": "fp8"}, "reduction"),
    ({"streaming": "yes"}, "streaming"),
    ({"checkpoint": 999999}, "checkpoint"),
    ({"server": 999999}, "server"),
])
def test_it_refuses_a_deployment_naming_the_field_to_change(api, alice, small_checkpoint, nowhere, sent, fields,
                                                            field):
    answer = api(alice).post("/api/deployments/", {**_new(small_checkpoint, nowhere), **fields}, format="json")
    assert answer.status_code == 400 and field in answer.json(), answer.json()
    assert not models.Deployment.objects.exists() and not sent


def test_it_keeps_a_model_name_for_the_deployment_holding_it_then_frees_it(api, alice, small_checkpoint, nowhere):
    held = serving.deployment(alice, small_checkpoint, nowhere, status=Status.LOADING)
    clash = api(alice).post("/api/deployments/", _new(small_checkpoint, nowhere), format="json")
    assert clash.status_code == 400 and "already serves" in clash.json()["model_name"][0], clash.json()
    held.status = Status.UNLOADED
    held.save()
    assert api(alice).post("/api/deployments/", _new(small_checkpoint, nowhere), format="json").status_code == 201


def test_it_lets_no_one_deploy_a_checkpoint_they_may_not_see(api, bob, small_checkpoint, nowhere):
    answer = api(bob).post("/api/deployments/", _new(small_checkpoint, nowhere), format="json")
    assert answer.status_code == 400 and "checkpoint" in answer.json()


def test_it_lets_the_owner_and_staff_undeploy_and_others_at_most_see(api, alice, bob, staff, small_checkpoint,
                                                                     nowhere, sent,
                                                                     django_capture_on_commit_callbacks):
    mine = serving.deployment(alice, small_checkpoint, nowhere)
    path = f"/api/deployments/{mine.pk}/undeploy/"
    assert api(None).post(path).status_code == 401
    assert api(bob).post(path).status_code == 404  # not shared: not even seen
    mine.shared = True
    mine.save()
    assert api(bob).get(f"/api/deployments/{mine.pk}/").status_code == 200
    assert api(bob).post(path).status_code == 403
    with django_capture_on_commit_callbacks(execute=True):
        assert api(alice).post(path).status_code == 200
        assert api(staff).post(path).status_code == 200
    assert sent == [("workbench.deployments.undeploy", mine.pk)] * 2


GENERATE = {"prompt": "ROMEO:", "max_tokens": 8}


@pytest.mark.parametrize("fields, field", [
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 4097}, "max_tokens"), ({"max_tokens": 8.5}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"seed": -1}, "seed"), ({"stop": "\n"}, "stop"), ({"stop": ["x"] * 9}, "stop"),
    ({"stop": ["x" * 65]}, "stop"), ({"stop": [""]}, "stop"), ({"protocol": "udp"}, "protocol"),
    ({"stream": 1}, "stream"), ({"prompt": ""}, "prompt"), ({"temprature": 1.0}, "temprature"),
])
def test_it_refuses_generation_out_of_bounds_naming_the_field(api, alice, small_checkpoint, nowhere, fields,
                                                              field):
    ready = serving.deployment(alice, small_checkpoint, nowhere)
    answer = api(alice).post(f"/api/deployments/{ready.pk}/generate/", {**GENERATE, **fields}, format="json")
    assert answer.status_code == 400 and field in answer.json(), answer.json()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("protocol", [None, "http", "grpc"])
def test_it_answers_503_with_a_message_when_the_triton_server_cannot_be_reached(api, alice, small_checkpoint,
                                                                                nowhere, stream, protocol):
    ready = serving.deployment(alice, small_checkpoint, nowhere)
    body = {**GENERATE, "stream": stream, **({"protocol": protocol} if protocol else {})}
    answer = api(alice).post(f"/api/deployments/{ready.pk}/generate/", body, format="json")
    assert answer.status_code == 503 and answer["Content-Type"] == "application/json"
    assert "cannot be reached" in answer.json()["detail"], answer.json()


def test_it_asks_triton_over_http_unless_the_request_names_grpc_streams_too(nowhere):
    """A gRPC stream costs the web server twice the CPU of an HTTP one (docs/deployment.md, The client)."""
    from webapp.services.deployments import _protocol

    asked = {named: _protocol(nowhere, named) for named in (None, "grpc", "http")}
    assert asked == {None: "http", "grpc": "grpc", "http": "http"}


@pytest.mark.once  # the real Triton: once, on the first database
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_it_answers_503_with_a_message_when_triton_has_not_loaded_the_model(api, alice, small_checkpoint, triton,
                                                                           stream, protocol):
    """Triton answers but has not loaded the model (it restarted, or someone unloaded it): 503, saying so."""
    server = models.TritonServer.objects.create(name="live", http_url=triton.http_url, grpc_url=triton.grpc_url,
                                                model_repository=str(triton.repository))
    ready = serving.deployment(alice, small_checkpoint, server, model_name="never-loaded")
    body = {**GENERATE, "stream": stream, "protocol": protocol}
    answer = api(alice).post(f"/api/deployments/{ready.pk}/generate/", body, format="json")
    assert answer.status_code == 503 and "not loaded" in answer.json()["detail"], answer.json()


def test_it_answers_503_saying_why_for_a_deployment_that_is_not_ready(api, alice, small_checkpoint, nowhere):
    failed = serving.deployment(alice, small_checkpoint, nowhere, status=Status.FAILED,
                                status_message="the export was refused: no tokenizer")
    answer = api(alice).post(f"/api/deployments/{failed.pk}/generate/", GENERATE, format="json")
    assert answer.status_code == 503
    assert "failed: the export was refused: no tokenizer" in answer.json()["detail"]


def test_it_lets_whoever_sees_a_deployment_generate_with_it(api, alice, bob, small_checkpoint, nowhere):
    theirs = serving.deployment(alice, small_checkpoint, nowhere)
    path = f"/api/deployments/{theirs.pk}/generate/"
    assert api(None).post(path, GENERATE, format="json").status_code == 401
    assert api(bob).post(path, GENERATE, format="json").status_code == 404
    theirs.shared = True
    theirs.save()
    assert api(bob).post(path, GENERATE, format="json").status_code == 503  # let through, to the unreachable server


# -- prompt templates ---------------------------------------------------------------------------------------------

def test_it_keeps_prompt_templates_per_owner_and_checks_their_parts(api, alice, bob):
    body = {"name": "qa", "chat_template": "<|{role}|>\n{content}\n", "examples": [{"input": "2+2", "output": "4"}],
            "sampling": {"temperature": 0.7, "max_tokens": 32}}
    created = api(alice).post("/api/prompt-templates/", body, format="json")
    assert created.status_code == 201, created.json()
    template = created.json()["id"]
    assert api(bob).get(f"/api/prompt-templates/{template}/").status_code == 404
    assert api(alice).post("/api/prompt-templates/", body, format="json").status_code == 409  # the name again
    for field, value in [("chat_template", "{role}: {text}"), ("chat_template", "{role"), ("template", "{prompt}"),
                         ("examples", [{"input": "x"}]), ("examples", "x"), ("sampling", {"top_p": 2}),
                         ("sampling", {"beam": 4})]:
        answer = api(alice).post("/api/prompt-templates/", {"name": f"t-{field}", field: value}, format="json")
        assert answer.status_code == 400 and field in answer.json(), (field, value, answer.json())


# -- with the real Triton -----------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_it_generates_the_checkpoints_own_greedy_tokens(api, alice, served_deployment, protocol):
    smoke = served_deployment.report["smoke"]
    answer = api(alice).post(f"/api/deployments/{served_deployment.pk}/generate/",
                             {"prompt": smoke["prompt"], "max_tokens": smoke["max_tokens"], "protocol": protocol},
                             format="json")
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert body["token_ids"] == smoke["token_ids"] and body["text"] == smoke["text"]
    assert body["completion_tokens"] == smoke["max_tokens"] and body["prompt_tokens"] >= 1
    assert body["finish_reason"] == "length"


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_it_streams_token_events_then_done(api, alice, served_deployment, protocol):
    smoke = served_deployment.report["smoke"]
    answer = api(alice).post(f"/api/deployments/{served_deployment.pk}/generate/",
                             {"prompt": smoke["prompt"], "max_tokens": smoke["max_tokens"], "stream": True,
                              "protocol": protocol}, format="json")
    assert answer.status_code == 200 and answer["Content-Type"] == "text/event-stream"
    events = _events(answer)
    names = [name for name, _ in events]
    assert names == ["token"] * (len(names) - 1) + ["done"] and len(names) > 3
    tokens = [t for name, data in events if name == "token" for t in data["token_ids"]]
    done = events[-1][1]
    assert tokens == done["token_ids"] == smoke["token_ids"]
    assert "".join(data["text"] for name, data in events if name == "token") == done["text"] == smoke["text"]
    assert done["completion_tokens"] == smoke["max_tokens"] and done["finish_reason"] == "length"


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
def test_it_answers_the_servers_status_with_its_models(api, alice, served_deployment):
    answer = api(alice).get(f"/api/triton-servers/{served_deployment.server_id}/status/")
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert body["ready"] is True and body["metadata"]["name"] == "triton"
    assert {"name": served_deployment.model_name, "state": "READY"}.items() <= next(
        m for m in body["models"] if m["name"] == served_deployment.model_name).items()
