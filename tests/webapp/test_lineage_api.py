"""Lineage through the API: a run created from a checkpoint (init_from), a checkpoint's chain of parents down to an
import, and the import and export requests (their refusals and the conversions they queue)."""
import json

import pytest

from trainer.contract import ParallelPlan, presets
from trainer.contract.manifest import CheckpointManifest
from webapp import models


def _checkpoint_folder(folder, model: str = "tiny-llama", **manifest):
    """A checkpoint folder with its manifest alone: what the web side reads of one."""
    folder.mkdir(parents=True)
    CheckpointManifest(step=0, format="consolidated", tokens_seen=0, model=presets.MODELS[model].to_dict(),
                       plan=ParallelPlan().to_dict(), world_size=1, tokenizer="", seed=0, **manifest).write(folder)
    return folder


@pytest.fixture
def imported(alice, tmp_path):
    folder = _checkpoint_folder(tmp_path / "conversions" / "imports" / "1")
    return models.Checkpoint.objects.create(owner=alice, name="tiny-llama-hf", step=0, path=str(folder),
                                            manifest=json.loads((folder / "manifest.json").read_text()),
                                            imported_from="/models/tiny-llama-hf")


@pytest.fixture
def cpu1(db):
    return models.Cluster.objects.create(name="cpu1", spec=presets.local_cpu_cluster(1).to_dict())


def _plan(owner, cluster, model: str):
    config = models.ModelConfig.objects.create(owner=owner, name=model, spec=presets.MODELS[model].to_dict())
    spec = ParallelPlan(micro_batch=1, global_batch=2).to_dict()
    return models.ParallelismPlan.objects.create(owner=owner, name=f"{model}-plan", model_config=config,
                                                 cluster=cluster, spec=spec)


def _create(client, plan, dataset, **extra):
    return client.post("/api/runs/", {"name": "ft", "plan": plan.id, "dataset": dataset.id, "steps": 4, **extra},
                       format="json")


def test_a_run_starts_from_a_checkpoint_and_says_so(alice, api, cpu1, corpus, imported):
    created = _create(api(alice), _plan(alice, cpu1, "tiny-llama"), corpus, init_from=imported.id,
                      keep_tokenizer=False)
    assert created.status_code == 201, created.data
    run = created.data
    assert run["init_from"] == imported.id and run["keep_tokenizer"] is False
    assert run["spec"]["init_from"] == {"checkpoint": imported.path, "keep_tokenizer": False}
    assert run["started_from"] == f"started from checkpoint {imported.id}: imported from /models/tiny-llama-hf"
    assert api(alice).get("/api/runs/").json()["results"][0]["started_from"] == run["started_from"]
    fresh = _create(api(alice), _plan(alice, cpu1, "tiny"), corpus).data
    assert fresh["init_from"] is None and fresh["started_from"] == "" and fresh["spec"].get("init_from") is None


def test_it_refuses_a_checkpoint_of_another_model_naming_the_fields(alice, api, cpu1, corpus, imported):
    refused = _create(api(alice), _plan(alice, cpu1, "tiny-mixtral"), corpus, init_from=imported.id)
    assert refused.status_code == 400
    [message] = refused.data["init_from"]
    assert "differs from the plan's model config in" in message and "n_experts 0 ≠ 4" in message
    assert "rope_scaling" in message and "name" not in message.split(" in ")[1].split(" (")[0]
    no_tokenizer = _create(api(alice), _plan(alice, cpu1, "tiny-llama"), corpus, init_from=imported.id)
    assert no_tokenizer.status_code == 400
    assert "records no tokenizer to keep" in no_tokenizer.data["keep_tokenizer"][0]


def test_it_refuses_a_checkpoint_the_user_may_not_see_or_that_was_pruned(alice, bob, api, cpu1, corpus, imported,
                                                                          tmp_path):
    bobs = models.Dataset.objects.create(owner=bob, name="c", path=corpus.path)
    hidden = _create(api(bob), _plan(bob, cpu1, "tiny-llama"), bobs, init_from=imported.id)
    assert hidden.status_code == 400 and "no checkpoint" in hidden.data["init_from"][0]
    (tmp_path / "conversions" / "imports" / "1" / "manifest.json").unlink()
    pruned = _create(api(alice), _plan(alice, cpu1, "tiny-llama"), corpus, init_from=imported.id,
                     keep_tokenizer=False)
    assert pruned.status_code == 400 and "no longer holds a complete checkpoint" in pruned.data["init_from"][0]


