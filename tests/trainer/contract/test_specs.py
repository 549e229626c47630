"""The contract: every spec validates itself with messages naming the numbers and round-trips through JSON exactly."""
import json

import pytest

from trainer.contract import presets
from trainer.contract import (ClusterSpec, DatasetSpec, ModelSpec, OptimizerSpec, ParallelPlan, ProfileSpec, RunSpec,
                          SpecError, check_plan)
from trainer.contract.specjson import SCHEMA_VERSION


def _run(**changes) -> RunSpec:
    base = dict(model=presets.MODELS["gpt2-small"], plan=ParallelPlan(dp=2, tp=2, pp=2, micro_batch=1, global_batch=8),
                cluster=presets.cluster(), dataset=DatasetSpec(path="data.txt"), output_dir="/runs/1",
                profile=ProfileSpec(start_step=3, steps=2), optimizer=OptimizerSpec(lr=6e-4, warmup_steps=7))
    return RunSpec(**{**base, **changes})


@pytest.mark.parametrize("name", sorted(presets.MODELS))
def test_it_round_trips_every_preset_model_exactly(name):
    spec = presets.MODELS[name]
    assert ModelSpec.from_json(spec.to_json()) == spec.validate()


def test_it_round_trips_a_whole_run_spec_exactly_with_awkward_floats():
    run = _run(optimizer=OptimizerSpec(lr=0.1 + 0.2, min_lr=1e-7, beta2=0.999999999))
    text = run.to_json()
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION
    assert RunSpec.from_json(text) == run
    assert RunSpec.from_json(text).to_json() == text


def test_it_derives_gradient_accumulation_from_the_batches():
    assert ParallelPlan(dp=4, micro_batch=2, global_batch=64).grad_accum == 8
    assert ParallelPlan(dp=2, tp=2, pp=2).world_size == 8


@pytest.mark.parametrize("plan, expected", [
    (ParallelPlan(tp=4, dp=2, micro_batch=1, global_batch=2), ("tp", "tp=4 does not divide n_heads=6")),
    (ParallelPlan(pp=4, dp=2, micro_batch=1, global_batch=2), ("pp", "pp=4 does not divide n_layers=6")),
    (ParallelPlan(dp=12, micro_batch=1, global_batch=12), ("", "dp×cp×tp×pp=12×1×1×1=12 but the cluster has 8 GPUs")),
    (ParallelPlan(tp=2, dp=4, sequence_parallel=True, micro_batch=1, global_batch=4),
     ("sequence_parallel", "tp=2 does not divide seq_len=33")),
    (ParallelPlan(dp=8, ep=2, micro_batch=1, global_batch=8), ("ep", "ep=2 needs a mixture-of-experts model")),
])
def test_it_names_the_numbers_when_a_plan_does_not_fit_its_model_and_cluster(plan, expected):
    model = ModelSpec(n_layers=6, d_model=96, n_heads=6, seq_len=33, vocab_size=100)
    field, message = expected
    assert message in " ".join(check_plan(model, plan, presets.cluster())[field])


@pytest.mark.parametrize("plan, field, message", [
    (dict(global_batch=10, micro_batch=3, dp=2), "global_batch",
     "global_batch=10 is not divisible by micro_batch×dp=3×2=6"),
    (dict(sequence_parallel=True), "sequence_parallel", "needs tp > 1"),
    (dict(dp=4, ep=3, global_batch=4), "ep", "ep=3 does not divide dp=4"),
    (dict(virtual_stages=2), "virtual_stages", "needs a schedule that runs several chunks a rank"),
    (dict(pp=2, global_batch=8, pipeline_schedule="zbv"), "virtual_stages",
     "places exactly two model chunks on each pipeline rank, in a V: set virtual_stages=2, got 1"),
    (dict(pp=2, global_batch=3, pipeline_schedule="dualpipev", virtual_stages=2), "global_batch",
     "the dualpipev schedule needs at least 4 (for pp=2) micro-batches per step, got m=global_batch/(micro_batch×dp)=3"),
    (dict(pp=2, global_batch=2, pipeline_schedule="zbv", virtual_stages=2), "global_batch",
     "the zbv schedule needs at least 3 (for pp=2)"),
    (dict(pp=2, global_batch=5, pipeline_schedule="zb-interleaved"), "global_batch",
     "runs m=5 micro-batches in ⌊m/pp⌋=2 equal rounds"),
    (dict(zero_stage=2), "zero_stage", "zero_stage=2 needs engine='deepspeed'"),
    (dict(engine="deepspeed", tp=2, global_batch=1), "tp", "does not do tensor or sequence parallel"),
    (dict(engine="deepspeed", pp=2, zero_stage=2), "zero_stage", "runs here with ZeRO stage 1 only, got 2"),
    (dict(offload_optimizer=True), "offload_optimizer", "CPU offload needs engine='deepspeed'"),
    (dict(dp=0), "dp", "dp=0 must be positive"),
])
def test_it_refuses_a_plan_the_engines_cannot_run_before_any_work(plan, field, message):
    with pytest.raises(SpecError) as caught:
        ParallelPlan(**plan).validate()
    assert any(message in m for m in caught.value.errors[field]), caught.value.errors


