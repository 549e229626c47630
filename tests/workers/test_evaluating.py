"""Evaluations (workers.evaluating): the real ``python -m trainer.evaluate`` process on the session's trained
Shakespeare checkpoint, run by the task in this process and, once, by the session's worker through the API; and of
deployments of it in fp32 and int8, through the web app's /v1 in front of the session's Triton."""
import json
import random
import time

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from tests.deploy_fixtures import TEXT_BYTES
from tests.xdist_groups import data_roots
from trainer.contract.manifest import read_manifest
from trainer.contract.presets import demo_text
from webapp import models
from webapp.services.evaluations import evaluation_create
from workers import evaluating

Status = models.Evaluation.Status
pytestmark = pytest.mark.slow


@pytest.fixture
def owner(db):
    return User.objects.create_user("evaluator")


@pytest.fixture
def data_root(settings, tmp_path_factory, tmp_path):
    """A folder of the test run's temporary folder, which the session's worker reads as a data root too."""
    settings.WORKBENCH = {**settings.WORKBENCH, "DATA_ROOTS": data_roots(tmp_path_factory)}
    return tmp_path


@pytest.fixture
def checkpoint(owner, shakespeare_checkpoint):
    manifest = read_manifest(shakespeare_checkpoint)
    return models.Checkpoint.objects.create(owner=owner, name="shakespeare", path=str(shakespeare_checkpoint),
                                            step=manifest.step, manifest=manifest.to_dict())


