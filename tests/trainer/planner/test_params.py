"""Exact parameter counts (docs/formulas.md, Parameters) and each rank's share."""
import pytest

from trainer.planner.estimate.params import count, rank_params
from trainer.contract.presets import MODELS
from trainer.contract import ModelSpec

# Published / independently known totals of the GPT-2 family (tied head, learned positions, biases).
GPT2_KNOWN = {"gpt2-small": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080,
              "gpt2-xl": 1_557_611_200}


def reference_formula(m: ModelSpec) -> int:
    """L(12h² + 13h) + V·h + s·h + 2h — docs/formulas.md's dense-GPT formula."""
    h = m.d_model
    return m.n_layers * (12 * h * h + 13 * h) + m.vocab_size * h + m.seq_len * h + 2 * h


@pytest.mark.parametrize("name", list(GPT2_KNOWN))
def test_it_counts_gpt2_parameters_exactly(name):
    assert count(MODELS[name]).total == GPT2_KNOWN[name] == reference_formula(MODELS[name])


@pytest.mark.parametrize("name", [n for n in MODELS if n.startswith("gpt3")])
def test_it_counts_gpt3_family_by_the_formula(name):
    assert count(MODELS[name]).total == reference_formula(MODELS[name])


def test_it_puts_gpt3_175b_at_174_6_billion():
    assert round(count(MODELS["gpt3-175b"]).total / 1e9, 1) == 174.6


def test_it_counts_the_gpt2_shape_built_in_torch_the_same():
    import torch

    from trainer.model import GPT

    with torch.device("meta"):  # shapes only: no memory, no initialisation
        gpt = GPT(MODELS["gpt2-small"])
    distinct = {id(p): p.numel() for p in gpt.parameters()}
    assert sum(distinct.values()) == count(MODELS["gpt2-small"]).total


def test_it_counts_moe_total_and_active_parameters():
    m = MODELS["tiny-moe"]  # 4 layers, moe_every=2: layers 1 and 3 have 4 experts, top-2
    h, f, E, k = m.d_model, m.ffn, m.n_experts, m.top_k
    attention_and_norms = 4 * h * h + 4 * h + 4 * h
    expert = 2 * h * f + f + h
    dense = 12 * h * h + 13 * h
    outside = m.vocab_size * h + m.seq_len * h + 2 * h
    c = count(m)
    assert c.total == 2 * dense + 2 * (attention_and_norms + E * expert + h * E) + outside
    assert c.active == 2 * dense + 2 * (attention_and_norms + k * expert + h * E) + outside


def test_it_splits_tensor_parallel_shards_that_add_up_to_the_stage():
    m = MODELS["gpt2-medium"]
    full = rank_params(m, 1, 1, 1, 0)
    t = 4
    per_rank = [rank_params(m, t, 1, 1, 0, tp_rank=r) for r in range(t)]
    # replicated tensors (LayerNorms, row-parallel biases, positions) are on every rank
    h, L = m.d_model, m.n_layers
    replicated = L * (4 * h + 2 * h) + m.seq_len * h + 2 * h
    assert sum(per_rank) == full + (t - 1) * replicated


def test_it_puts_embeddings_first_and_a_tied_head_copy_last():
    m = MODELS["gpt2-small"]
    h, V, s = m.d_model, m.vocab_size, m.seq_len
    block = 12 * h * h + 13 * h
    stages = [rank_params(m, 1, 4, 1, i) for i in range(4)]
    assert stages[0] == 3 * block + V * h + s * h
    assert stages[1] == stages[2] == 3 * block
    assert stages[3] == 3 * block + 2 * h + V * h  # the copy of the tied embedding
    assert sum(stages) == count(m).total + V * h


def test_it_shards_fsdp_chunks_so_they_sum_to_the_whole():
    m = MODELS["tiny"]
    dp = 3  # does not divide 64: torch.chunk sizes 22, 22, 20
    shards = [rank_params(m, 1, 1, 1, 0, shard=dp, shard_rank=r) for r in range(dp)]
    assert sum(shards) == count(m).total
    assert shards[0] == max(shards)


@pytest.mark.parametrize("ep", [1, 2, 4])
def test_it_spreads_experts_over_ep_ranks_and_replicates_the_router(ep):
    m = MODELS["tiny-moe"]
    h, f, E = m.d_model, m.ffn, m.n_experts
    expert = 2 * h * f + f + h
    n_moe = len(m.moe_layers)
    # each rank holds E/ep experts of every MoE layer; everything else (the router h·E included) on every rank
    assert rank_params(m, 1, 1, 1, 0, ep) == count(m).total - n_moe * (E - E // ep) * expert
    # the ep ranks together hold each expert once and the rest ep times
    assert ep * rank_params(m, 1, 1, 1, 0, ep) == count(m).total + (ep - 1) * (count(m).total - n_moe * E * expert)
