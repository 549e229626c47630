"""The planner against real multi-rank runs of the native trainer (gloo on the CPU, fp32).

Reads the run folders of the trainer suite's batched launches (tests/trainer/conftest.py): 2-rank tp2, tp2 + sequence
parallel, pp2 with GPipe / 1F1B / interleaved, dp2 DDP, dp2 FSDP2; 4-rank tp2×dp2, pp2×tp2, FSDP2×tp2 + sequence
parallel; single-process references and the three checkpointing modes; and, from the engine launches, the native MoE
model with ep = 2 over dp = 2 (capacity factor 2, no drops; 0.5, half the assignments dropped) and its
single-process reference. Each rank records params/grads/optimizer bytes and the bytes autograd saved in one
micro-batch's forward; the planner must give the model states exactly and the saved activations within 3 % on every
rank (rank = (stage·dp + d)·tp + j).
"""
import json
from pathlib import Path

import pytest

from tests.trainer.conftest import (AC_MODES, DS_STAGES, FOUR_RANK_PLANS, MOE_STEPS, PARITY_STEPS, TWO_RANK_PLANS,
                                    moe_model)
from tests.trainer.launch import tiny_spec
from trainer.planner.estimate.core import Planner

ONE_RANK_PLANS = {"ref-tied": {}, "ref-untied": dict(tied=False),
                  **{f"ac-{mode}": dict(activation_checkpointing=mode) for mode in AC_MODES}}


# The native MoE jobs of the engine_runs fixture: (steps, model fields, plan fields) as conftest launches them.
MOE_RUNS = {"moe-native-ep2": ({}, dict(dp=2, ep=2)),
            "moe-native-ep2-drop": (dict(capacity_factor=0.5), dict(dp=2, ep=2)),
            "moe-ref": ({}, {})}


def _measured(run_dir: Path, dataset, kw: dict, steps: int = PARITY_STEPS) -> tuple:
    spec = tiny_spec(run_dir, dataset, steps, **kw)  # the spec the suite launched this run folder with
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        memory = record.get("memory") or {}
        if memory.get("activations_bytes") is not None or memory.get("per_rank"):
            return spec, memory.get("per_rank") or [memory]
    raise AssertionError(f"no memory record in {run_dir}")


def _check(run_dir: Path, dataset, kw: dict, steps: int = PARITY_STEPS, activations: bool = True) -> list[str]:
    spec, per_rank = _measured(run_dir, dataset, kw, steps)
    plan = spec.plan
    planner = Planner(spec.model, spec.cluster)
    problems = []
    for rank, got in enumerate(per_rank):
        stage = rank // (plan.dp * plan.tp)
        st = planner.stage_memory(plan, stage)
        want_states = {"params_bytes": st.states["weights"], "grads_bytes": st.states["gradients"],
                       "optimizer_bytes": st.states["optimizer"]}
        have_states = {k: got[k] for k in want_states}
        if have_states != want_states:
            problems.append(f"{run_dir.name} rank {rank}: states {have_states} != planned {want_states}")
        acts = sum(st.activations_per_microbatch.values())
        if activations and abs(acts - got["activations_bytes"]) > 0.03 * got["activations_bytes"]:
            problems.append(f"{run_dir.name} rank {rank}: activations {got['activations_bytes']} vs planned "
                            f"{acts:.0f} ({acts / got['activations_bytes'] - 1:+.2%})")
    return problems


@pytest.mark.parametrize("name", list(ONE_RANK_PLANS))
def test_it_matches_single_process_runs(single_rank_runs, dataset, name):
    assert _check(single_rank_runs / name, dataset, ONE_RANK_PLANS[name]) == []


@pytest.mark.parametrize("name", list(TWO_RANK_PLANS))
def test_it_matches_two_rank_runs(two_rank_runs, dataset, name):
    assert _check(two_rank_runs / name, dataset, TWO_RANK_PLANS[name]) == []


@pytest.mark.parametrize("name", list(FOUR_RANK_PLANS))
def test_it_matches_four_rank_runs(four_rank_runs, dataset, name):
    assert _check(four_rank_runs / name, dataset, FOUR_RANK_PLANS[name]) == []


@pytest.mark.parametrize("name", list(MOE_RUNS))
def test_it_matches_native_moe_runs(engine_runs, dataset, name):
    model_fields, plan_fields = MOE_RUNS[name]
    assert _check(engine_runs / name, dataset, dict(model=moe_model(**model_fields), **plan_fields), MOE_STEPS) == []


# DeepSpeed runs of the engine launch (dp = 2, fp32): model states exactly — ZeRO's own fp32 master partition, and
# expert parameters partitioned over the dp/ep ranks that hold them. DeepSpeed's MoE layer is its own (not
# trainer/model/moe.py), so its activations are not compared.
DS_RUNS = {**{name: (dict(engine="deepspeed", dp=2, **kw), True) for name, kw in DS_STAGES.items()
              if not kw.get("offload_optimizer")},
           "ds-moe-ep2": (dict(engine="deepspeed", dp=2, zero_stage=1, ep=2, model=moe_model(capacity_factor=1.25)),
                          False)}


@pytest.mark.parametrize("name", list(DS_RUNS))
def test_it_matches_deepspeed_model_states(engine_runs, dataset, name):
    kw, activations = DS_RUNS[name]
    assert _check(engine_runs / name, dataset, kw, activations=activations) == []