def test_a_checkpoints_lineage_goes_down_to_the_import(alice, api, cpu1, corpus, imported):
    run_id = _create(api(alice), _plan(alice, cpu1, "tiny-llama"), corpus, init_from=imported.id,
                     keep_tokenizer=False).data["id"]
    run = models.Run.objects.get(pk=run_id)
    trained = models.Checkpoint.objects.create(run=run, step=4, path=run.run_dir + "/checkpoints/step-4",
                                               manifest={"started_from": imported.path})
    body = api(alice).get(f"/api/checkpoints/{trained.id}/").json()
    assert body["lineage"] == [
        {"checkpoint": trained.id, "text": f"checkpoint {trained.id}: step 4 of run 'ft' ({run_id})"},
        {"checkpoint": imported.id, "text": f"checkpoint {imported.id}: imported from /models/tiny-llama-hf"}]
    assert api(alice).get(f"/api/checkpoints/{imported.id}/").json()["imported_from"] == "/models/tiny-llama-hf"


@pytest.fixture
def models_root(tmp_path, settings):
    root = tmp_path / "models"
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "config.json").write_text("{}")
    (root / "bare").mkdir()
    settings.WORKBENCH = {**settings.WORKBENCH, "MODELS_ROOT": root, "CONVERSIONS_ROOT": tmp_path / "conversions"}
    return root


def test_an_import_reads_only_the_models_directory(alice, api, models_root, tmp_path):
    client = api(alice)
    outside = client.post("/api/checkpoints/import-hf/", {"path": str(tmp_path)}, format="json")
    assert outside.status_code == 400 and "outside the models directory" in outside.data["path"][0]
    (models_root / "escape").symlink_to(tmp_path)
    linked = client.post("/api/checkpoints/import-hf/", {"path": str(models_root / "escape")}, format="json")
    assert linked.status_code == 400 and "outside the models directory" in linked.data["path"][0]
    relative = client.post("/api/checkpoints/import-hf/", {"path": "tiny"}, format="json")
    assert relative.status_code == 400 and "absolute path" in relative.data["path"][0]
    bare = client.post("/api/checkpoints/import-hf/", {"path": str(models_root / "bare")}, format="json")
    assert bare.status_code == 400 and "has no config.json" in bare.data["path"][0]
    unknown = client.post("/api/checkpoints/import-hf/", {"path": str(models_root / "tiny"), "x": 1}, format="json")
    assert unknown.status_code == 400 and "unknown field" in unknown.data["x"][0]


def _queued(quiet_broker):
    return [json.loads(m)["headers"] for m in quiet_broker.lrange("celery", 0, -1)]


def test_an_import_and_an_export_are_queued_and_followed(alice, bob, api, models_root, imported, quiet_broker,
                                                         django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        started = api(alice).post("/api/checkpoints/import-hf/", {"path": str(models_root / "tiny")}, format="json")
    assert started.status_code == 202, started.data
    body = started.data
    assert body["status"] == "pending" and body["kind"] == "import-hf" and body["name"] == "tiny"
    assert body["source"] == str(models_root.resolve() / "tiny") and body["target"].endswith(f"/imports/{body['id']}")
    with django_capture_on_commit_callbacks(execute=True):
        export = api(alice).post(f"/api/checkpoints/{imported.id}/export-hf/")
    assert export.status_code == 202 and export.data["checkpoint"] == imported.id
    assert sorted((h["task"], h["argsrepr"]) for h in _queued(quiet_broker)) == [
        ("workbench.checkpoints.export_hf", f"({export.data['id']},)"),
        ("workbench.checkpoints.import_hf", f"({body['id']},)")]
    assert api(alice).get(f"/api/conversions/{body['id']}/").json()["status"] == "pending"
    assert api(alice).get("/api/conversions/", {"kind": "export-hf"}).json()["count"] == 1
    assert api(bob).get(f"/api/conversions/{body['id']}/").status_code == 404
    assert api(bob).post(f"/api/checkpoints/{imported.id}/export-hf/").status_code == 404
