"""Mixture of experts: routing, capacity and dropped tokens, the aux loss; expert parallel over dp ranks trains
the same model as one process; both engines report routing in metrics.jsonl."""
import math

import pytest
import torch

from tests.trainer.conftest import MOE_STEPS, PARITY_STEPS, moe_model
from tests.trainer.launch import losses, max_rel_error, records
from trainer.model import build_model
from trainer.model.moe import MoE, aux_loss, capacity, moe_layers


def test_it_sizes_capacity_as_capacity_factor_tokens_k_over_experts():
    assert capacity(128, 4, 2, 1.25) == math.ceil(1.25 * 128 * 2 / 4) == 80
    assert capacity(3, 8, 1, 1.0) == 1


def test_it_routes_each_token_to_top_k_experts_and_drops_past_capacity():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 64)
    roomy = MoE(moe_model(), lambda: torch.nn.Linear(64, 64))
    tight = MoE(moe_model(capacity_factor=0.25), lambda: torch.nn.Linear(64, 64))
    tight.load_state_dict(roomy.state_dict())
    roomy(x), tight(x)
    assert int(roomy.stats.load.sum()) == 32 * 2 and int(roomy.stats.dropped) == 0
    assert torch.equal(roomy.stats.load, tight.stats.load)  # load counts choices before capacity
    cap = capacity(32, 4, 2, 0.25)
    over = (tight.stats.load - cap).clamp(min=0).sum()
    assert int(tight.stats.dropped) == int(over) > 0


def test_it_gives_aux_loss_one_for_uniform_routing_and_gradient_to_the_router():
    layer = MoE(moe_model(), lambda: torch.nn.Linear(64, 64))
    with torch.no_grad():
        layer.router.weight.zero_()  # every probability 1/E
    x = torch.randn(1, 8, 64, requires_grad=True)
    layer(x)
    assert layer.stats.aux.item() == pytest.approx(1.0)
    model = build_model(moe_model(), 0)
    model(torch.randint(0, 512, (2, 64)))
    aux_loss([model]).backward()
    assert all(m.router.weight.grad.abs().sum() > 0 for m in moe_layers([model]))


@pytest.mark.slow
def test_it_splits_experts_over_dp_ranks_like_one_process(engine_runs):
    ref, ep2 = losses(engine_runs / "moe-ref"), losses(engine_runs / "moe-native-ep2")
    assert len(ep2) == MOE_STEPS
    assert max_rel_error(ref, ep2) < 1e-5
    assert ep2[-1] < ep2[0] - 0.2


@pytest.mark.slow
def test_it_records_aux_loss_expert_load_and_dropped_tokens(engine_runs):
    row = records(engine_runs / "moe-native-ep2")[-1]
    assert row["aux_loss"] > 0 and row["dropped_fraction"] == 0.0
    assert len(row["expert_load"]) == 2 and all(len(l) == 4 and sum(l) == pytest.approx(1) for l in row["expert_load"])
    assert records(engine_runs / "moe-native-ep2-drop")[-1]["dropped_fraction"] > 0


@pytest.mark.slow
def test_it_holds_half_the_experts_per_rank_and_probes_their_activations(engine_runs):
    one = records(engine_runs / "moe-ref")[0]["memory"]
    ranks = records(engine_runs / "moe-native-ep2")[0]["memory"]["per_rank"]
    expert_bytes = 4 * 2 * 4 * (2 * 64 * 256 + 256 + 64)  # fp32, 2 MoE layers × 4 experts
    for mem in ranks:
        assert mem["params_bytes"] == one["params_bytes"] - expert_bytes // 2
        assert mem["activations_bytes"] > 0


@pytest.mark.slow
def test_it_trains_moe_with_deepspeed_experts(engine_runs):
    curve = losses(engine_runs / "ds-moe-ep2")
    assert len(curve) == PARITY_STEPS and curve[-1] < curve[0] - 0.3
    row = [r for r in records(engine_runs / "ds-moe-ep2") if "loss" in r][-1]
    assert row["aux_loss"] > 0 and len(row["expert_load"]) == 2 and 0 <= row["dropped_fraction"] < 1


@pytest.mark.slow
def test_it_consolidates_deepspeed_experts_under_native_names(engine_runs):
    from tests.trainer.engine.test_deepspeed_engine import _run_spec_of
    from trainer.checkpoint.consolidated import load_consolidated
    from trainer.data import load_tokens, prepare_dataset, validation_batches
    from trainer.model import GPT, loss_fn

    run = engine_runs / "ds-moe-ep2"
    spec = _run_spec_of(run)
    model = GPT(spec.model)
    model.load_state_dict(load_consolidated(run / "checkpoints" / f"step-{PARITY_STEPS}"))
    model.eval()
    batches = validation_batches(spec, load_tokens(prepare_dataset(spec.dataset, spec.model.vocab_size).val_path))
    with torch.no_grad():
        mine = sum(float(loss_fn(model(torch.from_numpy(x)), torch.from_numpy(y))) for x, y in batches) / len(batches)
    # The native router places, drops and weights tokens as DeepSpeed's gate does (top-2, first choices first).
    val_loss = [r["val_loss"] for r in records(run) if "val_loss" in r][-1]
    assert mine == pytest.approx(val_loss, rel=1e-5)


@pytest.mark.slow
def test_it_matches_native_experts_with_deepspeed_moe_zero2_and_checkpointing(engine_runs):
    # Same routing, capacity and aux loss as the native layer; the checkpointed MoE blocks keep the aux gradient.
    assert max_rel_error(losses(engine_runs / "moe-ref"), losses(engine_runs / "ds-moe-ep2-ac")) < 1e-5


@pytest.mark.slow
def test_it_resumes_experts_saved_by_two_ranks_in_one_process(engine_runs):
    # Each rank saved only its experts (names carry global expert ids); DCP gathers them into one process.
    assert max_rel_error(losses(engine_runs / "moe-native-ep2"), losses(engine_runs / "moe-resume-ep2-to-ep1")) < 1e-5
