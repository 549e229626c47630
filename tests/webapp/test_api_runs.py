"""Runs: created from a plan and a dataset, listed with filters and pages, launched and cancelled."""
import json

from webapp import models


def _create(client, plan, dataset, **extra):
    return client.post("/api/runs/", {"name": "r", "plan": plan.id, "dataset": dataset.id, "steps": 10, **extra},
                       format="json")


def test_it_creates_a_draft_run_taking_model_and_cluster_from_the_plan(alice, api, plan222, corpus):
    response = _create(api(alice), plan222, corpus)
    assert response.status_code == 201, response.data
    run = response.data
    assert run["status"] == "draft" and run["model_config"] == plan222.model_config_id
    assert run["cluster"] == plan222.cluster_id and run["run_dir"].endswith(f"/{run['id']}")
    assert run["optimizer"]["lr"] == 3e-4 and run["owner"] == "alice"


def test_it_rejects_a_run_with_bad_optimizer_or_profile_settings(alice, api, plan222, corpus):
    bad = _create(api(alice), plan222, corpus, optimizer={"lr": 1e-3, "min_lr": 1e-2})
    assert bad.status_code == 400 and "min_lr=0.01 must be between 0 and lr=0.001" in bad.data["optimizer"]["min_lr"][0]
    bad = _create(api(alice), plan222, corpus, profile={"start_step": 1, "warmup": 3})
    assert bad.status_code == 400 and "warmup" in bad.data["profile"]


def test_it_lists_runs_with_filters_and_pages(alice, bob, api, plan222, corpus):
    client = api(alice)
    for _ in range(5):
        assert _create(client, plan222, corpus).status_code == 201
    first = models.Run.objects.order_by("id").first()
    models.Run.objects.filter(pk=first.pk).update(status="completed")
    page = client.get("/api/runs/", {"page_size": 2}).json()
    assert page["count"] == 5 and len(page["results"]) == 2 and page["next"]
    assert client.get("/api/runs/", {"status": "completed"}).json()["count"] == 1
    assert client.get("/api/runs/", {"status": "draft", "owner": "alice"}).json()["count"] == 4
    assert api(bob).get("/api/runs/").json()["count"] == 0
    assert client.get("/api/runs/", {"status": "exploded"}).status_code == 400
    assert client.get("/api/runs/", {"page": 3, "page_size": 2}).json()["results"][0]["id"] == first.pk
    assert client.get("/api/runs/", {"page": 4, "page_size": 2}).status_code == 404  # past the last page
    for bad in ({"page": "{}"}, {"page": 0}, {"page": "last"}, {"page": [1, 2]}, {"page_size": ""},
                {"page_size": [2, 2]}, {"page_size": 0}):
        refused = client.get("/api/runs/", bad)
        assert refused.status_code == 400 and set(refused.json()) == set(bad), (bad, refused.content)


def test_it_cancels_a_draft_and_refuses_to_cancel_it_again(alice, bob, api, plan222, corpus):
    run_id = _create(api(alice), plan222, corpus).data["id"]
    assert api(bob).post(f"/api/runs/{run_id}/cancel/").status_code == 404
    cancelled = api(alice).post(f"/api/runs/{run_id}/cancel/", {"reason": "wrong data"}, format="json")
    assert cancelled.status_code == 200 and cancelled.data["status"] == "cancelled"
    assert cancelled.data["status_message"] == "wrong data" and cancelled.data["finished_at"]
    again = api(alice).post(f"/api/runs/{run_id}/cancel/")
    assert again.status_code == 409 and "already cancelled" in again.data["detail"]


def test_it_forbids_cancelling_another_users_shared_run(alice, bob, api, plan222, corpus):
    run_id = _create(api(alice), plan222, corpus, shared=True).data["id"]
    assert api(bob).get(f"/api/runs/{run_id}/").status_code == 200
    assert api(bob).post(f"/api/runs/{run_id}/cancel/").status_code == 403


