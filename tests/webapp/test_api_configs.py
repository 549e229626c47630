"""Model configs and plans through the REST API with a token: stored, read back equal, validated by the contract."""
import pytest

from trainer.contract import presets
from trainer.contract import ModelSpec, ParallelPlan


def test_it_creates_a_gpt2_small_preset_and_a_2x2x2_plan_and_reads_both_back_equal(alice, api, cluster8):
    client = api(alice)
    created = client.post("/api/model-configs/", {"name": "small", "preset": "gpt2-small"}, format="json")
    assert created.status_code == 201, created.data
    model = client.get(f"/api/model-configs/{created.data['id']}/").json()
    assert ModelSpec.from_dict(model["spec"]) == presets.MODELS["gpt2-small"]

    plan = ParallelPlan(dp=2, tp=2, pp=2, micro_batch=1, global_batch=8)
    posted = client.post("/api/plans/", {"name": "p", "model_config": model["id"], "cluster": cluster8.id,
                                         "spec": plan.to_dict()}, format="json")
    assert posted.status_code == 201, posted.data
    read = client.get(f"/api/plans/{posted.data['id']}/").json()
    assert ParallelPlan.from_dict(read["spec"]) == plan
    assert read["world_size"] == 8 and read["grad_accum"] == 4
    assert read["model_config"] == model["id"] and read["cluster"] == cluster8.id


def test_it_fills_spec_defaults_and_round_trips_a_full_spec(alice, api):
    spec = {"n_layers": 2, "d_model": 64, "n_heads": 4, "seq_len": 32, "vocab_size": 100, "dropout": 0.1}
    response = api(alice).post("/api/model-configs/", {"name": "t", "spec": spec}, format="json")
    assert response.status_code == 201, response.data
    assert response.data["spec"] == ModelSpec(**spec).to_dict()


@pytest.mark.parametrize("changes, field, message", [
    ({"d_model": 100, "n_heads": 12}, "n_heads", "n_heads=12 does not divide d_model=100"),
    ({"n_layers": 0}, "n_layers", "n_layers=0 must be positive"),
    ({"n_layers": "many"}, "n_layers", "must be an integer, got 'many'"),
    ({"colour": "red"}, "colour", "unknown field"),
])
def test_it_rejects_a_bad_model_spec_naming_the_field_and_numbers(alice, api, changes, field, message):
    spec = {**presets.MODELS["tiny"].to_dict(), **changes}
    response = api(alice).post("/api/model-configs/", {"name": "bad", "spec": spec}, format="json")
    assert response.status_code == 400
    assert any(message in m for m in response.data["spec"][field]), response.data


def test_it_refuses_a_second_config_of_the_same_name_as_a_conflict(alice, api):
    client = api(alice)
    assert client.post("/api/model-configs/", {"name": "x", "preset": "tiny"}, format="json").status_code == 201
    again = client.post("/api/model-configs/", {"name": "x", "preset": "tiny"}, format="json")
    assert again.status_code == 409 and "name: you already have a model config named 'x'" in again.data["detail"]


@pytest.mark.parametrize("plan, field, message", [
    (dict(dp=1, tp=8, pp=1), "tp", "tp=8 does not divide n_heads=12"),
    (dict(dp=1, tp=1, pp=8), "pp", "pp=8 does not divide n_layers=12"),
    (dict(dp=2, tp=2, pp=2, micro_batch=3), "global_batch",
     "global_batch=8 is not divisible by micro_batch×dp=3×2=6"),
    (dict(dp=3, tp=2, pp=2, global_batch=12), "non_field_errors", "dp×cp×tp×pp=3×1×2×2=12 but the cluster has 8 GPUs"),
    (dict(dp=8, sequence_parallel=True), "sequence_parallel", "it needs tp > 1, got tp=1"),
])
def test_it_rejects_an_invalid_plan_with_a_message_naming_the_numbers(alice, api, gpt2_small, cluster8,
                                                                       plan, field, message):
    spec = {"micro_batch": 1, "global_batch": 8, **plan}
    response = api(alice).post("/api/plans/", {"name": "bad", "model_config": gpt2_small.id, "cluster": cluster8.id,
                                               "spec": spec}, format="json")
    assert response.status_code == 400, response.data
    assert any(message in m for m in response.data["spec"][field]), response.data


def test_it_rechecks_a_plan_when_its_model_changes(alice, api, plan222):
    tiny6 = {**presets.MODELS["tiny"].to_dict(), "n_heads": 2, "d_model": 64}
    other = api(alice).post("/api/model-configs/", {"name": "two-heads", "spec": tiny6}, format="json").data
    response = api(alice).patch(f"/api/plans/{plan222.id}/", {"model_config": other["id"]}, format="json")
    assert response.status_code == 200, response.data
    response = api(alice).patch(f"/api/plans/{plan222.id}/", {"spec": {**plan222.spec, "tp": 4, "dp": 1}},
                                format="json")
    assert response.status_code == 400
    assert "tp=4 does not divide n_heads=2" in response.data["spec"]["tp"][0]


def test_it_refuses_to_delete_a_model_config_that_plans_use_with_409(alice, api, plan222):
    response = api(alice).delete(f"/api/model-configs/{plan222.model_config_id}/")
    assert response.status_code == 409 and "still in use" in response.data["detail"]


def test_it_answers_nul_characters_in_names_with_400(alice, api):
    spec = {**presets.MODELS["tiny"].to_dict(), "name": "a\x00b"}
    response = api(alice).post("/api/model-configs/", {"name": "n", "spec": spec}, format="json")
    assert response.status_code == 400 and "NUL" in response.data["spec"]["name"][0]
    response = api(alice).post("/api/model-configs/", {"name": "n\x00", "preset": "tiny"}, format="json")
    assert response.status_code == 400
