"""The contract, the tuner's space and the trainer agree: every plan the contract accepts, the tuner can offer and
the trainer runs; every plan the tuner offers, the contract accepts.

Hypothesis draws tiny models and plans (mostly coherent ones, some wild) for the agreement of contract and space;
the trainer runs one valid plan per way of running, two steps each, in one launch of two ranks."""
from __future__ import annotations

import math
import random

from hypothesis import HealthCheck, event, given, settings, strategies as st

from tests.trainer.launch import launch, losses, tiny_spec
from trainer.contract import ModelSpec, ParallelPlan, check_plan
from trainer.contract.presets import MODELS, local_cpu_cluster
from trainer.planner.tune.space import SearchSpace, enumerate_plans

# Every value the contract knows, within what tiny models allow.
FULL_SPACE = SearchSpace(precisions=("fp32", "bf16", "fp16"), engines=("native", "deepspeed"), max_virtual_stages=4)


@st.composite
def tiny_models(draw) -> ModelSpec:
    heads = draw(st.sampled_from([1, 2, 4]))
    d_model = heads * draw(st.sampled_from([8, 16]))
    n_layers = draw(st.sampled_from([4, 6, 2, 1, 3, 5, 8, 12]))  # shrinks towards layer counts pipelines cut
    experts = draw(st.sampled_from([0, 0, 0, 2, 4]))
    return ModelSpec(n_layers=n_layers, d_model=d_model, n_heads=heads, seq_len=draw(st.sampled_from([16, 24, 32])),
                     vocab_size=draw(st.integers(64, 256)),
                     n_kv_heads=draw(st.sampled_from([0] + [k for k in (1, 2) if heads % k == 0])),
                     ffn_hidden=draw(st.sampled_from([0, 48, 96])), n_experts=experts,
                     top_k=draw(st.integers(1, 2)) if experts else 2,
                     moe_every=draw(st.integers(1, n_layers)) if experts else 1)


DEGREES = [(dp, tp, pp) for dp in (1, 2, 3, 4) for tp in (1, 2, 4) for pp in (1, 2, 3, 4) if dp * tp * pp <= 8]


@st.composite
def plans(draw, model: ModelSpec) -> ParallelPlan:
    """Mostly plans whose fields go together for ``model`` (so that a good share passes the contract), some
    drawn wild: the property holds for both."""
    if draw(st.integers(0, 4)) == 0:
        return _wild_plan(draw)
    engine = draw(st.sampled_from(["native", "deepspeed"]))
    def fits(tp: int, pp: int) -> bool:
        splits_heads = tp == 1 or (engine == "native" and model.n_heads % tp == 0 == model.kv_heads % tp)
        return splits_heads and (pp == 1 or model.n_layers % pp == 0) and (not model.is_moe or tp == pp == 1)
    dp, tp, pp = draw(st.sampled_from([d for d in DEGREES if fits(d[1], d[2])] or [(1, 1, 1)]))
    micro = draw(st.integers(1, 4))
    if engine == "native":
        zero = draw(st.sampled_from([0, 3]))
    else:
        zero = 1 if pp > 1 else draw(st.integers(0, 2 if model.is_moe else 3))
    schedule = "1f1b" if engine == "deepspeed" else draw(st.sampled_from(["gpipe", "1f1b", "interleaved"]))
    return ParallelPlan(
        dp=dp, tp=tp, pp=pp, micro_batch=micro, global_batch=micro * dp * draw(st.integers(1, 4)),
        sequence_parallel=draw(st.booleans()) if tp > 1 else False,
        ep=draw(st.sampled_from([e for e in (1, 2, 4) if dp % e == 0 and model.n_experts % e == 0]))
        if model.is_moe else 1,
        engine=engine, zero_stage=zero, activation_checkpointing=draw(st.sampled_from(["none", "selective", "full"])),
        precision=draw(st.sampled_from(["fp32", "bf16"] if zero == 3 else ["fp32", "bf16", "fp16"])),
        pipeline_schedule=schedule,
        virtual_stages=draw(st.integers(2, 4)) if schedule == "interleaved" and pp > 1 else 1,
        offload_optimizer=draw(st.booleans()) if engine == "deepspeed" and zero > 0 else False,
        offload_params=draw(st.booleans()) if engine == "deepspeed" and zero == 3 else False)


