"""Model-state memory (ZeRO §3.1) and activation memory (Korthikanti Table 2) against docs/formulas.md."""
import pytest

from trainer.planner.estimate import memory as M
from trainer.planner.estimate.core import Planner
from trainer.planner.estimate.options import EstimateOptions
from trainer.contract.presets import MODELS, cluster
from trainer.contract import ModelSpec, ParallelPlan

PSI, ND = 7_500_000_000, 64


@pytest.mark.parametrize("stage,expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_it_reproduces_the_zero_paper_worked_example(stage, expected_gb):
    s = M.model_states(PSI, -(-PSI // ND), ND, stage, "bf16", "deepspeed")
    assert round((s["weights"] + s["gradients"] + s["optimizer"]) / 1e9, 1) == expected_gb


def test_it_gives_the_zero_formulas_exactly():
    def total(stage):
        s = M.model_states(PSI, PSI // ND, ND, stage, "fp16", "deepspeed")
        return s["weights"] + s["gradients"] + s["optimizer"]
    assert total(0) == 16 * PSI
    assert total(1) == 4 * PSI + 12 * PSI // ND
    assert total(2) == 2 * PSI + 14 * PSI // ND
    assert total(3) == 16 * PSI // ND


def test_it_uses_4_4_8_bytes_for_fp32_and_moves_offloaded_states_to_the_host():
    s = M.model_states(1000, 250, 4, 0, "fp32", "native")
    assert (s["weights"], s["gradients"], s["optimizer"]) == (4000, 4000, 8000)
    s = M.model_states(1000, 250, 4, 3, "bf16", "deepspeed", offload_optimizer=True, offload_params=True)
    assert s["weights"] == s["optimizer"] == 0 and s["host"] == 12 * 250 + 2 * 250 and s["gradients"] == 2 * 250


# docs/formulas.md, "Activation memory per transformer layer, 16-bit (Korthikanti et al. 2022, Table 2)":
# 16-bit activations, 1-byte dropout masks, materialised attention scores, f = 4h, no small terms.
S, B, H, A = 2048, 4, 12288, 96
TABLE = [  # (t, sequence parallel, checkpointing, bytes per layer from the table)
    (1, False, "none", S * B * H * (34 + 5 * A * S / H)),
    (8, False, "none", S * B * H * (10 + 24 / 8 + 5 * A * S / (H * 8))),
    (8, True, "none", S * B * H * (34 / 8 + 5 * A * S / (H * 8))),
    (8, False, "selective", S * B * H * (10 + 24 / 8)),
    (8, True, "selective", 34 * S * B * H / 8),
    (1, False, "full", 2 * S * B * H),
]


def _layer(t=1, sp=False, ckpt="none", e=2, dropout=True):
    """One layer's terms under Korthikanti's conventions: materialised scores, no small terms."""
    shape = M.LayerShape(d_model=H, ffn=4 * H, kv_dim=H, n_heads=A, seq_len=S, dropout=dropout)
    settings = M.ActivationSettings(micro_batch=B, tp=t, sequence_parallel=sp, checkpointing=ckpt,
                                    bytes_per_element=e, attention="math", small_terms=False)
    return dict(M.layer_activations(shape, settings))


@pytest.mark.parametrize("t,sp,ckpt,expected", TABLE)
def test_it_matches_korthikanti_table_term_by_term(t, sp, ckpt, expected):
    terms = _layer(t, sp, ckpt)
    assert sum(terms.values()) == pytest.approx(expected, rel=1e-12)
    T = S * B
    r = t if sp else 1
    if ckpt == "full":
        assert terms == {"layer_input": 2 * T * H}
        return
    # the table's terms, one by one: 4 LayerNorm-input bytes, 4 LayerNorm-output bytes, 2 mask bytes (the "10"
    # or 10/t), 6 q/k/v + 2 attention output + 16 MLP bytes (the "24"), 5·a·s/h for the attention core
    assert terms["layernorm_inputs"] == pytest.approx(4 * T * H / r)
    assert terms["layernorm_outputs"] == pytest.approx(4 * T * H / r)
    assert terms["dropout_masks"] == pytest.approx(2 * T * H / r)
    assert terms["qkv"] == pytest.approx(6 * T * H / t)
    assert terms["attention_output"] == pytest.approx(2 * T * H / t)
    assert terms["mlp"] == pytest.approx(16 * T * H / t)
    if ckpt == "none":
        assert terms["attention_scores"] + terms["attention_dropout"] == pytest.approx(5 * A * S * T / t)
    else:
        assert "attention_scores" not in terms


def test_it_drops_mask_terms_without_dropout_and_doubles_two_byte_terms_in_fp32():
    with_dropout = _layer(dropout=True)
    no_dropout = _layer(dropout=False)
    fp32 = _layer(e=4, dropout=False)
    T = S * B
    assert sum(no_dropout.values()) == pytest.approx(T * H * (32 + 2 * A * S / H))
    assert sum(with_dropout.values()) - sum(no_dropout.values()) == pytest.approx(T * H * (2 + 3 * A * S / H))
    assert sum(fp32.values()) == pytest.approx(2 * sum(no_dropout.values()))


def _pipeline(schedule, pp, m, v=1):
    """A plan of ``pp`` stages running ``m`` micro-batches a step under ``schedule`` with ``v`` chunks a stage."""
    return ParallelPlan(pp=pp, micro_batch=1, global_batch=m, pipeline_schedule=schedule, virtual_stages=v)


def test_it_counts_micro_batches_in_flight_by_schedule():
    assert M.in_flight(_pipeline("1f1b", 1, 64), 0) == 1
    assert M.in_flight(_pipeline("gpipe", 8, 64), 0) == 64
    assert M.in_flight(_pipeline("1f1b", 8, 64), 0) == 8 and M.in_flight(_pipeline("1f1b", 8, 64), 7) == 1
    assert M.in_flight(_pipeline("1f1b", 8, 3), 0) == 3
    # interleaved: p·(1 + (p−1)/(p·v)) on the first stage
    assert M.in_flight(_pipeline("interleaved", 8, 64, 4), 0) == pytest.approx(8 * (1 + 7 / 32))


def test_it_makes_the_1f1b_first_stage_hold_the_activations_of_all_layers():
    m = ModelSpec(n_layers=16, d_model=1024, n_heads=16, seq_len=1024, vocab_size=50304, tied_embeddings=False)
    opts = EstimateOptions(small_terms=False, attention="math")
    c = cluster("A100-SXM-80GB", 1)
    one = Planner(m, c, opts).evaluate(ParallelPlan(dp=8, micro_batch=1, global_batch=64, precision="bf16"))
    piped = Planner(m, c, opts).evaluate(ParallelPlan(dp=1, pp=8, micro_batch=1, global_batch=64, precision="bf16"))
    layer_terms = {"layernorm_inputs", "layernorm_outputs", "qkv", "attention_output", "mlp", "attention_scores"}
    whole = sum(v for k, v in one.stages[0].activations_per_microbatch.items() if k in layer_terms)
    first = piped.stages[0]
    per_stage = sum(v for k, v in first.activations_per_microbatch.items() if k in layer_terms)
    assert first.in_flight * per_stage == pytest.approx(whole)


def test_it_reports_the_peak_rank_and_the_per_microbatch_figure_apart_from_in_flight():
    from trainer.planner.estimate import estimate
    m = MODELS["gpt3-175b"]
    plan = ParallelPlan(dp=8, tp=8, pp=16, micro_batch=1, global_batch=1536, sequence_parallel=True,
                        precision="bf16", activation_checkpointing="selective")
    est = estimate(m, plan, cluster("A100-SXM-80GB", 128))
    stage0 = est.memory["stages"][0]
    assert stage0["activations"].value == pytest.approx(16 * stage0["activations_per_microbatch"].value)
    assert est.memory["peak_rank"] in (0, 15 * 8 * 8)  # rank = (stage·dp + d)·tp + j
    assert est.memory["peak"].value == max(s["total"].value for s in est.memory["stages"])


def test_it_partitions_deepspeed_experts_over_their_replicas():
    # 600 dense parameters over dp = 4; 400 expert parameters held by dp/ep = 2 ranks each
    assert M.deepspeed_shard(1000, 4, expert_params=400, ep=2) == 150 + 200
    assert M.deepspeed_shard(1000, 4) == 250
    s = M.model_states(1000, 350, 4, 1, "fp32", "deepspeed", expert_params=400, ep=2)
    # fp32 ZeRO keeps its own fp32 master partition beside the moments: 12 bytes per partitioned parameter
    assert s == {"weights": 4000, "gradients": 4000, "optimizer": 12 * 350, "host": 0}
