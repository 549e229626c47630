"""One lifecycle for every background job's row (webapp.services.job_rows): evaluations, dataset preparations,
checkpoint conversions and tuning jobs are claimed, followed and settled alike."""
import pytest

from webapp import models
from webapp.services.conversions import conversion_claim
from webapp.services.evaluations import evaluation_claim
from webapp.services.job_rows import DONE, FAILED, RUNNING, job_progress, job_settle
from webapp.services.preparations import preparation_claim
from webapp.services.tuning import tune_job_claim


def _evaluation(alice, corpus):
    checkpoint = models.Checkpoint.objects.create(run=None, owner=alice, step=10, path=corpus.path + ".ck")
    eval_set = models.EvaluationSet.objects.create(owner=alice, name="set", kind="text", path=corpus.path)
    return models.Evaluation.objects.create(owner=alice, eval_set=eval_set, checkpoint=checkpoint)


def _preparation(alice, corpus):
    return models.DatasetPreparation.objects.create(dataset=corpus, owner=alice, vocab=256)


def _conversion(alice, corpus):
    return models.CheckpointConversion.objects.create(owner=alice, kind="import-hf", source=corpus.path,
                                                      target=corpus.path + ".out")


def _tune_job(alice, corpus):
    return models.TuneJob.objects.create(owner=alice, request={}, dataset=corpus)


KINDS = {"evaluation": (_evaluation, evaluation_claim), "preparation": (_preparation, preparation_claim),
         "conversion": (_conversion, conversion_claim), "tune job": (_tune_job, tune_job_claim)}


@pytest.fixture(params=list(KINDS))
def kind(request, alice, corpus):
    make, claim = KINDS[request.param]
    return make(alice, corpus), claim


def test_a_redelivery_takes_the_job_over_and_the_delivery_it_superseded_writes_nothing(kind):
    row, claim = kind
    first = claim(row.pk)
    assert first.status == RUNNING and job_progress(first, "half way")
    second = claim(row.pk)  # a redelivery of the task: its worker was thought dead
    assert second.claimed_at > first.claimed_at
    assert not job_progress(first, "still going") and not job_settle(first, DONE, "finished", {"by": "first"})
    assert job_progress(second, "going on") and job_settle(second, DONE, "finished", {"by": "second"})
    row.refresh_from_db()
    assert (row.status, row.message, row.report) == (DONE, "finished", {"by": "second"}) and row.finished_at


def test_a_settled_job_is_not_claimed_again(kind):
    row, claim = kind
    held = claim(row.pk)
    assert job_settle(held, FAILED, "the source is gone")
    assert claim(row.pk) is None  # a duplicate delivery finds it settled and does not run it again
    assert not job_settle(held, DONE, "again")
    row.refresh_from_db()
    assert (row.status, row.message) == (FAILED, "the source is gone")


def test_a_gone_job_is_not_claimed(kind):
    row, claim = kind
    pk = row.pk
    row.delete()
    assert claim(pk) is None
