"""Requests bounded before they reach code: body size, JSON depth, numbers, and every field's type; a computation
that still fails on the client's numbers answers 400, and no answer holds a number JSON cannot carry."""
import json

import pytest
from rest_framework.test import APIClient

from trainer.contract import presets
from webapp import models
from webapp.selectors import calibration
from webapp.api.planner_requests import planner_number_problems
from webapp.services.ingest import run_ingest

ONE_GPU = {"gpu": "A100-SXM-80GB", "nodes": 1, "gpus_per_node": 1}
TINY = {"model": "tiny", "plan": {}, "cluster": ONE_GPU}


def _post_raw(client: APIClient, url: str, text: str):
    return client.generic("POST", url, text, content_type="application/json")


def test_it_refuses_json_nested_deeper_than_the_limit_saying_the_limit(alice, api):
    deep = "[" * 65 + "]" * 65
    answer = _post_raw(api(alice), "/api/estimate/", deep)
    assert answer.status_code == 400
    assert "JSON nested 65 levels deep; at most 64 levels are accepted" in answer.data["detail"]
    much_deeper = '{"a": ' * 100_000 + "1" + "}" * 100_000  # past Python's recursion limit
    assert _post_raw(api(alice), "/api/model-configs/", much_deeper).status_code == 400
    brackets_in_strings = json.dumps({"name": "[" * 100, "description": "{" * 5000, "preset": "tiny"})
    assert _post_raw(api(alice), "/api/model-configs/", brackets_in_strings).status_code == 201


