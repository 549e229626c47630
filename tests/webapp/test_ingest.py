"""A run folder written with the contract's own records is read into the database once, whatever is read twice."""
from pathlib import Path

from trainer.contract.manifest import FORMAT_DCP, CheckpointManifest, step_dir
from trainer.contract.records import EvalMetrics, Event, StepMetrics, event
from trainer.contract.runfolder import EVENTS, METRICS, append_jsonl
from webapp import services
from webapp.services.ingest import run_ingest


def _step(step: int) -> dict:
    return StepMetrics(step=step, loss=4.0 - step / 10, lr=3e-4, grad_norm=1.0, tokens_per_s=100.0, step_time_s=0.1,
                       tokens_seen=64 * step, flops_per_step=1, loss_scale=1.0, skipped=False, mfu=0.1,
                       memory={}).to_dict()


def test_it_reads_steps_evaluations_milestones_and_complete_checkpoints_once(alice, plan222, corpus):
    run = services.run_create(owner=alice, name="r", plan=plan222, dataset=corpus)
    run.transition("queued")
    run.transition("submitted")
    run.save()
    folder = Path(run.run_dir)
    for record in (_step(1), _step(2), EvalMetrics(step=2, val_loss=3.5).to_dict(), {"step": "3", "loss": 1.0}):
        append_jsonl(folder / METRICS, record)
    manifest = CheckpointManifest(step=2, format=FORMAT_DCP, tokens_seen=128, model={}, plan={}, world_size=1,
                                  tokenizer="tokenizer.json", seed=1)
    manifest.write(step_dir(folder, 2))
    step_dir(folder, 4).mkdir(parents=True)  # a save that died part-way: no manifest
    for record in (event(Event.STARTED, 0), event(Event.CHECKPOINT_SAVED, 0, step=2, path="checkpoints/step-2"),
                   event(Event.CHECKPOINT_SAVED, 0, step=4, path="checkpoints/step-4")):
        append_jsonl(folder / EVENTS, record)
    with open(folder / METRICS, "a") as torn:
        torn.write('{"step": 3, "loss"')  # a writer mid-line

    run_ingest(run.pk)
    run = run_ingest(run.pk)
    assert run.status == "running" and run.last_step == 2 and run.ingest_state["last_event"] == Event.STARTED
    assert sorted(run.metrics.values_list("kind", "step")) == [("train", 1), ("train", 2), ("val", 2)]
    [checkpoint] = run.checkpoints.all()
    assert (checkpoint.step, checkpoint.tokens_seen, checkpoint.manifest) == (2, 128, manifest.to_dict())

    append_jsonl(folder / EVENTS, event(Event.FINISHED, 0, step=2))
    run = run_ingest(run.pk)
    assert run.status == "completed" and run.ingest_state["last_event"] == Event.FINISHED


def test_it_keeps_the_last_record_of_a_redone_step_and_forgets_pruned_checkpoints(alice, plan222, corpus):
    run = services.run_create(owner=alice, name="r", plan=plan222, dataset=corpus)
    folder = Path(run.run_dir)
    for step in (1, 2, 3):
        append_jsonl(folder / METRICS, _step(step))
    for step in (2, 4):
        CheckpointManifest(step=step, format=FORMAT_DCP, tokens_seen=64 * step, model={}, plan={}, world_size=1,
                           tokenizer="tokenizer.json", seed=1).write(step_dir(folder, step))
        append_jsonl(folder / EVENTS, event(Event.CHECKPOINT_SAVED, 0, step=step, path=f"checkpoints/step-{step}"))
    run_ingest(run.pk)
    assert sorted(run.checkpoints.values_list("step", flat=True)) == [2, 4]

    # a second attempt resumes from step 2 and redoes step 3 (within one read and across reads); retention at its
    # next save deletes step-2
    append_jsonl(folder / METRICS, {**_step(3), "loss": 0.5})
    append_jsonl(folder / METRICS, {**_step(3), "loss": 0.25})
    for path in step_dir(folder, 2).iterdir():
        path.unlink()
    step_dir(folder, 2).rmdir()
    CheckpointManifest(step=6, format=FORMAT_DCP, tokens_seen=384, model={}, plan={}, world_size=1,
                       tokenizer="tokenizer.json", seed=1).write(step_dir(folder, 6))
    append_jsonl(folder / EVENTS, event(Event.CHECKPOINT_SAVED, 0, step=6, path="checkpoints/step-6"))
    run = run_ingest(run.pk)
    assert run.metrics.get(kind="train", step=3).loss == 0.25
    assert run.metrics.filter(kind="train").count() == 3
    assert sorted(run.checkpoints.values_list("step", flat=True)) == [4, 6]
