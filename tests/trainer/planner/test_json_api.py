"""The JSON entry points the REST API wraps."""
import json

import pytest

from trainer.planner.estimate.api import estimate_json
from trainer.contract import SpecError
from trainer.planner.tune.api import tune_json


def test_it_estimates_from_json_with_presets_and_inference():
    out = estimate_json({"model": "gpt3-175b", "cluster": {"gpu": "A100-SXM-80GB", "nodes": 128},
                         "plan": {"dp": 8, "tp": 8, "pp": 16, "micro_batch": 1, "global_batch": 1536,
                                  "precision": "bf16", "sequence_parallel": True},
                         "token_budget": 3e11, "inference": {"tp": 8, "batch": 4}})
    assert json.loads(json.dumps(out))["parameters"]["total"]["value"] == 174_604_259_328
    assert out["inference"]["kv_per_token"]["value"] == 2 * 96 * 96 * 128 * 2


def test_it_estimates_from_full_spec_objects():
    from trainer.contract.presets import MODELS, cluster
    out = estimate_json({"model": MODELS["gpt2-small"].to_dict(), "cluster": cluster("H100-SXM", 1).to_dict(),
                         "plan": {"dp": 8, "global_batch": 64, "micro_batch": 8}, "options": {"attention": "math"}})
    assert out["options"]["attention"] == "math" and out["memory"]["fits"]


def test_it_names_the_bad_field():
    with pytest.raises(SpecError) as err:
        estimate_json({"model": "gpt2-small", "cluster": {"gpu": "A100-SXM-80GB"}, "plan": {"dp": -1}})
    assert "plan.dp" in err.value.errors
    with pytest.raises(SpecError, match="unknown model preset"):
        estimate_json({"model": "gpt-5", "cluster": {"gpu": "A100-SXM-80GB"}, "plan": {}})
    with pytest.raises(SpecError, match="required"):
        estimate_json({"model": "gpt2-small"})
    with pytest.raises(SpecError) as err:
        estimate_json({"model": {"n_layers": 2}, "cluster": {"gpu": "A100-SXM-80GB"}, "plan": {}})
    assert any(k.startswith("model") for k in err.value.errors)


def test_it_tunes_from_json_with_trials_and_progress():
    events = []
    out = tune_json({"model": "gpt2-medium", "cluster": {"gpu": "A100-SXM-80GB", "nodes": 1}, "global_batch": 64,
                     "space": {"engines": ["native"]}, "top_k": 3, "trial_pool": 12},
                    measure=lambda plan: 1.0 + plan.micro_batch / 100, progress=events.append)
    data = json.loads(json.dumps(out))
    assert len(data["top"]) == 3 and data["trials"]["pool"] == 12 and len(data["details"]) == 1
    assert events[-1]["phase"] == "done"
    with pytest.raises(SpecError, match="space"):
        tune_json({"model": "gpt2-medium", "cluster": {"gpu": "A100-SXM-80GB"}, "global_batch": 64,
                   "space": {"warp": 9}})