def test_it_refuses_a_body_over_the_size_limit_with_413(alice, api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    answer = _post_raw(api(alice), "/api/model-configs/", json.dumps({"name": "x" * 2000, "preset": "tiny"}))
    assert answer.status_code == 413 and "over 1,000 bytes (DJANGO_MAX_REQUEST_BYTES)" in answer.data["detail"]


@pytest.mark.parametrize("number, message", [
    ("1e400", "too large for a 64-bit float"),
    ("1" + "0" * 30, "integers must lie within ±9223372036854775807"),
    ("NaN", "NaN is not JSON"),
    ("Infinity", "Infinity is not JSON"),
])
def test_it_refuses_numbers_no_field_could_take_while_parsing(alice, api, number, message):
    answer = _post_raw(api(alice), "/api/estimate/", f'{{"model": "tiny", "token_budget": {number}}}')
    assert answer.status_code == 400 and message in answer.data["detail"], answer.data


@pytest.mark.parametrize("body, field, message", [
    ({"global_batch": 8.5}, "global_batch", "must be an integer (a JSON number without a fraction), got 8.5"),
    ({"explain_top": "x"}, "explain_top", "must be an integer (a JSON number without a fraction), got 'x'"),
    ({"top_k": True}, "top_k", "got True"),
    ({"top_k": 10**6}, "top_k", "less than or equal to 1000"),
    ({"global_batch": list(range(1, 100))}, "global_batch", "between 1 and 64 global batches, got 99"),
    ({"max_fraction": 0}, "max_fraction", "max_fraction=0 measures nothing"),
    ({"space": [1]}, "space", "space must be an object, got list"),
    ({"colour": "red"}, "colour", "unknown field"),
])
def test_it_checks_every_field_of_a_tune_request_by_type_and_range(alice, api, body, field, message):
    request = {"model": "gpt2-small", "cluster": {"gpu": "A100-SXM-80GB", "nodes": 1}, "global_batch": 8, **body}
    answer = api(alice).post("/api/tune/", request, format="json")
    assert answer.status_code == 400, answer.data
    assert any(message in str(m) for m in answer.data[field]), answer.data


@pytest.mark.parametrize("body, field, message", [
    # the contract's ranges or the planner's bounds refuse these, whichever comes first: the field is named
    ({"model": {**presets.MODELS["tiny"].to_dict(), "d_model": 1e300}}, "model.d_model", ""),
    ({"cluster": {**ONE_GPU, "gpu_hour_cost": 1e308}, "token_budget": 1e300}, "token_budget", "less than or equal"),
    ({"cluster": {**ONE_GPU, "gpu_hour_cost": 1e308}}, "cluster.gpu_hour_cost", ""),
    ({"token_budget": "3e11"}, "token_budget", "must be a finite number, got '3e11'"),
    ({"token_budget": 0}, "token_budget", "greater than or equal to 1"),
    ({"inference": {"tp": "x"}}, "inference", "must be an integer"),
    ({"inference": {"batch": 1e300}}, "inference", "less than or equal to 1000000"),
    ({"inference": {"precision": "fp8"}}, "inference", "is not a valid choice"),
    ({"inference": {"beams": 4}}, "inference", "unknown field"),
    ({"options": {"compute_efficiency": "x"}}, "options.compute_efficiency", "must be a number, got 'x'"),
    ({"options": {"step_overhead_s": 1e300}}, "options.step_overhead_s", ""),
    ({"cluster": {**ONE_GPU, "nodes": "1"}}, "cluster.nodes", "must be an integer, got '1'"),
    ({"cluster": {**ONE_GPU, "gpus_per_node": 2.5}}, "cluster.gpus_per_node", "must be an integer, got 2.5"),
    ({"cluster": {**ONE_GPU, "gpu_hour_cost": True}}, "cluster.gpu_hour_cost", "must be a number, got True"),
    ({"plan_id": True}, "plan_id", "must be an object's id (an integer), got bool True"),
    ({"plan_id": 10**18}, "plan_id", "no parallelism plan 1000000000000000000 that you can see"),
])
def test_it_checks_every_field_of_an_estimate_request_by_type_and_range(alice, api, body, field, message):
    answer = api(alice).post("/api/estimate/", {**TINY, **body}, format="json")
    assert answer.status_code == 400, answer.data
    assert message in json.dumps(answer.data[field]), answer.data


def test_it_holds_every_planner_number_to_the_sizes_of_real_machines():
    problems = planner_number_problems({"gpu": {"peak_tflops": 1e-300, "memory_gb": 80}, "nodes": 0,
                                        "sizes": [1, 1e16]}, "cluster")
    assert problems == {
        "cluster.gpu.peak_tflops": ["cluster.gpu.peak_tflops=1e-300 is outside what the planner computes with: every "
                                    "number must be 0 or between 1e-09 and 1e+15 in size; give real sizes, rates and "
                                    "costs"],
        "cluster.sizes[1]": ["cluster.sizes[1]=1e+16 is outside what the planner computes with: every number must be "
                             "0 or between 1e-09 and 1e+15 in size; give real sizes, rates and costs"]}


def test_it_answers_what_the_estimate_can_compute_inside_the_bounds(alice, api):
    answer = api(alice).post("/api/estimate/", {**TINY, "cluster": {**ONE_GPU, "gpu_hour_cost": 1e6},
                                                "token_budget": 1e16, "inference": {"tp": 1, "batch": 8}},
                             format="json")
    assert answer.status_code == 200, answer.data
    assert "inference" in answer.json()


def test_it_turns_an_overflow_computing_on_the_clients_numbers_into_400(alice, api, monkeypatch):
    def overflowing(payload):
        raise OverflowError("int too large to convert to float")
    monkeypatch.setattr(calibration, "estimate_json", overflowing)
    answer = api(alice).post("/api/estimate/", TINY, format="json")
    assert answer.status_code == 400
    assert "the estimate could not be computed from these numbers (OverflowError" in answer.data["detail"]


def test_it_never_answers_a_figure_that_overflowed(alice, api, monkeypatch):
    monkeypatch.setattr(calibration, "estimate_json", lambda payload: {"cost": {"total": {"value": float("inf")}}})
    answer = api(alice).post("/api/estimate/", TINY, format="json")
    assert answer.status_code == 400 and "the estimate overflowed at cost.total.value" in answer.data["detail"]


def test_it_keeps_the_same_exceptions_elsewhere_a_server_error(alice, monkeypatch):
    from webapp.api import views

    def broken(self, request, *args, **kwargs):
        raise ValueError("a bug of the server, not the client's input")
    monkeypatch.setattr(views.RunViewSet, "list", broken)
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(alice)
    assert client.get("/api/runs/").status_code == 500


@pytest.mark.parametrize("changes, field, message", [
    ({"steps": 8.5}, "steps", "got 8.5"),
    ({"steps": "10"}, "steps", "got '10'"),
    ({"steps": 10**12}, "steps", "less than or equal to 10000000"),
    ({"seed": -1}, "seed", "greater than or equal to 0"),
    ({"max_restarts": -1}, "max_restarts", "greater than or equal to 0"),
    ({"max_restarts": 101}, "max_restarts", "less than or equal to 100"),
    ({"launch": "yes"}, "launch", "must be true or false, got 'yes'"),
    ({"name": 12}, "name", "must be a string, got 12"),
    ({"plan": "1"}, "plan", "must be an object's id (an integer), got str '1'"),
    ({"dataset": True}, "dataset", "got bool True"),
])
def test_it_checks_every_field_of_a_run_by_type_and_range(alice, api, plan222, corpus, changes, field, message):
    body = {"name": "r", "plan": plan222.id, "dataset": corpus.id, "steps": 10, **changes}
    answer = api(alice).post("/api/runs/", body, format="json")
    assert answer.status_code == 400 and message in str(answer.data[field]), answer.data


@pytest.mark.parametrize("url, body, field", [
    ("/api/model-configs/", {"name": "m", "preset": "tiny", "shared": "true"}, "shared"),
    ("/api/datasets/", {"name": "d", "path": "/x", "val_fraction": "0.1"}, "val_fraction"),
    ("/api/datasets/", {"name": "d", "path": "/x", "tokenizer_vocab": 2.5}, "tokenizer_vocab"),
])
def test_it_coerces_no_value_of_the_wrong_type(alice, api, data_root, url, body, field):
    answer = api(alice).post(url, body, format="json")
    assert answer.status_code == 400 and field in answer.data, answer.data


def test_it_stores_a_diverged_runs_nan_loss_as_null_and_answers_it(alice, api, plan222, corpus, tmp_path):
    run = models.Run.objects.create(owner=alice, name="nan", model_config=plan222.model_config, plan=plan222,
                                    cluster=plan222.cluster, dataset=corpus, run_dir=str(tmp_path))
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": NaN, "grad_norm": Infinity, "lr": 0.1}\n'
                                            '{"step": 99999999999, "loss": 1.0}\n')
    run_ingest(run.pk)
    [metric] = models.Metric.objects.filter(run=run)
    assert metric.loss is None and metric.values == {"step": 1, "loss": None, "grad_norm": None, "lr": 0.1}
    answer = api(alice).get("/api/metrics/", {"run": run.pk})
    assert answer.status_code == 200 and answer.json()["results"][0]["loss"] is None
