"""The run folder's records: metrics rows, events, the launch record and checkpoint manifests read back as written."""
import json

from trainer.contract import SCHEMA_VERSION, ParallelPlan
from trainer.contract.manifest import (FORMAT_DCP, CheckpointManifest, complete_checkpoints, incomplete_before,
                                       latest_checkpoint, read_manifest, step_dir)
from trainer.contract.presets import MODELS
from trainer.contract.records import (RANK_FIGURES, Event, EvalMetrics, LaunchRecord, StepMetrics, event, is_eval_row,
                                      is_step_row, last_step_rows, step_times)


def _manifest(step: int, plan: ParallelPlan = ParallelPlan(dp=2, micro_batch=1, global_batch=2)):
    return CheckpointManifest(step=step, format=FORMAT_DCP, tokens_seen=step * 128, model=MODELS["tiny"].to_dict(),
                              plan=plan.to_dict(), world_size=plan.world_size, tokenizer="t/tokenizer.json", seed=1)


def test_it_writes_routing_figures_as_top_level_keys_of_a_step_row():
    row = StepMetrics(step=3, loss=2.5, lr=1e-3, grad_norm=0.5, tokens_per_s=100.0, step_time_s=0.2, tokens_seen=384,
                      flops_per_step=10, loss_scale=1.0, skipped=False, mfu=0.1, memory={"params_bytes": 4},
                      routing={"aux_loss": 1.1}).to_dict()
    assert row["aux_loss"] == 1.1 and "routing" not in row and row["memory"] == {"params_bytes": 4}
    assert is_step_row(row) and not is_eval_row(row)
    evaluation = EvalMetrics(step=3, val_loss=2.4).to_dict()
    assert is_eval_row(evaluation) and not is_step_row(evaluation)
    assert step_times([row, evaluation, {**row, "step": 1, "step_time_s": 9.0}], after_step=2) == [0.2]


def test_it_stamps_events_with_kind_time_and_rank():
    record = event(Event.CHECKPOINT_SAVED, 1, step=5)
    assert record["event"] == "checkpoint_saved" and record["rank"] == 1 and record["step"] == 5 and record["time"]
    assert Event.STOPPED in Event.MILESTONES and Event.CHECKPOINT_SAVED not in Event.MILESTONES


def test_it_reads_back_the_launch_record_it_wrote(tmp_path):
    LaunchRecord(backend="local", job_id="12:34", attempt=2, resume=True, command=["python", "-m", "trainer"]) \
        .write(tmp_path)
    back = LaunchRecord.read(tmp_path)
    assert back.job_id == "12:34" and back.attempt == 2 and back.resume and back.command[-1] == "trainer"
    assert LaunchRecord.read(tmp_path / "missing") is None


def test_it_keeps_a_manifest_to_the_fields_the_engine_filled(tmp_path):
    folder = step_dir(tmp_path, 4)
    folder.mkdir(parents=True)
    _manifest(4).write(folder)
    data = json.loads((folder / "manifest.json").read_text())
    assert "zero_stage" not in data and "loss_scaler" not in data and data["schema_version"] == SCHEMA_VERSION
    back = read_manifest(folder)
    assert back == _manifest(4) and back.model_spec() == MODELS["tiny"]
    assert back.same_layout(ParallelPlan(dp=2, micro_batch=1, global_batch=2))
    assert not back.same_layout(ParallelPlan(dp=1, micro_batch=2, global_batch=2))


def test_it_finds_complete_checkpoints_oldest_first_and_the_ones_that_died(tmp_path):
    for step in (2, 10):
        step_dir(tmp_path, step).mkdir(parents=True)
        _manifest(step).write(step_dir(tmp_path, step))
    step_dir(tmp_path, 6).mkdir()  # shards, no manifest: a save that died part-way
    (step_dir(tmp_path, 8)).mkdir()
    (step_dir(tmp_path, 8) / "manifest.json").write_text("{}")  # not a manifest this version wrote
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [2, 8, 10]
    assert [s for s, _ in complete_checkpoints(tmp_path, FORMAT_DCP)] == [2, 10]
    assert latest_checkpoint(tmp_path, "deepspeed") is None and latest_checkpoint(tmp_path).name == "step-10"
    assert incomplete_before(tmp_path, 10) == [step_dir(tmp_path, 6)]
    assert read_manifest(step_dir(tmp_path, 8)) is None


def test_it_reads_the_last_record_of_each_step():
    first = {"step": 2, "loss": 3.0, "step_time_s": 0.9}
    redone = {"step": 2, "loss": 2.5, "step_time_s": 0.2}
    rows = [{"step": 1, "loss": 3.5, "step_time_s": 1.0}, first, {"step": 3, "loss": 2.0, "step_time_s": 0.3}, redone,
            {"step": 2, "val_loss": 2.4}]
    assert last_step_rows(rows) == [rows[0], redone, rows[2]]
    assert step_times(rows, after_step=1) == [0.2, 0.3]


def test_it_stamps_a_step_row_with_its_time_and_leaves_out_empty_rank_figures():
    fields = dict(step=1, loss=2.5, lr=1e-3, grad_norm=0.5, tokens_per_s=100.0, step_time_s=0.2, tokens_seen=384,
                  flops_per_step=10, loss_scale=1.0, skipped=False, mfu=0.1, memory={})
    alone = StepMetrics(**fields).to_dict()
    assert "ranks" not in alone and alone["time"] > 1.6e9
    ranks = {name: [1.0, 2.0] for name in RANK_FIGURES}
    assert StepMetrics(**fields, ranks=ranks, time=5.0).to_dict()["ranks"] == ranks
