"""Every number of the contract has a limit that says why, and a plan's micro-batches suit its pipeline schedule."""
import dataclasses
import typing

import pytest

from trainer.contract import (BlendSource, ClusterSpec, DatasetSpec, GPUSpec, ModelSpec, OptimizerSpec, ParallelPlan,
                              ProfileSpec, RunSpec, SpecError, check_plan, presets)
from trainer.contract.rules import LIMITS, pipeline_problems

SPECS = {cls.__name__: cls for cls in (ModelSpec, ParallelPlan, GPUSpec, ClusterSpec, DatasetSpec, OptimizerSpec,
                                       ProfileSpec, RunSpec, BlendSource)}
_RUN = RunSpec(model=presets.MODELS["tiny"], plan=ParallelPlan(), cluster=presets.local_cpu_cluster(1),
               dataset=DatasetSpec(path="data.txt"), output_dir="/runs/1", profile=ProfileSpec())
VALID = {"ModelSpec": _RUN.model, "ParallelPlan": _RUN.plan, "GPUSpec": _RUN.cluster.gpu, "ClusterSpec": _RUN.cluster,
         "DatasetSpec": _RUN.dataset, "OptimizerSpec": _RUN.optimizer, "ProfileSpec": _RUN.profile, "RunSpec": _RUN,
         "BlendSource": BlendSource("other", _RUN.dataset)}


def _numbers(cls) -> list[str]:
    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if hints[f.name] in (int, float)]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_number_of_every_spec_has_a_limit_or_a_bound_of_its_own(name):
    # bounded elsewhere: dropout in [0, 1), top_k ≤ 2, zero_stage in 0..3, val_fraction in (0, 0.5), betas and
    # max_bad_fraction in [0, 1)
    bounded_by_their_own_rule = {"dropout", "top_k", "zero_stage", "val_fraction", "beta1", "beta2", "max_bad_fraction"}
    missing = set(_numbers(SPECS[name])) - set(LIMITS.get(name, {})) - bounded_by_their_own_rule
    assert not missing, f"{name}: no limit for {sorted(missing)}"


@pytest.mark.parametrize("spec, field", [(s, f) for s, fields in sorted(LIMITS.items()) for f in fields])
def test_a_number_above_its_limit_is_refused_with_the_limit_and_why(spec, field):
    limit, why = LIMITS[spec][field]
    valid = VALID[spec]
    assert field not in valid.problems()
    over = type(getattr(valid, field))(limit * 1000)
    errors = valid.replace(**{field: over}).problems()
    assert any(f"above the limit of {limit:,.10g}" in m and why in m for m in errors[field]), errors


def test_a_stored_config_with_huge_numbers_is_refused_on_the_way_in():
    with pytest.raises(SpecError) as caught:
        ModelSpec.from_dict({**presets.MODELS["tiny"].to_dict(), "n_layers": 10 ** 18, "vocab_size": 2 ** 63})
    assert set(caught.value.errors) == {"n_layers", "vocab_size"}
    with pytest.raises(SpecError, match="above the limit of 1,048,576"):
        ClusterSpec.from_dict({"gpu": "H100-SXM", "nodes": 131_072, "gpus_per_node": 1024})
    with pytest.raises(SpecError, match="above the limit of 1,048,576"):
        ParallelPlan(dp=1024, tp=1024, pp=2, global_batch=1024).validate()


@pytest.mark.parametrize("schedule, m, pp, refused", [
    ("1f1b", 1, 2, "needs at least pp=2 micro-batches"),
    ("1f1b", 2, 2, ""),
    ("gpipe", 1, 4, ""),            # GPipe runs any number of micro-batches
    ("interleaved", 1, 2, "needs at least pp=2"),
    ("interleaved", 5, 2, "m must be a multiple of 2"),   # torch's 2 rounds of 2 cannot take 5
    ("interleaved", 3, 2, ""),      # one round of 3
    ("interleaved", 6, 4, ""),
    ("interleaved", 10, 4, ""),     # two rounds of 5
])
def test_the_native_pipeline_schedules_get_the_micro_batches_they_need(schedule, m, pp, refused):
    plan = ParallelPlan(pp=pp, global_batch=m, pipeline_schedule=schedule,
                        virtual_stages=2 if schedule == "interleaved" else 1)
    messages = " ".join(plan.problems().get("global_batch", []))
    assert (refused in messages) if refused else not messages


def test_deepspeeds_pipeline_engine_schedules_any_number_of_micro_batches_itself():
    assert not pipeline_problems(ParallelPlan(pp=4, global_batch=1, engine="deepspeed", zero_stage=1))


def test_deepspeed_fp16_is_refused_on_cpu_ranks_and_allowed_on_gpus():
    plan = ParallelPlan(dp=2, global_batch=2, engine="deepspeed", precision="fp16")
    refused = check_plan(presets.MODELS["tiny"], plan, presets.local_cpu_cluster(2))
    assert "has no fp16" in " ".join(refused["precision"])
    assert not check_plan(presets.MODELS["tiny"], plan, presets.cluster("H100-SXM", gpus_per_node=2))
