"""The parts of a tiny run for the worker tests; the session's worker is tests.worker_fixtures'."""
import pytest
from django.contrib.auth.models import User

from trainer.contract import ParallelPlan, presets
from trainer.contract.presets import DEMO_TEXT
from webapp import models


@pytest.fixture
def tiny_run_parts(tmp_path, settings):
    """An owner, a one-process plan of a two-layer model on a local CPU cluster, and a little Shakespeare."""
    owner = User.objects.create_user("runner")
    text = DEMO_TEXT.read_text()[:120_000]
    corpus = tmp_path / "data" / "shakespeare.txt"
    corpus.parent.mkdir()
    corpus.write_text(text)
    settings.WORKBENCH = {**settings.WORKBENCH, "DATA_ROOTS": [corpus.parent], "RUNS_ROOT": tmp_path / "runs"}
    cluster = models.Cluster.objects.create(name="local-1", spec=presets.local_cpu_cluster(1).to_dict())
    model = models.ModelConfig.objects.create(owner=owner, name="tiny", spec=presets.MODELS["tiny"].replace(
        n_layers=2).to_dict())
    plan = models.ParallelismPlan.objects.create(owner=owner, name="one", model_config=model, cluster=cluster,
                                                 spec=ParallelPlan(micro_batch=2, global_batch=4).to_dict())
    dataset = models.Dataset.objects.create(owner=owner, name="shakespeare", path=str(corpus))
    return owner, plan, dataset
