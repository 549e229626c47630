"""A tune request is checked field by field, every problem at once, without enumerating or estimating a plan."""
import pytest

from tests.conftest import HEAVY_TUNE
from trainer.contract import SpecError
from trainer.contract.presets import MODELS
from trainer.planner.estimate.options import EstimateOptions
from trainer.planner.tune.api import TuneRequest, parse_tune_request, tune_json
from trainer.planner.tune.space import SearchSpace


def test_it_builds_the_specs_the_space_and_the_knobs():
    request = parse_tune_request({"model": "tiny", "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 2},
                                  "global_batch": 8, "space": {"engines": ["native"]}, "top_k": 3,
                                  "options": {"attention": "math"}})
    assert isinstance(request, TuneRequest)
    assert request.model == MODELS["tiny"] and request.cluster.world_size == 2 and request.global_batches == (8,)
    assert request.space == SearchSpace(engines=("native",)) and request.options == EstimateOptions(attention="math")
    assert (request.top_k, request.explain_top, request.trial_pool, request.tolerance) == (3, 1, 30, 0.05)
    assert parse_tune_request({**HEAVY_TUNE}).global_batches == (512, 1024, 1536, 2048, 3072)


def test_it_names_every_bad_field_at_once():
    with pytest.raises(SpecError) as err:
        parse_tune_request({"model": "gpt-5", "cluster": {"gpu": "cpu"}, "global_batch": 0, "top_k": 0,
                            "max_fraction": 1.5, "tolerance": -1, "space": {"engines": ["tpu"]},
                            "options": {"compute_efficiency": 2.0}})
    assert set(err.value.errors) == {"model", "global_batch", "top_k", "max_fraction", "tolerance", "space.engines",
                                     "options.compute_efficiency"}
    with pytest.raises(SpecError) as err:
        parse_tune_request({"model": "tiny"})
    assert err.value.errors == {"cluster": ["cluster is required"], "global_batch": ["global_batch is required"]}
    with pytest.raises(SpecError, match="unknown field"):
        parse_tune_request({**HEAVY_TUNE, "warp": 9})
    with pytest.raises(SpecError, match="space must be an object"):
        parse_tune_request({**HEAVY_TUNE, "space": {"warp": 9}})
    with pytest.raises(SpecError) as err:
        parse_tune_request({**HEAVY_TUNE, "space": {"engines": "native", "max_micro_batch": 0}})
    assert set(err.value.errors) == {"space.engines"}  # the type is wrong before the values are looked at
    with pytest.raises(SpecError, match="JSON object"):
        parse_tune_request([HEAVY_TUNE])


def test_it_checks_a_request_without_estimating_any_plan(planner_calls):
    parse_tune_request(HEAVY_TUNE)
    assert sum(planner_calls.values()) == 0
    # the same spies see a tune: parsing is what skips the work, not the counting
    tune_json({"model": "tiny", "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 2}, "global_batch": 8})
    assert planner_calls["quick"] > 0
