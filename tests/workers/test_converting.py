"""Imports and exports of the Hugging Face layout (workers.converting): the task run in this process with the real
``python -m deploy import-hf`` and ``export-hf`` processes, on a tiny random Llama made by transformers; and the
acceptance of the whole path: a run started from the imported Llama trains, checkpoints and deploys through the
real worker and the session's Triton, and the deploy's smoke check passes."""
import json
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tests.worker_fixtures import reconcile_until
from tests.xdist_groups import data_roots
from trainer.contract import ParallelPlan, presets
from trainer.data.prepare import TRAIN, VAL, load_tokens
from webapp import models
from webapp.services import conversions
from workers import converting

Status = models.CheckpointConversion.Status
pytestmark = pytest.mark.slow


def save_tiny_llama(folder: Path) -> Path:
    """A random LlamaForCausalLM (2 layers, d_model 64, grouped-query attention, untied head) saved with
    save_pretrained, beside a byte-level BPE tokenizer made by the tokenizers library whose end-of-text token its
    tokenizer_config.json names."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(folder)
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator([presets.demo_text(20_000).decode()], vocab_size=300, min_frequency=2,
                            special_tokens=["</s>"], show_progress=False)
    PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="</s>").save_pretrained(folder)
    return folder


@pytest.fixture
def owner(db):
    return User.objects.create_user("converter")


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    """The admin's models directory with a tiny Llama in it (made once: transformers takes seconds to import)."""
    root = tmp_path_factory.mktemp("models")
    save_tiny_llama(root / "tiny-llama")
    return root


@pytest.fixture
def folders(settings, tmp_path_factory, tmp_path, models_dir):
    """The models directory and a conversions folder: both inside the test run's temporary folder, which the
    session's worker reads as a data root too."""
    root = models_dir
    settings.WORKBENCH = {**settings.WORKBENCH, "MODELS_ROOT": root, "CONVERSIONS_ROOT": tmp_path / "conversions",
                          "DATA_ROOTS": data_roots(tmp_path_factory), "RUNS_ROOT": tmp_path / "runs"}
    return root


