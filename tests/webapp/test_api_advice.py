"""POST /api/planner/advice/: suggestions with their figures, from inline specs or stored objects; 400s that name
the field."""
import pytest

GPT2_ON_8 = {"model": "gpt2-small", "cluster": {"gpu": "A100-SXM-80GB", "nodes": 1},
             "plan": {"dp": 8, "micro_batch": 8, "global_batch": 64, "precision": "bf16"}}


def test_it_advises_gpt2_small_on_8_a100s_with_the_figures_before_and_after(alice, api):
    response = api(alice).post("/api/planner/advice/", GPT2_ON_8, format="json")
    assert response.status_code == 200, response.data
    suggestions = {s["kind"]: s for s in response.json()["suggestions"]}
    pad = suggestions["vocab_padding"]
    assert pad["change"]["model.vocab_size"] == {"before": 50257, "after": 50304}
    for side in ("before", "after"):
        assert {"step_time_s", "peak_memory_bytes", "mfu", "tokens_per_s"} <= set(pad[side])
    assert pad["gain"]["tokens_per_s"] > 0 and pad["formula"]
    assert {"moe_vs_dense", "depth_vs_width", "micro_batch"} <= set(suggestions)


def test_it_advises_stored_objects_by_id(alice, bob, api, plan222, gpt2_small, cluster8):
    by_plan = api(alice).post("/api/planner/advice/", {"plan_id": plan222.id}, format="json")
    assert by_plan.status_code == 200, by_plan.data
    assert by_plan.json()["plan"]["tp"] == 2 and by_plan.json()["plan_source"] == "given"
    by_ids = api(alice).post("/api/planner/advice/", {"model_config_id": gpt2_small.id, "cluster_id": cluster8.id},
                             format="json")
    assert by_ids.status_code == 200 and by_ids.json()["plan_source"] == "tuned"
    hidden = api(bob).post("/api/planner/advice/", {"model_config_id": gpt2_small.id, "cluster_id": cluster8.id},
                           format="json")
    assert hidden.status_code == 400 and "model_config_id" in hidden.data


@pytest.mark.parametrize("payload, field, message", [
    ({**GPT2_ON_8, "model": "gpt-9"}, "model", "unknown model preset 'gpt-9'"),
    ({**GPT2_ON_8, "plan": {**GPT2_ON_8["plan"], "dp": 4}}, "plan", "but the cluster has 8 GPUs"),
    ({**GPT2_ON_8, "plan": {**GPT2_ON_8["plan"], "tp": 7, "dp": 1}}, "plan.tp", "tp=7 does not divide n_heads=12"),
    ({"cluster": GPT2_ON_8["cluster"]}, "model", "model is required"),
    ({**GPT2_ON_8, "plan": None, "global_batch": 0}, "global_batch", "greater than or equal to 1"),
    ({**GPT2_ON_8, "model": {"n_layers": 2, "d_model": 64, "n_heads": 3, "seq_len": 8, "vocab_size": 10}},
     "model.n_heads", "n_heads=3"),
    ({**GPT2_ON_8, "colour": "blue"}, "colour", "unknown field"),
])
def test_it_answers_a_bad_advice_request_with_400_naming_the_field(alice, api, payload, field, message):
    response = api(alice).post("/api/planner/advice/", payload, format="json")
    assert response.status_code == 400, response.data
    assert message in " ".join(str(m) for m in response.data[field]), response.data


def test_it_refuses_advice_without_credentials(db, api):
    assert api(None).post("/api/planner/advice/", GPT2_ON_8, format="json").status_code == 401