def _queued_tasks(client):
    return [json.loads(m)["headers"] for m in client.lrange("celery", 0, -1)]


def test_it_sends_the_launch_task_to_redis_only_after_the_transaction_commits(
        alice, api, plan222, corpus, quiet_broker, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = _create(api(alice), plan222, corpus, launch=True)
        assert response.status_code == 201 and response.data["status"] == "queued"
    assert _queued_tasks(quiet_broker) == []  # nothing left before the commit
    for callback in callbacks:
        callback()
    [headers] = _queued_tasks(quiet_broker)
    assert headers["task"] == "workbench.runs.launch" and headers["argsrepr"] == f"({response.data['id']},)"


def test_it_launches_a_draft_once(alice, api, plan222, corpus, quiet_broker, django_capture_on_commit_callbacks):
    run_id = _create(api(alice), plan222, corpus).data["id"]
    with django_capture_on_commit_callbacks(execute=True):
        launched = api(alice).post(f"/api/runs/{run_id}/launch/")
    assert launched.status_code == 200 and launched.data["status"] == "queued" and launched.data["queued_at"]
    again = api(alice).post(f"/api/runs/{run_id}/launch/")
    assert again.status_code == 400 and "a queued run cannot become queued" in again.data["non_field_errors"][0]
    assert len(_queued_tasks(quiet_broker)) == 1


def test_it_resumes_a_cancelled_run_once_its_job_has_ended_without_using_a_restart(
        alice, api, plan222, corpus, quiet_broker, django_capture_on_commit_callbacks):
    run_id = _create(api(alice), plan222, corpus).data["id"]
    models.Run.objects.filter(pk=run_id).update(status="cancelled", job_id="4242",
                                                ingest_state={"job_ended": False})
    stopping = api(alice).post(f"/api/runs/{run_id}/launch/")
    assert stopping.status_code == 400 and "job 4242 is still stopping" in stopping.data["non_field_errors"][0]
    models.Run.objects.filter(pk=run_id).update(ingest_state={"job_ended": True})
    with django_capture_on_commit_callbacks(execute=True):
        resumed = api(alice).post(f"/api/runs/{run_id}/launch/")
    assert resumed.status_code == 200 and resumed.data["status"] == "queued" and resumed.data["restarts"] == 0
    assert models.RunEvent.objects.filter(run_id=run_id).last().message.startswith("resumed")
    [headers] = _queued_tasks(quiet_broker)
    assert headers["task"] == "workbench.runs.launch"


def test_it_stores_the_checked_spec_and_keeps_it_when_the_plan_changes_later(alice, api, plan222, corpus):
    client = api(alice)
    created = _create(client, plan222, corpus, spec={"steps": 1}).data
    assert created["spec"]["output_dir"] == created["run_dir"] and created["spec"]["steps"] == 10  # not writable
    assert created["spec"]["plan"]["global_batch"] == 16 and created["spec"]["dataset"]["path"] == corpus.path
    edited = client.patch(f"/api/plans/{plan222.id}/", {"spec": {**plan222.spec, "global_batch": 32}},
                          format="json")
    assert edited.status_code == 200, edited.data
    run = client.get(f"/api/runs/{created['id']}/").data
    assert run["spec"] == created["spec"]
    assert models.Run.objects.get(pk=created["id"]).run_spec().plan.global_batch == 16


def test_it_filters_by_creation_time_given_with_any_offset_python_takes(alice, api, plan222, corpus):
    client = api(alice)
    assert _create(client, plan222, corpus).status_code == 201
    # PostgreSQL refuses offsets beyond ±16 h; the filter moves the time to UTC first
    assert client.get("/api/runs/", {"created_after": "1152-01-17T16:59:20+20:05"}).json()["count"] == 1
    assert client.get("/api/runs/", {"created_before": "1152-01-17T16:59:20-23:59"}).json()["count"] == 0
    refused = client.get("/api/runs/", {"created_after": "0001-01-01T00:30:00+01:00"})
    assert refused.status_code == 400 and "outside the years" in refused.content.decode()
