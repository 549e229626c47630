"""Checkpoints restore everything a step depends on: resuming continues the very same curve."""
import json

import pytest

from tests.trainer.conftest import RESUME_AT, RESUME_STEPS
from tests.trainer.launch import losses, max_rel_error, records
from trainer.contract import SCHEMA_VERSION
from trainer.contract.manifest import complete_checkpoints

pytestmark = pytest.mark.slow


def test_it_resumes_exactly(single_rank_runs):
    straight = losses(single_rank_runs / "resume-straight")
    split = losses(single_rank_runs / "resume-split")
    assert len(straight) == len(split) == RESUME_STEPS
    assert max_rel_error(straight, split) < 1e-6


@pytest.mark.parametrize("name", ["resume-dp2-to-dp1", "resume-fsdp2-to-dp1", "resume-pp2-to-dp1"])
def test_it_resumes_under_another_plan(single_rank_runs, name):
    straight = losses(single_rank_runs / "resume-straight")
    changed = losses(single_rank_runs / name)
    assert len(changed) == RESUME_STEPS
    assert max_rel_error(straight, changed) < 1e-4


def test_it_records_the_resume_in_events(single_rank_runs):
    events = records(single_rank_runs / "resume-split", "events.jsonl")
    kinds = [e["event"] for e in events]
    assert kinds == ["started", "checkpoint_saved", "stopped", "started", "checkpoint_saved", "finished"]
    assert events[3]["resumed_from"].endswith(f"step-{RESUME_AT}") and events[3]["step"] == RESUME_AT


def test_it_keeps_the_newest_checkpoints_with_a_manifest(single_rank_runs):
    kept = complete_checkpoints(single_rank_runs / "resume-straight")
    assert [step for step, _ in kept] == [RESUME_STEPS]  # keep_checkpoints=1
    manifest = json.loads((kept[0][1] / "manifest.json").read_text())
    assert manifest["step"] == RESUME_STEPS and manifest["tokens_seen"] == RESUME_STEPS * 8 * 64
    assert manifest["model"]["d_model"] == 64 and manifest["plan"]["dp"] == 1 and manifest["schema_version"] == SCHEMA_VERSION
    assert manifest["tokenizer"].endswith("tokenizer.json")


def test_it_writes_metrics_for_every_step(single_rank_runs):
    rows = records(single_rank_runs / "resume-straight")
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, RESUME_STEPS + 1))
    assert [r["step"] for r in rows if "val_loss" in r] == [5, 10]
    first = steps[0]
    for key in ("lr", "grad_norm", "tokens_per_s", "step_time_s", "flops_per_step", "mfu"):
        assert first[key] > 0, key
    mem = first["memory"]
    assert mem["params_bytes"] == mem["grads_bytes"] == 4 * 236_928  # fp32, tied "tiny"
    assert mem["optimizer_bytes"] == 2 * mem["params_bytes"]  # AdamW: two moments
    assert mem["activations_bytes"] > 0


def test_it_ignores_an_incomplete_checkpoint(tmp_path):
    from trainer.contract.manifest import latest_checkpoint

    (tmp_path / "checkpoints" / "step-4").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-4" / "manifest.json").write_text("{}")
    (tmp_path / "checkpoints" / "step-8").mkdir()  # shards but no manifest: a save that died
    assert latest_checkpoint(tmp_path).name == "step-4"


@pytest.mark.slow
def test_it_refuses_to_resume_a_different_model(single_rank_runs, dataset, tmp_path):
    import shutil

    from tests.trainer.launch import launch, tiny_spec

    run = tmp_path / "run"
    shutil.copytree(single_rank_runs / "resume-straight" / "checkpoints", run / "checkpoints")
    spec = tiny_spec(run, dataset, RESUME_STEPS)
    spec = spec.replace(model=spec.model.replace(d_model=128))
    with pytest.raises(AssertionError, match="different model \\(changed: d_model\\)"):
        launch(1, [{"spec": spec, "run_dir": run, "resume": True}], tmp_path / "jobs")