def _choice_set(path, count: int = 12, longest: int = 1000):
    """Held-out lines cut in two: the right second half against its letters shuffled."""
    rng = random.Random(1)
    text = demo_text(TEXT_BYTES + 20_000).decode()[TEXT_BYTES:]
    lines = [line for line in text.split("\n") if 24 <= len(line) <= longest][:count]
    with open(path, "w") as f:
        for line in lines:
            head, tail = line[:len(line) // 2], line[len(line) // 2:]
            choices = [tail, "".join(rng.sample(tail, len(tail)))]
            rng.shuffle(choices)
            f.write(json.dumps({"question": head, "choices": choices, "answer": choices.index(tail)}) + "\n")
    return path


def _settled(evaluation_id: int, seconds: float = 180) -> models.Evaluation:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        row = models.Evaluation.objects.get(pk=evaluation_id)
        if row.is_settled:
            return row
        time.sleep(0.3)
    pytest.fail(f"evaluation {evaluation_id} not settled after {seconds} s: {row.status} {row.message}")


def test_it_scores_a_checkpoint_on_a_multiple_choice_set_in_a_process_of_its_own(owner, data_root, checkpoint):
    eval_set = models.EvaluationSet.objects.create(owner=owner, name="halves", kind="choice",
                                                   path=str(_choice_set(data_root / "halves.jsonl")))
    evaluation = evaluation_create(owner, eval_set, checkpoint)
    assert evaluating.evaluation_run(evaluation.pk).startswith("12 items: acc ")
    evaluation.refresh_from_db()
    assert evaluation.status == Status.DONE and evaluation.finished_at
    assert evaluation.scores["items"] == 12 and evaluation.scores["metrics"]["acc"] > 0.6  # chance: 1/2
    assert evaluating.evaluation_run(evaluation.pk) == "settled"  # a second delivery changes nothing


def test_a_set_with_a_bad_line_fails_naming_the_line(owner, data_root, checkpoint):
    path = data_root / "broken.jsonl"
    path.write_text('{"question": "a", "choices": ["b", "c"], "answer": 0}\n{"question": "a", "answer": 0}\n')
    eval_set = models.EvaluationSet.objects.create(owner=owner, name="broken", kind="choice", path=str(path))
    evaluating.evaluation_run(evaluation_create(owner, eval_set, checkpoint).pk)
    failed = eval_set.evaluations.get()
    assert failed.status == Status.FAILED and "broken.jsonl:2" in failed.message and "choices missing" in failed.message


@pytest.mark.django_db(transaction=True)
def test_the_api_registers_a_set_and_the_worker_scores_the_checkpoint(owner, data_root, checkpoint, broker):
    api = APIClient()
    api.force_authenticate(owner)
    made = api.post("/api/evaluation-sets/", {"name": "halves", "kind": "choice",
                                              "path": str(_choice_set(data_root / "api.jsonl", 6))}, format="json")
    assert made.status_code == 201, made.json()
    outside = api.post("/api/evaluation-sets/", {"name": "x", "kind": "text", "path": "/etc/passwd"}, format="json")
    assert outside.status_code == 400 and "data root" in json.dumps(outside.json())
    started = api.post("/api/evaluations/", {"eval_set": made.json()["id"], "checkpoint": checkpoint.pk},
                       format="json")
    assert started.status_code == 202, started.json()
    evaluation = _settled(started.json()["id"])
    assert evaluation.status == Status.DONE, evaluation.message
    listed = api.get("/api/evaluations/", {"checkpoint": checkpoint.pk}).json()["results"]
    assert listed[0]["step"] == checkpoint.step and listed[0]["run"] is None
    assert listed[0]["scores"]["metrics"]["acc"] == evaluation.scores["metrics"]["acc"]
    other = APIClient()
    other.force_authenticate(User.objects.create_user("other"))  # an import is its owner's alone
    assert other.get("/api/evaluations/").json()["count"] == 0
    refused = other.post("/api/evaluations/", {"eval_set": made.json()["id"], "checkpoint": checkpoint.pk},
                         format="json")
    assert refused.status_code == 400


@pytest.fixture(scope="module")
def served_both(triton, served_checkpoint):
    """The checkpoint exported twice into the session's Triton, in fp32 and with int8 weights, both loaded: reduction
    → (model name, the export's report)."""
    from deploy.export import ExportOptions, export

    client = triton.client()
    names = {"none": "evaluated-fp32", "int8": "evaluated-int8"}
    served = {}
    for reduction, name in names.items():
        report = export(served_checkpoint, triton.repository, ExportOptions(name=name, reduction=reduction,
                                                                            measure=False))
        client.load(name)
        served[reduction] = (name, report)
    yield served
    for name in names.values():
        client.unload(name)
    client.close()


@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
@pytest.mark.django_db(transaction=True)
def test_a_deployment_scored_through_v1_answers_as_its_checkpoint_and_its_int8_copy_is_scored_beside(
        owner, data_root, checkpoint, served_both, triton, live_server, settings):
    settings.WORKBENCH = {**settings.WORKBENCH, "URL": live_server.url}
    server = models.TritonServer.objects.create(name="local", http_url=triton.http_url, grpc_url=triton.grpc_url,
                                                metrics_url=triton.metrics_url, model_repository=str(triton.repository))
    deployed = {reduction: models.Deployment.objects.create(owner=owner, checkpoint=checkpoint, server=server,
                                                            model_name=name, reduction=reduction, status="ready",
                                                            report=report)
                for reduction, (name, report) in served_both.items()}
    eval_set = models.EvaluationSet.objects.create(owner=owner, name="halves", kind="choice",
                                                   # prompts that leave room for the answer in the model's
                                                   # context: /v1 refuses more, where a checkpoint cuts the prompt
                                                   path=str(_choice_set(data_root / "halves.jsonl", longest=40)))
    direct = evaluation_create(owner, eval_set, checkpoint)
    through = {reduction: evaluation_create(owner, eval_set, deployment=d) for reduction, d in deployed.items()}
    for evaluation in (direct, *through.values()):
        evaluating.evaluation_run(evaluation.pk)
        evaluation.refresh_from_db()
        assert evaluation.status == Status.DONE, evaluation.message
    fp32, int8 = through["none"].scores, through["int8"].scores
    # greedy, the same prompts: the deployment writes what the checkpoint writes, item by item, so the scores agree
    assert fp32["answers"] == direct.scores["answers"] and any(fp32["answers"])
    assert fp32["metrics"]["acc_generated"] == direct.scores["metrics"]["acc_generated"]
    # and each choice's log-likelihood, echoed by /v1, is the checkpoint's: the same likeliest choices
    pairs = [(a, b) for mine, theirs in zip(fp32["likelihoods"], direct.scores["likelihoods"])
             for a, b in zip(mine, theirs)]
    assert len(pairs) == 24 and max(abs(a - b) for a, b in pairs) < 1e-3
    assert {k: fp32["metrics"][k] for k in ("acc", "acc_norm")} == {k: direct.scores["metrics"][k]
                                                                    for k in ("acc", "acc_norm")}
    assert len(int8["answers"]) == 12 and len(int8["likelihoods"]) == 12
    assert through["int8"].target == "deployment evaluated-int8 (int8 weight-only)"
    text = models.EvaluationSet.objects.create(owner=owner, name="prose", kind="text", path=eval_set.path)
    with pytest.raises(ValidationError, match="evaluate the deployment's checkpoint instead"):
        evaluation_create(owner, text, deployment=deployed["none"])
