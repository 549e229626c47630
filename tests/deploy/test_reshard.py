"""The serving layout: each rank's shard holds its heads and hidden units, and two ranks joined by gloo generate
exactly what one rank generates over the whole weights, for every family of model."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from deploy.reduce import reduce_state
from deploy.reshard import shard_problems, shard_state
from deploy.serving.model import ServingGPT, ServingSpec
from tests.deploy.test_serving_engine import family_model
from tests.trainer.launch import free_port
from trainer.contract.presets import MODELS
from trainer.model import build_model

# (model, reduction) served split over two ranks: GPT-2 with rotary positions, GQA and an untied head; a GELU MoE;
# Llama (SwiGLU's gate split with its up, GQA); Mixtral (experts' gates); Qwen2-MoE (q/k/v biases split by heads,
# the shared expert split, its gate whole)
CASES = {"rope-gqa-untied": ("tiny", dict(positions="rope", n_kv_heads=2, tied_embeddings=False), "int8"),
         "moe": ("tiny", dict(n_experts=4, top_k=2, capacity_factor=8.0), "none"),
         "llama": ("tiny-llama", {}, "int8"), "mixtral": ("tiny-mixtral", {}, "bf16"),
         "qwen-moe": ("tiny-qwen-moe", {}, "none")}
PROMPTS = [[5, 6, 7], [1, 2, 3, 4, 9, 10], [42]]


def _greedy(model: ServingGPT, prompts: list[list[int]], n: int) -> list[list[int]]:
    """n greedy tokens for each prompt, all decoded together."""
    out = [[int(model.extend([s], [p])[0].argmax())] for s, p in enumerate(prompts)]
    for _ in range(n - 1):
        logits = model.extend(list(range(len(prompts))), [[o[-1]] for o in out])
        for o, row in zip(out, logits):
            o.append(int(row.argmax()))
    return out


def _rank(rank: int, port: int, cases: list[tuple[dict, list]], results) -> None:
    """Each case (spec, shards) served split over the two ranks, one after the other in one process group."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        tokens = [_greedy(ServingGPT(ServingSpec.from_dict(spec), shards[rank], len(PROMPTS), rank, 2,
                                     lambda t: dist.all_reduce(t)), PROMPTS, 24) for spec, shards in cases]
        if rank == 0:
            results.put(tokens)
    finally:
        dist.destroy_process_group()


def _split_greedy(cases: list[tuple[dict, list]]) -> list[list[list[int]]]:
    """What two spawned ranks generate for each case."""
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ranks = [context.Process(target=_rank, args=(r, port, cases, results)) for r in range(2)]
    for p in ranks:
        p.start()
    split = results.get(timeout=120)
    for p in ranks:
        p.join(timeout=60)
    assert all(p.exitcode == 0 for p in ranks)
    return split


def test_two_ranks_generate_what_one_generates():
    """Every case split over two ranks (one pair of processes serves them one after the other) gives the tokens of
    the whole model; the whole model's are the trainer's (test_serving_engine)."""
    cases, wholes = [], []
    for preset, kw, reduction in CASES.values():
        spec, model = family_model(preset, **kw)
        state = reduce_state(model.state_dict(), reduction)
        wholes.append(_greedy(ServingGPT(ServingSpec.from_dict(spec.to_dict()), state, len(PROMPTS)), PROMPTS, 24))
        cases.append((spec.to_dict(), shard_state(state, spec, 2)))
    assert _split_greedy(cases) == wholes


def test_each_rank_holds_the_halves_of_every_mlp_and_the_shared_gate_whole():
    spec, model = family_model("tiny-qwen-moe")
    state = model.state_dict()
    shards = shard_state(state, spec, 2)
    for name in ("layers.0.mlp.shared.gate.weight", "layers.0.mlp.experts.1.gate.weight", "layers.0.attn.k.bias"):
        assert torch.equal(shards[1][name], state[name][state[name].shape[0] // 2:]), name
    assert shards[0]["layers.0.mlp.experts.1.down.weight"].shape == (spec.d_model, spec.moe_ffn // 2)
    assert shards[0]["layers.0.mlp.shared.down.weight"].shape == (spec.d_model, spec.shared_expert_ffn // 2)
    for name in ("layers.0.mlp.shared_gate.weight", "layers.0.mlp.router.weight", "layers.0.ln1.weight"):
        assert torch.equal(shards[1][name], state[name]), name
    assert shards[0].keys() == shards[1].keys()
    assert all(not shard_problems(MODELS[family], 2) for family in ("tiny-llama", "tiny-mixtral", "tiny-qwen-moe"))
    # every layer has experts: no dense width; a shared expert 2 ranks cannot halve is refused
    assert "MLP widths (expert 64, shared expert 129)" in shard_problems(spec.replace(shared_expert_ffn=129), 2)[0]


def test_each_rank_holds_its_heads_and_hidden_units():
    spec = MODELS["tiny"].replace(n_kv_heads=2)
    state = reduce_state(build_model(spec, 3).state_dict(), "int8")
    shards = shard_state(state, spec, 2)
    D, F = spec.head_dim, spec.ffn
    q, k = state["layers.0.attn.q.weight"], state["layers.0.attn.k.weight"]
    assert torch.equal(shards[1]["layers.0.attn.q.weight"], q[spec.n_heads * D // 2:])
    assert shards[0]["layers.0.attn.k.weight"].shape == (spec.kv_heads * D // 2, spec.d_model) and k.dtype == torch.int8
    assert shards[0]["layers.0.mlp.down.weight"].shape == (spec.d_model, F // 2)
    assert torch.equal(shards[1]["layers.0.mlp.down.weight_scale"], state["layers.0.mlp.down.weight_scale"])
    assert "head.weight" not in shards[0]  # the tied head is the embedding, stored once
    assert "tensor_parallel=3 must divide n_heads=4" in shard_problems(spec, 3)[0]
