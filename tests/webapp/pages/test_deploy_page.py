"""The Deploy page: the checkpoints and servers offered, a deployment made through the service (pending, its task
sent once committed) or refused beside the field, the list with its live status, smoke check and lineage, and
undeploying."""
import pytest

from tests.webapp import serving
from trainer.contract import ParallelPlan
from trainer.contract.manifest import CheckpointManifest
from webapp import models
from webapp.pages.deploy import default_model_name
from webapp.services.demo import demo_ready

pytestmark = pytest.mark.django_db
Status = models.Deployment.Status


@pytest.fixture
def trained(alice, settings, tmp_path):
    """A checkpoint of alice's run "Shakes Run" at step 200, with the run's plan and model config."""
    settings.WORKBENCH = {**settings.WORKBENCH, "RUNS_ROOT": tmp_path / "runs"}
    cluster, dataset = demo_ready(alice)
    model = models.ModelConfig.objects.create(owner=alice, name="small-gpt", spec=serving.SMALL_MODEL.to_dict())
    plan = models.ParallelismPlan.objects.create(owner=alice, name="one-rank", model_config=model, cluster=cluster,
                                                 spec=ParallelPlan(micro_batch=2, global_batch=4).to_dict())
    run = models.Run.objects.create(owner=alice, name="Shakes Run", model_config=model, plan=plan, cluster=cluster,
                                    dataset=dataset, steps=200)
    return models.Checkpoint.objects.create(run=run, step=200, path=str(tmp_path / "ckpt"),
                                            manifest={"model": serving.SMALL_MODEL.to_dict()})


def _get(client, user, path="/deploy/", **query):
    client.force_login(user)
    return client.get(path, query)


def _post(client, user, checkpoint, to, **fields):
    client.force_login(user)
    body = {"checkpoint": checkpoint.pk, "server": to.pk, "reduction": "int8", "model_name": "",
            "tensor_parallel": 2, **fields}
    return client.post("/deploy/", body)


def test_it_sends_a_visitor_who_is_not_signed_in_to_the_sign_in_page(client):
    assert client.get("/deploy/")["Location"] == "/login/?next=/deploy/"
    assert client.post("/deploy/1/undeploy/").status_code == 302


def test_it_offers_the_checkpoints_the_user_may_see_and_the_servers(client, alice, bob, trained, small_checkpoint,
                                                                    nowhere):
    page = _get(client, alice).content.decode()
    assert "Shakes Run #" in page and "step 200" in page and "small (imported) · step 7" in page
    assert "nowhere (not seen ready, cpu)" in page
    assert '<button type="submit">Deploy</button>' in page
    for control in ("id_checkpoint", "id_reduction", "id_server", "id_model_name", "id_tensor_parallel"):
        assert f'<label for="{control}">' in page
    theirs = _get(client, bob).content.decode()
    assert "Shakes Run" not in theirs and "small (imported)" not in theirs


def test_it_preselects_the_checkpoint_asked_for_with_a_model_name_from_run_and_step(client, alice, trained, nowhere):
    page = _get(client, alice, checkpoint=trained.pk).content.decode()
    assert f'<option value="{trained.pk}" selected>' in page
    assert 'value="shakes-run-step-200"' in page
    field = _get(client, alice, "/deploy/model-name/", checkpoint=trained.pk).content.decode()
    assert 'id="model-name-field"' in field and 'value="shakes-run-step-200"' in field


def test_it_names_a_model_from_its_run_or_import_and_step(trained, small_checkpoint):
    assert default_model_name(trained) == "shakes-run-step-200"
    assert default_model_name(small_checkpoint) == "small-step-7"


