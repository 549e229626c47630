"""Ownership that holds: a plan is seen and used only together with its model config, and whether a run's owner may
use its parts is checked again when the run is created and queued (launched, retried); the worker's own check when
it starts the job is in tests/workers/test_launch_checks.py."""
import pytest
from django.core.exceptions import ValidationError

from webapp import models, services


@pytest.fixture
def shared_plan(plan222):
    """alice's plan, shared, with its model config shared too (as sharing the plan requires)."""
    models.ModelConfig.objects.filter(pk=plan222.model_config_id).update(shared=True)
    models.ParallelismPlan.objects.filter(pk=plan222.pk).update(shared=True)
    plan222.refresh_from_db()
    return plan222


@pytest.fixture
def shared_corpus(corpus):
    corpus.shared = True
    corpus.save()
    return corpus


def test_it_refuses_to_share_a_plan_whose_model_config_is_private(alice, api, plan222):
    answer = api(alice).patch(f"/api/plans/{plan222.id}/", {"shared": True}, format="json")
    assert answer.status_code == 400
    assert "cannot be shared while its model config 'gpt2-small' is private" in answer.data["shared"][0]
    assert "share the model config first" in answer.data["shared"][0]
    assert api(alice).patch(f"/api/model-configs/{plan222.model_config_id}/", {"shared": True},
                            format="json").status_code == 200
    assert api(alice).patch(f"/api/plans/{plan222.id}/", {"shared": True}, format="json").status_code == 200


def test_it_refuses_the_same_in_the_admin_model_check(plan222):
    plan222.shared = True
    with pytest.raises(ValidationError) as refused:
        plan222.full_clean()
    assert "cannot be shared while its model config" in str(refused.value)


def test_it_hides_a_shared_plan_whose_model_config_is_private_and_estimates_it_for_no_one_else(
        alice, bob, api, shared_plan):
    assert api(bob).post("/api/estimate/", {"plan_id": shared_plan.id}, format="json").status_code == 200
    models.ModelConfig.objects.filter(pk=shared_plan.model_config_id).update(shared=False)  # alice withdraws it
    assert api(bob).get(f"/api/plans/{shared_plan.id}/").status_code == 404
    assert api(bob).get("/api/plans/").json()["count"] == 0
    estimate = api(bob).post("/api/estimate/", {"plan_id": shared_plan.id}, format="json")
    assert estimate.status_code == 400 and "model" not in estimate.data  # the private config is not shown
    assert "no parallelism plan" in estimate.data["plan_id"][0]
    assert api(alice).post("/api/estimate/", {"plan_id": shared_plan.id}, format="json").status_code == 200


def test_it_lets_no_one_use_their_own_plan_on_a_model_config_no_longer_shared_with_them(
        alice, bob, api, shared_plan, cluster8, shared_corpus):
    mine = api(bob).post("/api/plans/", {"name": "bobs", "model_config": shared_plan.model_config_id,
                                         "cluster": cluster8.id, "spec": shared_plan.spec}, format="json")
    assert mine.status_code == 201, mine.data
    models.ModelConfig.objects.filter(pk=shared_plan.model_config_id).update(shared=False)
    assert api(bob).get(f"/api/plans/{mine.data['id']}/").status_code == 200  # still his to delete or repoint
    assert api(bob).post("/api/estimate/", {"plan_id": mine.data["id"]}, format="json").status_code == 400
    run = api(bob).post("/api/runs/", {"name": "r", "plan": mine.data["id"], "dataset": shared_corpus.id},
                        format="json")
    assert run.status_code == 400 and "no parallelism plan" in run.data["plan"][0]


def test_it_refuses_a_run_on_a_plan_unshared_before_it_was_created(bob, api, shared_plan, shared_corpus):
    models.ParallelismPlan.objects.filter(pk=shared_plan.pk).update(shared=False)
    run = api(bob).post("/api/runs/", {"name": "r", "plan": shared_plan.id, "dataset": shared_corpus.id},
                        format="json")
    assert run.status_code == 400 and "no parallelism plan" in run.data["plan"][0]


def test_it_refuses_to_launch_a_run_whose_plan_was_unshared_after_it_was_created(
        bob, api, shared_plan, shared_corpus, django_capture_on_commit_callbacks):
    created = api(bob).post("/api/runs/", {"name": "r", "plan": shared_plan.id, "dataset": shared_corpus.id,
                                           "steps": 5}, format="json")
    assert created.status_code == 201, created.data
    models.ParallelismPlan.objects.filter(pk=shared_plan.pk).update(shared=False)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        launched = api(bob).post(f"/api/runs/{created.data['id']}/launch/")
    assert launched.status_code == 400 and callbacks == []  # nothing sent to a worker
    assert "plan '2x2x2' is not shared with bob" in launched.data["plan"][0]


def test_it_refuses_to_launch_a_run_whose_dataset_or_model_config_was_unshared(
        bob, api, shared_plan, shared_corpus):
    created = api(bob).post("/api/runs/", {"name": "r", "plan": shared_plan.id, "dataset": shared_corpus.id,
                                           "steps": 5}, format="json").data
    models.Dataset.objects.filter(pk=shared_corpus.pk).update(shared=False)
    models.ModelConfig.objects.filter(pk=shared_plan.model_config_id).update(shared=False)
    launched = api(bob).post(f"/api/runs/{created['id']}/launch/")
    assert launched.status_code == 400
    assert "dataset 'corpus' is not shared with bob" in launched.data["dataset"][0]
    assert "model config 'gpt2-small' of plan '2x2x2' is not shared with bob" in launched.data["plan"][0]


def test_it_refuses_in_the_admin_a_run_for_an_owner_who_may_not_use_the_plan(bob, plan222, corpus):
    with pytest.raises(ValidationError) as refused:
        services.run_create(owner=bob, name="r", plan=plan222, dataset=corpus, steps=5)
    assert "is not shared with bob" in str(refused.value)