def test_it_imports_a_llama_with_its_lineage_and_exports_it_back(owner, folders):
    conversion = conversions.checkpoint_import_hf(owner, str(folders / "tiny-llama"), name="mine")
    assert converting.conversion_run(conversion.pk).startswith("imported")
    conversion.refresh_from_db()
    assert conversion.status == Status.DONE and conversion.finished_at and conversion.report["model_type"] == "llama"
    checkpoint = conversion.checkpoint
    assert checkpoint.owner == owner and checkpoint.name == "mine" and checkpoint.run is None
    assert checkpoint.imported_from == str(folders.resolve() / "tiny-llama")
    assert checkpoint.manifest["model"]["norm"] == "rmsnorm" and checkpoint.size_bytes > 0
    assert conversion.message == f"imported as checkpoint {checkpoint.pk} (mine)"
    assert converting.conversion_run(conversion.pk) == "settled"  # a second delivery changes nothing

    export = conversions.checkpoint_export_hf(owner, checkpoint)
    assert converting.conversion_run(export.pk).startswith("exported")
    export.refresh_from_db()
    checkpoint.refresh_from_db()
    assert export.status == Status.DONE and checkpoint.hf_export_path == export.target
    config = json.loads((Path(export.target) / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] == 2
    assert (Path(export.target) / "tokenizer.json").is_file()


def test_a_refused_import_fails_with_the_processs_last_error_line(owner, folders):
    broken = folders / "broken"
    broken.mkdir(exist_ok=True)
    (broken / "config.json").write_text(json.dumps({"model_type": "bert"}))
    conversion = conversions.checkpoint_import_hf(owner, str(broken))
    converting.conversion_run(conversion.pk)
    conversion.refresh_from_db()
    assert conversion.status == Status.FAILED and conversion.checkpoint is None
    assert conversion.message.startswith("import-hf refused: ") and "bert" in conversion.message
    assert "Traceback" not in conversion.message and not Path(conversion.target).exists()


def _until(model, pk: int, done, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        row = model.objects.get(pk=pk)
        if done(row):
            return row
        time.sleep(0.3)
    pytest.fail(f"{model.__name__} {pk} not done after {seconds} s: {row.status} {getattr(row, 'message', '')}"
                f"{getattr(row, 'status_message', '')}")


@pytest.mark.once  # the real worker, a run and the real Triton: once, on the first database
@pytest.mark.django_db(transaction=True)
def test_a_run_started_from_an_imported_llama_keeps_its_tokenizer_trains_checkpoints_and_deploys(broker, folders, triton, tmp_path):
    user = User.objects.create_user("fine-tuner")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")

    started = api.post("/api/checkpoints/import-hf/", {"path": str(folders / "tiny-llama")}, format="json")
    assert started.status_code == 202, started.json()
    conversion = _until(models.CheckpointConversion, started.json()["id"], lambda c: c.is_settled, 180)
    assert conversion.status == Status.DONE, conversion.message
    imported = conversion.checkpoint

    # the run's model is the checkpoint's, trained on shorter sequences (rotary positions: any length)
    model = models.ModelConfig.objects.create(owner=user, name="tiny-llama-ft",
                                              spec={**imported.manifest["model"], "seq_len": 32})
    cluster = models.Cluster.objects.create(name="local-1", spec=presets.local_cpu_cluster(1).to_dict())
    plan = models.ParallelismPlan.objects.create(owner=user, name="one", model_config=model, cluster=cluster,
                                                 spec=ParallelPlan(micro_batch=2, global_batch=4).to_dict())
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "text.txt").write_bytes(presets.demo_text(60_000))
    dataset = models.Dataset.objects.create(owner=user, name="text", path=str(tmp_path / "data" / "text.txt"))
    created = api.post("/api/runs/", {"name": "from-llama", "plan": plan.pk, "dataset": dataset.pk, "steps": 6,
                                      "init_from": imported.pk, "launch": True}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["started_from"].startswith(f"started from checkpoint {imported.pk}: imported from ")
    run = reconcile_until(broker, created.json()["id"], lambda r: r.is_finished and r.checkpoints.exists())
    assert run.status == "completed", run.status_message
    trained = run.checkpoints.get()
    assert trained.manifest["started_from"] == imported.path and trained.step == 6
    assert trained.manifest["tokenizer"].endswith("tokenizer.json")  # the import's, copied beside the data
    assert json.loads(Path(trained.manifest["tokenizer"]).read_text()) == json.loads(
        (Path(imported.path) / "tokenizer.json").read_text())
    # the ids the run trained on are the import's tokenizer's own encoding of the text, train then validation
    from tokenizers import Tokenizer
    prepared = Path(trained.manifest["tokenizer"]).parent
    ids = [int(i) for name in (TRAIN, VAL) for i in load_tokens(prepared / name)]
    assert ids == Tokenizer.from_file(str(Path(imported.path) / "tokenizer.json")).encode(
        (tmp_path / "data" / "text.txt").read_text()).ids
    lineage = api.get(f"/api/checkpoints/{trained.pk}/").json()["lineage"]
    assert [link["checkpoint"] for link in lineage] == [trained.pk, imported.pk]

    server = models.TritonServer.objects.create(name="local", http_url=triton.http_url, grpc_url=triton.grpc_url,
                                                metrics_url=triton.metrics_url,
                                                model_repository=str(triton.repository))
    deployed = api.post("/api/deployments/", {"checkpoint": trained.pk, "server": server.pk,
                                              "model_name": "from-llama"}, format="json")
    assert deployed.status_code == 201, deployed.json()
    deployment = _until(models.Deployment, deployed.json()["id"], lambda d: d.status in ("ready", "failed"), 300)
    assert deployment.status == "ready" and deployment.smoke_ok is True, deployment.status_message
    smoke = deployment.report["smoke"]
    answer = api.post(f"/api/deployments/{deployment.pk}/generate/",
                      {"prompt": smoke["prompt"], "max_tokens": smoke["max_tokens"]}, format="json")
    assert answer.status_code == 200 and answer.json()["token_ids"] == smoke["token_ids"]
    assert api.post(f"/api/deployments/{deployment.pk}/undeploy/").status_code == 200
    _until(models.Deployment, deployment.pk, lambda d: d.status == "unloaded", 120)


def test_the_reconcile_pass_sends_again_a_conversion_whose_message_was_lost(owner, folders,
                                                                             django_capture_on_commit_callbacks):
    from datetime import timedelta

    from django.utils import timezone

    with django_capture_on_commit_callbacks(execute=False):
        lost = conversions.checkpoint_import_hf(owner, str(folders / "tiny-llama"))
        fresh = conversions.checkpoint_import_hf(owner, str(folders / "tiny-llama"))
        claimed = conversions.checkpoint_import_hf(owner, str(folders / "tiny-llama"))
    old = timezone.now() - timedelta(minutes=3)
    models.CheckpointConversion.objects.filter(pk__in=[lost.pk, claimed.pk]).update(created_at=old)
    models.CheckpointConversion.objects.filter(pk=claimed.pk).update(claimed_at=old)
    with django_capture_on_commit_callbacks(execute=False) as sent:
        assert converting.resend_unclaimed() == [lost.pk]
    assert len(sent) == 1 and fresh.pk != lost.pk
