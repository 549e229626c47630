"""Evaluations asked for at launch: a run names evaluation sets (the API's evaluation_sets, the wizard's "Evaluate
checkpoints on"), and each checkpoint it saves is queued for evaluation on each of them as ingestion registers it."""
from tests.webapp import serving
from tests.webapp.live_runs import new_run, queued_tasks
from webapp import models
from webapp.services.ingest import checkpoint_register


def _set(owner, data_root, name, **fields):
    return models.EvaluationSet.objects.create(owner=owner, name=name, kind="choice",
                                               path=str(data_root / "corpus.txt"), **fields)


def test_a_run_made_with_evaluation_sets_queues_each_new_checkpoints_evaluation_on_each(
        alice, bob, api, plan222, corpus, data_root, quiet_broker, django_capture_on_commit_callbacks):
    halves, shared = _set(alice, data_root, "halves"), _set(bob, data_root, "bobs", shared=True)
    private = _set(bob, data_root, "private")
    client = api(alice)
    refused = client.post("/api/runs/", {"name": "r", "plan": plan222.id, "dataset": corpus.id, "steps": 10,
                                         "evaluation_sets": [halves.pk, private.pk]}, format="json")
    assert refused.status_code == 400 and "evaluation_sets" in refused.data  # not visible to alice
    made = client.post("/api/runs/", {"name": "r", "plan": plan222.id, "dataset": corpus.id, "steps": 10,
                                      "evaluation_sets": [halves.pk, shared.pk]}, format="json")
    assert made.status_code == 201, made.data
    assert sorted(made.data["evaluation_sets"]) == sorted([halves.pk, shared.pk])
    run = models.Run.objects.get(pk=made.data["id"])
    folder = data_root / "run" / "checkpoints" / "step-10"
    serving.checkpoint_folder(folder)
    models.Run.objects.filter(pk=run.pk).update(run_dir=str(data_root / "run"))
    run.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        checkpoint = checkpoint_register(run, {"path": "checkpoints/step-10"})
        checkpoint_register(run, {"path": "checkpoints/step-10"})  # read again: not evaluated twice
    queued = models.Evaluation.objects.filter(checkpoint=checkpoint).order_by("eval_set__name")
    assert [(e.eval_set.name, e.status, e.owner.username) for e in queued] == \
        [("bobs", "pending", "alice"), ("halves", "pending", "alice")]
    assert checkpoint.path == str(folder)
    assert queued_tasks(quiet_broker) == ["workbench.evaluations.run"] * 2


def test_a_set_its_owner_can_no_longer_read_is_left_out_and_the_others_still_run(
        alice, plan222, corpus, data_root, quiet_broker):
    halves = _set(alice, data_root, "halves")
    gone = models.EvaluationSet.objects.create(owner=alice, name="gone", kind="choice", path="/etc/passwd")
    run = new_run(alice, plan222, corpus)
    run.evaluation_sets.set([halves, gone])
    serving.checkpoint_folder(data_root / "run" / "checkpoints" / "step-5")
    models.Run.objects.filter(pk=run.pk).update(run_dir=str(data_root / "run"))
    run.refresh_from_db()
    checkpoint = checkpoint_register(run, {"path": "checkpoints/step-5"})
    assert [e.eval_set.name for e in checkpoint.evaluations.all()] == ["halves"]