def test_it_refuses_deepspeed_moe_with_zero_3():
    plan = ParallelPlan(engine="deepspeed", zero_stage=3, dp=8, global_batch=8)
    assert "ZeRO stage 3" in check_plan(presets.MODELS["tiny-moe"], plan)["zero_stage"][0]


def test_it_collects_every_field_error_of_a_bad_document_at_once():
    with pytest.raises(SpecError) as caught:
        RunSpec.from_dict({"model": {"n_layers": "12", "d_model": True}, "plan": {"tp": 1.5}, "extra": 1,
                           "schema_version": 99})
    errors = caught.value.errors
    assert errors["model.n_layers"] == ["must be an integer, got '12'"]
    assert errors["model.d_model"] == ["must be an integer, got True"]
    assert errors["plan.tp"] == ["must be an integer, got 1.5"]
    assert "unknown field" in errors["extra"][0]
    assert errors["cluster"] == ["this field is required"]
    assert "schema_version 99 is not supported" in errors["schema_version"][0]


def test_it_validates_nested_parts_of_a_run_with_dotted_paths():
    bad = _run(cluster=presets.cluster().replace(nodes=0), optimizer=OptimizerSpec(lr=-1.0))
    errors = bad.problems()
    assert "nodes=0 must be positive" in errors["cluster.nodes"][0]
    assert "lr=-1.0 must be positive" in errors["optimizer.lr"][0]


def test_it_refuses_non_finite_numbers_and_nul_characters():
    with pytest.raises(SpecError, match="finite"):
        OptimizerSpec.from_dict({"lr": float("inf")})
    with pytest.raises(SpecError, match="NUL"):
        DatasetSpec.from_dict({"path": "a\x00b"})


def test_it_describes_moe_layers_every_nth_block():
    model = presets.MODELS["tiny-moe"]
    assert model.is_moe and model.moe_layers == (1, 3)
    with pytest.raises(SpecError, match="top_k=5 must be between 1 and n_experts=4"):
        model.replace(top_k=5).validate()


def test_it_checks_clusters_and_gpus():
    with pytest.raises(SpecError) as caught:
        ClusterSpec(gpu=presets.GPUS["H100-SXM"].replace(memory_gb=0), gpus_per_node=0).validate()
    assert set(caught.value.errors) == {"gpu.memory_gb", "gpus_per_node"}


def test_it_takes_a_gpu_by_preset_name_as_the_preset_cluster_would_build_it():
    given = ClusterSpec.from_dict({"gpu": "H100-SXM", "nodes": 2, "gpus_per_node": 4, "gpu_hour_cost": 3})
    assert given == presets.cluster("H100-SXM", nodes=2, gpus_per_node=4, gpu_hour_cost=3.0)
    local = ClusterSpec.from_dict({"gpu": "cpu", "gpus_per_node": 2, "name": "local cpu x2",
                                   "inter_node_bandwidth_gbs": 10})
    assert local == presets.local_cpu_cluster(2)
    # inside a run spec too, and what is stored is the full form
    run = RunSpec.from_dict({**_run().to_dict(), "cluster": {"gpu": "A100-SXM-80GB"}})
    assert run.cluster.gpu == presets.GPUS["A100-SXM-80GB"]


def test_it_names_the_presets_when_a_gpu_name_is_unknown_and_checks_the_other_fields():
    with pytest.raises(SpecError) as caught:
        RunSpec.from_dict({**_run().to_dict(), "cluster": {"gpu": "V100", "nodes": 1}})
    assert list(caught.value.errors) == ["cluster.gpu"]
    assert "H100-SXM" in caught.value.errors["cluster.gpu"][0]
    with pytest.raises(SpecError) as caught:
        ClusterSpec.from_dict({"gpu": "cpu", "nodes": "2", "racks": 1})
    assert set(caught.value.errors) == {"nodes", "racks"}
