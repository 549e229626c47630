"""A run made through the API leaves a checkpoint at its end unless told otherwise: what the README's
`trainer.generate --checkpoint var/runs/<run>/checkpoints/step-<steps>` and every deployment start from."""
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from trainer.contract import ParallelPlan, RunSpec, presets
from trainer.contract.manifest import complete_checkpoints
from webapp import models


@pytest.fixture
def one_rank_plan(alice):
    cluster = models.Cluster.objects.create(name="one cpu", spec=presets.local_cpu_cluster(1).to_dict())
    config = models.ModelConfig.objects.create(owner=alice, name="two blocks",
                                               spec=presets.MODELS["tiny"].replace(n_layers=2).to_dict())
    return models.ParallelismPlan.objects.create(owner=alice, name="one", model_config=config, cluster=cluster,
                                                 spec=ParallelPlan(micro_batch=2, global_batch=4).to_dict())


@pytest.fixture
def shakespeare(alice, data_root):
    (data_root / "shakespeare.txt").write_text(presets.DEMO_TEXT.read_text()[:60_000])
    return models.Dataset.objects.create(owner=alice, name="shakespeare", path=str(data_root / "shakespeare.txt"))


def _created(api, alice, **fields) -> RunSpec:
    answer = api(alice).post("/api/runs/", {"name": "r", **fields}, format="json")
    assert answer.status_code == 201, answer.content
    return RunSpec.from_dict(models.Run.objects.get(pk=answer.json()["id"]).spec)


def test_it_checkpoints_the_last_step_of_an_api_run_that_names_no_checkpoints(alice, api, one_rank_plan,
                                                                                shakespeare):
    parts = {"plan": one_rank_plan.pk, "dataset": shakespeare.pk}
    assert _created(api, alice, steps=7, **parts).checkpoint_every == 7
    assert _created(api, alice, **parts).checkpoint_every == models.Run._meta.get_field("steps").default
    # asked for, the cadence and "none" are kept
    assert _created(api, alice, steps=7, checkpoint_every=3, **parts).checkpoint_every == 3
    assert _created(api, alice, steps=7, checkpoint_every=0, **parts).checkpoint_every == 0


@pytest.mark.once  # a trainer process: what it leaves does not depend on the database the spec was stored in
def test_it_leaves_the_final_checkpoint_in_the_run_folder_when_the_trainer_runs_the_stored_spec(
        alice, api, one_rank_plan, shakespeare, tmp_path):
    spec = _created(api, alice, steps=2, plan=one_rank_plan.pk, dataset=shakespeare.pk)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec.to_dict()))
    done = subprocess.run([sys.executable, "-m", "trainer", "--spec", str(spec_file)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [step for step, _ in complete_checkpoints(spec.output_dir)] == [2]