def test_it_creates_a_pending_deployment_and_sends_the_deploy_task_once_committed(
        client, alice, trained, nowhere, sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        answer = _post(client, alice, trained, nowhere)
    deployment = models.Deployment.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/deploy/?deployed={deployment.pk}"
    assert (deployment.owner, deployment.checkpoint, deployment.server) == (alice, trained, nowhere)
    assert (deployment.status, deployment.model_name, deployment.reduction, deployment.tensor_parallel) == (
        Status.PENDING, "shakes-run-step-200", "int8", 2)
    assert sent == [("workbench.deployments.deploy", deployment.pk)]
    page = client.get(answer["Location"]).content.decode()
    assert f"Deployment {deployment.pk} (shakes-run-step-200) is queued" in page
    assert f'data-testid="deployment-status-{deployment.pk}">pending<' in page


@pytest.mark.parametrize("fields, said", [
    ({"tensor_parallel": 3}, "must divide the model"),          # 4 heads
    ({"tensor_parallel": 0}, "greater than or equal to 1"),
    ({"model_name": "no spaces"}, "letters, digits"),
    ({"reduction": "fp8"}, "Select a valid choice"),
    ({"server": 999999}, "Select a valid choice"),
])
def test_it_refuses_bad_input_beside_the_field_and_deploys_nothing(client, alice, trained, nowhere, sent, fields,
                                                                  said):
    answer = _post(client, alice, trained, nowhere, **fields)
    assert answer.status_code == 200
    page = answer.content.decode()
    assert said in page and 'class="errorlist"' in page and 'aria-invalid="true"' in page
    assert not models.Deployment.objects.exists() and not sent


def test_it_refuses_a_checkpoint_the_user_may_not_see_and_a_name_in_use(client, alice, bob, trained, nowhere, sent):
    assert "Select a valid choice" in _post(client, bob, trained, nowhere).content.decode()
    serving.deployment(alice, trained, nowhere, model_name="taken", status=Status.LOADING)
    answer = _post(client, alice, trained, nowhere, model_name="taken")
    assert "already serves a model named" in answer.content.decode()
    assert models.Deployment.objects.count() == 1 and not sent


def test_it_lists_the_users_deployments_with_smoke_check_and_lineage(client, alice, bob, trained, small_checkpoint,
                                                                     nowhere):
    run = trained.run
    ready = serving.deployment(alice, trained, nowhere, model_name="from-run", smoke_ok=True,
                               report={"bytes": 2_000_000, "ratio": 3.8, "perplexity_fp32": 25.47,
                                       "perplexity": 25.48, "smoke": {"prompt": "ROMEO:", "text": " and so"}})
    imported = serving.deployment(alice, small_checkpoint, nowhere, model_name="from-import", status=Status.FAILED,
                                  smoke_ok=False, status_message="the smoke check's tokens differ")
    page = _get(client, alice).content.decode()
    assert f'data-testid="deployment-status-{ready.pk}">ready<' in page
    assert f'data-testid="deployment-smoke-{ready.pk}">passed<' in page
    assert f'data-testid="deployment-smoke-{imported.pk}">failed<' in page
    assert "the smoke check&#x27;s tokens differ" in page and "25.470 → 25.480" in page and "3.8×" in page
    assert f'href="/runs/{run.pk}/">Shakes Run</a>' in page
    assert f'href="/api/plans/{run.plan_id}/">one-rank</a>' in page
    assert f'href="/api/model-configs/{run.model_config_id}/">small-gpt</a>' in page
    assert f'href="/api/checkpoints/{trained.pk}/">step 200</a>' in page
    assert "imported: no run · model small" in page
    assert f'href="/playground/?deployment={ready.pk}"' in page
    assert "from-run" not in _get(client, bob).content.decode()


def test_it_polls_the_status_while_a_deployment_is_on_its_way_and_stops_when_none_is(client, alice, trained,
                                                                                      nowhere):
    moving = serving.deployment(alice, trained, nowhere, status=Status.EXPORTING,
                                status_message="exporting for 12 s")
    rows = _get(client, alice, "/deploy/deployments/").content.decode()
    assert 'hx-trigger="every 2s"' in rows and "exporting for 12 s" in rows
    assert 'hx-trigger="every 2s"' in client.get("/deploy/").content.decode()
    moving.status = Status.READY
    moving.save()
    rows = client.get("/deploy/deployments/").content.decode()
    assert 'hx-trigger="every 2s"' not in rows
    assert f'data-testid="deployment-status-{moving.pk}">ready<' in rows
    moving.status = Status.RELOADING  # its server came back without it: the reconcile pass loads it again
    moving.save()
    assert 'hx-trigger="every 2s"' in client.get("/deploy/deployments/").content.decode()


def test_it_undeploys_through_the_service_and_watches_until_unloaded(client, alice, bob, trained, nowhere, sent,
                                                                     django_capture_on_commit_callbacks):
    mine = serving.deployment(alice, trained, nowhere)
    client.force_login(bob)
    assert client.post(f"/deploy/{mine.pk}/undeploy/").status_code == 404
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(f"/deploy/{mine.pk}/undeploy/", HTTP_HX_REQUEST="true")
    assert answer.status_code == 200 and sent == [("workbench.deployments.undeploy", mine.pk)]
    rows = answer.content.decode()
    assert "Undeploying small" in rows and f"watch={mine.pk}" in rows and 'hx-trigger="every 2s"' in rows
    mine.status = Status.UNLOADED
    mine.save()
    rows = client.get("/deploy/deployments/", {"watch": mine.pk}).content.decode()
    assert 'hx-trigger="every 2s"' not in rows and "Unload small" not in rows
    with django_capture_on_commit_callbacks(execute=True):
        plain = client.post(f"/deploy/{mine.pk}/undeploy/")
    assert plain.status_code == 302 and plain["Location"] == f"/deploy/?watch={mine.pk}"
    assert "Undeploying small" in client.get(plain["Location"]).content.decode()
    assert client.get("/deploy/deployments/", {"watch": mine.pk, "polls": 60}).status_code == 200


def test_it_exports_a_checkpoint_to_the_hugging_face_layout_and_follows_it(client, alice, bob, trained, tmp_path,
                                                                          settings):
    settings.WORKBENCH = {**settings.WORKBENCH, "CONVERSIONS_ROOT": tmp_path / "conversions"}
    folder = tmp_path / "ckpt"
    folder.mkdir()
    CheckpointManifest(step=200, format="consolidated", tokens_seen=0, model=serving.SMALL_MODEL.to_dict(),
                       plan=ParallelPlan().to_dict(), world_size=1, tokenizer="", seed=0).write(folder)
    page = _get(client, alice).content.decode()
    assert 'data-testid="export-hf">Export to the Hugging Face layout</button>' in page
    assert "No import or export yet." in page
    client.force_login(bob)
    assert client.post("/deploy/export-hf/", {"checkpoint": trained.pk}).status_code == 302
    assert not models.CheckpointConversion.objects.exists()  # not bob's to see
    client.force_login(alice)
    answer = client.post("/deploy/export-hf/", {"checkpoint": trained.pk}, follow=True)
    conversion = models.CheckpointConversion.objects.get()
    assert conversion.kind == "export-hf" and conversion.checkpoint == trained and conversion.status == "pending"
    page = answer.content.decode()
    assert f"Export {conversion.pk} of checkpoint {trained.pk} is queued" in page
    assert f'data-testid="conversion-status-{conversion.pk}">pending</span>' in page
    assert 'hx-get="/deploy/conversions/" hx-trigger="every 2s"' in page  # it follows the export while it runs
    models.CheckpointConversion.objects.filter(pk=conversion.pk).update(status="done")
    rows = _get(client, alice, "/deploy/conversions/").content.decode()
    assert f'data-testid="conversion-target-{conversion.pk}">{conversion.target}</code>' in rows
    assert "every 2s" not in rows


def test_it_refuses_an_import_from_outside_the_models_directory_and_says_why(client, alice, tmp_path, settings):
    settings.WORKBENCH = {**settings.WORKBENCH, "MODELS_ROOT": tmp_path / "models"}
    (tmp_path / "models").mkdir()
    client.force_login(alice)
    page = client.post("/deploy/import-hf/", {"path": str(tmp_path), "name": "x"}, follow=True).content.decode()
    assert "outside the models directory" in page and not models.CheckpointConversion.objects.exists()
