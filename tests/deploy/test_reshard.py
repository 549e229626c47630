"""The serving layout: each rank's shard holds its heads and hidden units, and two ranks joined by gloo generate
exactly what one rank generates over the whole weights."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from deploy.reduce import reduce_state
from deploy.reshard import shard_problems, shard_state
from deploy.serving.model import ServingGPT, ServingSpec
from tests.trainer.launch import free_port
from trainer.contract.presets import MODELS
from trainer.model import build_model

CASES = {"rope-gqa-untied-int8": (dict(positions="rope", n_kv_heads=2, tied_embeddings=False), "int8"),
         "moe": (dict(n_experts=4, top_k=2, capacity_factor=8.0), "none")}


def _greedy(model: ServingGPT, prompts: list[list[int]], n: int) -> list[list[int]]:
    """n greedy tokens for each prompt, all decoded together."""
    out = [[int(model.prefill(s, p).argmax())] for s, p in enumerate(prompts)]
    for _ in range(n - 1):
        logits = model.decode(list(range(len(prompts))), [o[-1] for o in out])
        for o, row in zip(out, logits):
            o.append(int(row.argmax()))
    return out


def _rank(rank: int, port: int, spec: dict, shards, prompts, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model = ServingGPT(ServingSpec.from_dict(spec), shards[rank], len(prompts), rank, 2,
                           lambda t: dist.all_reduce(t))
        tokens = _greedy(model, prompts, 24)
        if rank == 0:
            results.put(tokens)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("case", CASES)
def test_two_ranks_generate_what_one_generates(case):
    kw, reduction = CASES[case]
    spec = MODELS["tiny"].replace(**kw)
    state = reduce_state(build_model(spec, 3).eval().state_dict(), reduction)
    prompts = [[5, 6, 7], [1, 2, 3, 4, 9, 10], [42]]
    whole = _greedy(ServingGPT(ServingSpec.from_dict(spec.to_dict()), state, len(prompts)), prompts, 24)
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ranks = [context.Process(target=_rank, args=(r, port, spec.to_dict(), shard_state(state, spec, 2), prompts,
                                                   results)) for r in range(2)]
    for p in ranks:
        p.start()
    split = results.get(timeout=120)
    for p in ranks:
        p.join(timeout=60)
    assert split == whole and all(p.exitcode == 0 for p in ranks)


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
