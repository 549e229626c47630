"""Contract errors become field errors in one place; each layer only says where a dotted path lands."""
from trainer.contract import SpecError
from webapp.api.specfields import api_field
from webapp.spec_errors import spec_field_errors

ERROR = SpecError({"": ["dp×tp×pp=12 but the cluster has 8 GPUs"], "plan.tp": ["tp=8 does not divide n_heads=12"]})


def test_it_gives_each_path_its_own_key_in_the_api():
    assert spec_field_errors(ERROR, api_field) == {"non_field_errors": ["dp×tp×pp=12 but the cluster has 8 GPUs"],
                                                   "plan.tp": ["tp=8 does not divide n_heads=12"]}


def test_it_gathers_paths_on_one_field_keeping_each_path_in_its_message():
    assert spec_field_errors(ERROR, lambda path: "spec", with_path=True) == {"spec": [
        "dp×tp×pp=12 but the cluster has 8 GPUs", "plan.tp: tp=8 does not divide n_heads=12"]}


def test_it_answers_a_run_whose_plan_no_longer_fits_its_model_on_the_plan(alice, api, plan222, corpus):
    plan222.model_config.spec = {**plan222.model_config.spec, "n_heads": 3, "d_model": 768}
    plan222.model_config.save()  # the plan was checked against the old model, not against this one
    response = api(alice).post("/api/runs/", {"name": "r", "plan": plan222.id, "dataset": corpus.id},
                               format="json")
    assert response.status_code == 400
    assert response.data == {"plan": ["plan.tp: tp=2 does not divide n_heads=3"]}