def _wild_plan(draw) -> ParallelPlan:
    dp, tp, pp = draw(st.sampled_from(DEGREES))
    return ParallelPlan(dp=dp, tp=tp, pp=pp, micro_batch=draw(st.integers(1, 4)), global_batch=draw(st.integers(1, 16)),
                        sequence_parallel=draw(st.booleans()), ep=draw(st.sampled_from([1, 2, 4])),
                        engine=draw(st.sampled_from(["native", "deepspeed"])), zero_stage=draw(st.integers(0, 3)),
                        activation_checkpointing=draw(st.sampled_from(["none", "selective", "full"])),
                        precision=draw(st.sampled_from(["fp32", "bf16", "fp16"])),
                        pipeline_schedule=draw(st.sampled_from(["gpipe", "1f1b", "interleaved"])),
                        virtual_stages=draw(st.integers(1, 4)), offload_optimizer=draw(st.booleans()),
                        offload_params=draw(st.booleans()))


@st.composite
def cases(draw) -> tuple[ModelSpec, ParallelPlan]:
    model = draw(tiny_models())
    return model, draw(plans(model))


def _offered(model: ModelSpec, plan: ParallelPlan) -> bool:
    # The tuner lists one plan where the schedule changes nothing: pp = 1 runs as the default '1f1b'.
    wanted = plan.replace(pipeline_schedule="1f1b") if plan.pp == 1 else plan
    return wanted in set(enumerate_plans(model, local_cpu_cluster(plan.world_size), plan.global_batch, FULL_SPACE))


@settings(max_examples=500, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_the_tuner_offers_exactly_the_plans_the_contract_accepts(case):
    model, plan = case
    accepted = not model.problems() and not plan.problems() and \
        not check_plan(model, plan, local_cpu_cluster(plan.world_size))
    event("accepted" if accepted else "refused")  # the share of each shows with --hypothesis-show-statistics
    assert _offered(model, plan) == accepted, (plan.problems(), check_plan(model, plan))


def _valid_two_rank_plans() -> list[tuple[str, ParallelPlan]]:
    out = []
    for name in ("tiny", "tiny-moe"):
        for batch in (2, 4, 8):
            out += [(name, p) for p in enumerate_plans(MODELS[name], local_cpu_cluster(2), batch, FULL_SPACE)]
    return out


# One plan per way of running (drawn at random, seeded, among the valid plans that have it): what the trainer does
# differently for each is what could disagree with the contract.
WAYS = {
    "gpipe": lambda p: p.pp > 1 and p.pipeline_schedule == "gpipe",
    "1f1b": lambda p: p.pp > 1 and p.engine == "native" and p.pipeline_schedule == "1f1b",
    "interleaved": lambda p: p.pipeline_schedule == "interleaved",
    "deepspeed pipeline": lambda p: p.pp > 1 and p.engine == "deepspeed",
    "tensor and sequence parallel": lambda p: p.sequence_parallel,
    "fsdp2": lambda p: p.engine == "native" and p.zero_stage == 3,
    "zero 2": lambda p: p.engine == "deepspeed" and p.zero_stage == 2,
    "zero 3 with offload": lambda p: p.zero_stage == 3 and p.offload_params,
    "experts over data-parallel ranks": lambda p: p.ep > 1,
    "fp16": lambda p: p.precision == "fp16",
    "bf16": lambda p: p.precision == "bf16",
    "selective recompute under tp": lambda p: p.tp > 1 and p.activation_checkpointing == "selective",
}


def _sample() -> list[tuple[str, ParallelPlan]]:
    valid, rng = _valid_two_rank_plans(), random.Random(20261201)
    return [rng.choice([(name, p) for name, p in valid if has(p)]) for has in WAYS.values()]


def _fields(plan: ParallelPlan) -> dict:
    return {k: v for k, v in plan.to_dict().items() if k != "schema_version"}


def test_a_sample_of_valid_tiny_plans_one_per_way_of_running_all_train_two_steps(dataset, tmp_path_factory):
    sample = _sample()
    root = tmp_path_factory.mktemp("agreement")
    jobs = [{"spec": tiny_spec(root / f"run-{i}", dataset, steps=2, model=MODELS[name], **_fields(plan)),
             "run_dir": root / f"run-{i}"} for i, (name, plan) in enumerate(sample)]
    launch(2, jobs, root / "jobs")
    for i, (name, plan) in enumerate(sample):
        got = losses(root / f"run-{i}")
        assert len(got) == 2 and all(math.isfinite(x) for x in got), (name, plan, got)
