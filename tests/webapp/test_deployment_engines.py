"""A deployment's engine: the workbench's (the default, any model) or vLLM's. A deployment vLLM cannot serve is
refused when it is made, naming the field ``engine`` and the export's own reason (deploy.vllm.rules, which the web
process reads without torch); the deploy page shows, per checkpoint, which engines can serve it, offers vLLM
disabled with the reason where it cannot, and lists each deployment's engine."""
import pytest

from tests.webapp import serving
from webapp import models

pytestmark = pytest.mark.django_db

HEAD_DIM_16 = serving.SMALL_MODEL.replace(name="head16", n_heads=8)  # d_model 128 / 8 heads: no vLLM CPU kernel
ROPE_GPT = serving.SMALL_MODEL.replace(name="rope-gpt", positions="rope")  # no Hugging Face class computes it


@pytest.fixture
def head16(alice, data_root):
    return serving.imported(alice, serving.checkpoint_folder(data_root / "head16", model=HEAD_DIM_16))


def _new(checkpoint, server, **fields) -> dict:
    return {"checkpoint": checkpoint.pk, "server": server.pk, "model_name": "small", **fields}


def test_a_deployment_is_served_by_the_workbench_engine_unless_vllm_is_asked(
        api, alice, small_checkpoint, nowhere, sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        plain = api(alice).post("/api/deployments/", _new(small_checkpoint, nowhere), format="json")
        vllm = api(alice).post("/api/deployments/", _new(small_checkpoint, nowhere, model_name="small-vllm",
                                                         engine="vllm"), format="json")
    assert (plain.status_code, vllm.status_code) == (201, 201), (plain.json(), vllm.json())
    assert (plain.json()["engine"], vllm.json()["engine"]) == ("workbench", "vllm")
    assert models.Deployment.objects.get(pk=vllm.json()["id"]).engine == models.Deployment.Engine.VLLM
    assert sent == [("workbench.deployments.deploy", plain.json()["id"]),
                    ("workbench.deployments.deploy", vllm.json()["id"])]
    listed = api(alice).get("/api/deployments/", {"engine": "vllm"}).json()["results"]
    assert [d["id"] for d in listed] == [vllm.json()["id"]]


@pytest.mark.parametrize("model, fields, said", [
    (HEAD_DIM_16, {}, "head_dim 16 (d_model 128 / n_heads 8): vLLM's CPU attention has kernels for head sizes 32"),
    (ROPE_GPT, {}, "positions='rope' cannot be exported as a GPT2LMHeadModel"),
    (serving.SMALL_MODEL, {"reduction": "int8"}, "reduction int8: vLLM loads int8 only from checkpoints quantized"),
    (serving.SMALL_MODEL, {"engine": "tgi"}, "is not a valid choice"),
])
def test_a_deployment_vllm_cannot_serve_is_refused_naming_the_engine_and_why(api, alice, data_root, nowhere, sent,
                                                                            model, fields, said):
    checkpoint = serving.imported(alice, serving.checkpoint_folder(data_root / model.name, model=model))
    answer = api(alice).post("/api/deployments/", _new(checkpoint, nowhere, **{"engine": "vllm", **fields}),
                             format="json")
    assert answer.status_code == 400 and said in " ".join(answer.json()["engine"]), answer.json()
    assert not models.Deployment.objects.exists() and not sent
    if "reduction" not in fields and "engine" not in fields:  # the workbench engine serves what vLLM cannot
        workbench = api(alice).post("/api/deployments/", _new(checkpoint, nowhere), format="json")
        assert workbench.status_code == 201, workbench.json()


def test_vllms_head_size_limit_is_the_cpus_only(api, alice, head16, staff, sent):
    gpu = models.TritonServer.objects.create(name="gpu-box", kind="external", http_url="http://10.0.0.5:8000",
                                             model_repository="/srv/triton/models", instance_kind="gpu")
    answer = api(alice).post("/api/deployments/", _new(head16, gpu, engine="vllm"), format="json")
    assert answer.status_code == 201, answer.json()


def _page(client, user, **query) -> str:
    client.force_login(user)
    return client.get("/deploy/", query).content.decode()


def test_the_page_offers_vllm_for_a_checkpoint_it_can_serve(client, alice, small_checkpoint, nowhere):
    page = _page(client, alice, checkpoint=small_checkpoint.pk)
    assert '<label for="id_engine">Engine</label>' in page
    assert '<option value="vllm" >vLLM</option>' in page
    assert "serves this checkpoint: workbench, vllm" in page


def test_the_page_disables_vllm_with_the_reason_and_keeps_the_workbench_engine(client, alice, head16, nowhere):
    page = _page(client, alice, checkpoint=head16.pk)
    assert '<option value="workbench" selected>' in page
    assert '<option value="vllm"  disabled title="head_dim 16' in page
    assert "serves this checkpoint: workbench" in page and "vllm cannot: head_dim 16" in page
    # a checkpoint chosen on the page: its engines come with the model name (htmx swaps the field out of band)
    client.force_login(alice)
    swapped = client.get("/deploy/model-name/", {"checkpoint": head16.pk, "server": nowhere.pk,
                                                 "engine": "vllm"}).content.decode()
    assert 'id="engine-field" hx-swap-oob="true"' in swapped and "vllm cannot: head_dim 16" in swapped
    assert '<option value="workbench" selected>' in swapped
    fine = client.get("/deploy/engine/", {"checkpoint": head16.pk, "server": "", "engine": "vllm"}).content.decode()
    assert "vllm cannot: head_dim 16" in fine


def test_the_page_deploys_on_the_engine_chosen_and_refuses_one_that_cannot_beside_the_field(
        client, alice, small_checkpoint, head16, nowhere, sent):
    client.force_login(alice)
    body = {"server": nowhere.pk, "reduction": "none", "tensor_parallel": 1, "engine": "vllm"}
    refused = client.post("/deploy/", {**body, "checkpoint": head16.pk, "model_name": "h16"}).content.decode()
    assert 'id="engine-errors"' in refused and "the vllm engine cannot serve checkpoint" in refused
    assert not models.Deployment.objects.exists() and not sent
    answer = client.post("/deploy/", {**body, "checkpoint": small_checkpoint.pk, "model_name": "small-vllm"})
    deployment = models.Deployment.objects.get()
    assert answer.status_code == 302 and deployment.engine == "vllm"
    listed = client.get(answer["Location"]).content.decode()
    assert f'data-testid="deployment-engine-{deployment.pk}">vllm<' in listed


@pytest.mark.parametrize("engine", ["workbench", "vllm"])
def test_the_worker_exports_with_the_deployments_engine(engine):
    from workers import deploying

    deployment = models.Deployment(checkpoint=models.Checkpoint(path="/ckpt"), model_name="m", engine=engine,
                                   server=models.TritonServer(model_repository="/models"))
    command = deploying.export_command(deployment)
    assert command[command.index("--engine") + 1] == engine
