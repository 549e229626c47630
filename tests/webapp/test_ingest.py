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
