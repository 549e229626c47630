"""The planner over REST: estimates with their arithmetic, tuning, and 400s that name the problem."""
import pytest

GPT3_175B = {"model": "gpt3-175b", "cluster": {"gpu": "A100-SXM-80GB", "nodes": 128},
             "plan": {"dp": 8, "tp": 8, "pp": 16, "micro_batch": 1, "global_batch": 1536, "sequence_parallel": True,
                      "activation_checkpointing": "selective", "precision": "bf16"}, "token_budget": 3e11}


def test_it_estimates_gpt3_175b_on_1024_gpus_with_formulas(alice, api):
    response = api(alice).post("/api/estimate/", GPT3_175B, format="json")
    assert response.status_code == 200, response.data
    body = response.json()
    text = str(body)
    assert "formula" in text and "mfu" in text.lower()


def test_it_estimates_a_stored_plan_by_id(alice, bob, api, plan222):
    response = api(alice).post("/api/estimate/", {"plan_id": plan222.id}, format="json")
    assert response.status_code == 200, response.data
    hidden = api(bob).post("/api/estimate/", {"plan_id": plan222.id}, format="json")
    assert hidden.status_code == 400 and "no parallelism plan" in hidden.data["plan_id"][0]


@pytest.mark.parametrize("payload, field, message", [
    ({**GPT3_175B, "model": "gpt-9"}, "model", "unknown model preset 'gpt-9'"),
    ({**GPT3_175B, "plan": {**GPT3_175B["plan"], "tp": 7}}, "plan.tp", "tp=7 does not divide"),
    ({k: v for k, v in GPT3_175B.items() if k != "cluster"}, "cluster", "cluster is required"),
    ({**GPT3_175B, "plan": {**GPT3_175B["plan"], "dp": 4}}, "", "but the cluster has 1024 GPUs"),
])
def test_it_answers_a_bad_estimate_request_with_400_naming_the_problem(alice, api, payload, field, message):
    response = api(alice).post("/api/estimate/", payload, format="json")
    assert response.status_code == 400, response.data
    messages = " ".join(" ".join(v) for v in response.data.values())
    assert message in messages, response.data


def test_it_tunes_a_small_model_and_ranks_the_plans(alice, api):
    response = api(alice).post("/api/tune/", {"model": "gpt2-small", "cluster": {"gpu": "A100-SXM-80GB", "nodes": 1},
                                              "global_batch": 64, "top_k": 5}, format="json")
    assert response.status_code == 200, response.data
    body = response.json()
    assert body and "pareto" in str(body).lower()


def test_it_refuses_planner_requests_without_credentials(db, api):
    assert api(None).post("/api/estimate/", GPT3_175B, format="json").status_code == 401
    assert api(None).post("/api/tune/", {}, format="json").status_code == 401


def test_it_queues_tuning_with_trials_as_a_job_on_a_local_cpu_cluster(alice, bob, api, corpus,
                                                                       django_capture_on_commit_callbacks):
    request = {"model": "tiny", "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 2}, "global_batch": 8,
               "trials": {"dataset": corpus.id, "steps": 6}}
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api(alice).post("/api/tune/", request, format="json")
    assert response.status_code == 202, response.data
    assert response.data["status"] == "queued" and response.data["trial_steps"] == 6
    assert len(callbacks) == 1  # the job is sent to a worker once the request commits
    assert api(alice).get(f"/api/tune-jobs/{response.data['id']}/").status_code == 200
    assert api(bob).get(f"/api/tune-jobs/{response.data['id']}/").status_code == 404
    # listed by the API's own words for its state
    listed = api(alice).get("/api/tune-jobs/?status=queued").json()["results"]
    assert [job["id"] for job in listed] == [response.data["id"]]
    assert api(alice).get("/api/tune-jobs/?status=completed").json()["results"] == []
    assert api(alice).get("/api/tune-jobs/?status=pending").status_code == 400


def test_it_refuses_trials_for_a_cluster_this_machine_cannot_measure(alice, api, corpus):
    request = {"model": "gpt2-small", "cluster": {"gpu": "A100-SXM-80GB", "nodes": 1}, "global_batch": 8,
               "trials": {"dataset": corpus.id}}
    response = api(alice).post("/api/tune/", request, format="json")
    assert response.status_code == 400 and "local CPU ranks" in response.data["cluster"][0]


def test_it_refuses_trials_on_another_users_private_dataset(bob, api, corpus):
    request = {"model": "tiny", "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 2}, "global_batch": 8,
               "trials": {"dataset": corpus.id}}
    response = api(bob).post("/api/tune/", request, format="json")
    assert response.status_code == 400 and "no dataset" in response.data["trials"]["dataset"][0]
