"""Published model shapes and GPUs, as contract objects. Standard library only.

GPT-2 from Radford et al. 2019; GPT-3 from Brown et al. 2020, Table 2.1. Two GPT-3 rows in that table do not divide:
1.3B lists 24 heads of 128 for d_model 2048 and 13B lists d_model 5140 for 40 heads of 128; like Megatron-LM's
reproductions, the presets use 16 heads for 1.3B and d_model 5120 for 13B so that head_dim = d_model / n_heads.
The Llama, Mixtral and Qwen2-MoE presets are the shapes of each model's published config.json (Meta's
Llama 3 / 3.1 / 3.2 releases, Mistral AI's Mixtral-8x7B-v0.1, Qwen's Qwen1.5-MoE-A2.7B); their parameter counts
equal Hugging Face transformers' models built from those configs, and the published totals (docs/formulas.md,
Parameters). ``seq_len`` is the pre-training context (8192; Mixtral 32,768 as released), not the longest one rope
scaling reaches.
GPUs are those of ``gpus``, with their datasheet figures.
"""
from __future__ import annotations

from pathlib import Path

from trainer.contract.gpus import GPU_FIGURES, PRESET_INTER_NODE_GBS, gpu_fields
from trainer.contract.specs import ClusterSpec, GPUSpec, ModelSpec, RopeScaling

_GPT2 = dict(seq_len=1024, vocab_size=50257)
_GPT3 = dict(seq_len=2048, vocab_size=50257)
_LLAMA3 = dict(seq_len=8192, vocab_size=128256, positions="rope", activation="swiglu", norm="rmsnorm", bias=False,
               tied_embeddings=False, rope_base=500000.0)
_TINY_LLAMA = dict(n_layers=4, d_model=64, n_heads=4, n_kv_heads=2, seq_len=64, vocab_size=512, ffn_hidden=176,
                   positions="rope", activation="swiglu", norm="rmsnorm", bias=False, tied_embeddings=False,
                   rope_base=500000.0, rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                               original_max_positions=32))

MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    ModelSpec(name="gpt2-small", n_layers=12, d_model=768, n_heads=12, **_GPT2),
    ModelSpec(name="gpt2-medium", n_layers=24, d_model=1024, n_heads=16, **_GPT2),
    ModelSpec(name="gpt2-large", n_layers=36, d_model=1280, n_heads=20, **_GPT2),
    ModelSpec(name="gpt2-xl", n_layers=48, d_model=1600, n_heads=25, **_GPT2),
    ModelSpec(name="gpt3-125m", n_layers=12, d_model=768, n_heads=12, **_GPT3),
    ModelSpec(name="gpt3-350m", n_layers=24, d_model=1024, n_heads=16, **_GPT3),
    ModelSpec(name="gpt3-760m", n_layers=24, d_model=1536, n_heads=16, **_GPT3),
    ModelSpec(name="gpt3-1.3b", n_layers=24, d_model=2048, n_heads=16, **_GPT3),
    ModelSpec(name="gpt3-2.7b", n_layers=32, d_model=2560, n_heads=32, **_GPT3),
    ModelSpec(name="gpt3-6.7b", n_layers=32, d_model=4096, n_heads=32, **_GPT3),
    ModelSpec(name="gpt3-13b", n_layers=40, d_model=5120, n_heads=40, **_GPT3),
    ModelSpec(name="gpt3-175b", n_layers=96, d_model=12288, n_heads=96, **_GPT3),
    # Llama 3 (Meta, April 2024; "The Llama 3 Herd of Models", arXiv:2407.21783): RMSNorm, SwiGLU, grouped-query
    # attention of 8 KV heads, rotary θ = 500,000, a 128,256-token vocabulary, no biases, untied head (tied at 1B).
    ModelSpec(name="llama3-8b", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, ffn_hidden=14336, **_LLAMA3),
    ModelSpec(name="llama3-70b", n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, ffn_hidden=28672, **_LLAMA3),
    ModelSpec(name="llama3.1-405b", n_layers=126, d_model=16384, n_heads=128, n_kv_heads=8, ffn_hidden=53248,
              rope_scaling=RopeScaling(factor=8.0), **_LLAMA3),
    ModelSpec(name="llama3.2-1b", n_layers=16, d_model=2048, n_heads=32, n_kv_heads=8, ffn_hidden=8192,
              rope_scaling=RopeScaling(factor=32.0), **{**_LLAMA3, "tied_embeddings": True}),
    # Mixtral 8x7B (Jiang et al. 2024, arXiv:2401.04088): Mistral 7B's attention with 8 SwiGLU experts of 14,336,
    # top-2 renormalised, no token dropped.
    ModelSpec(name="mixtral-8x7b", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, ffn_hidden=14336,
              seq_len=32768, vocab_size=32000, positions="rope", activation="swiglu", norm="rmsnorm", bias=False,
              tied_embeddings=False, rope_base=1e6, n_experts=8, top_k=2, topk_norm="renormalize",
              capacity_factor=0.0, aux_loss_coef=0.02),
    # Qwen1.5-MoE-A2.7B (Qwen2-MoE architecture): q/k/v biases, 60 experts of 1408, top-4 without renormalising,
    # one shared expert of 5632 behind a sigmoid gate on every layer.
    ModelSpec(name="qwen1.5-moe-a2.7b", n_layers=24, d_model=2048, n_heads=16, ffn_hidden=5632, seq_len=8192,
              vocab_size=151936, positions="rope", activation="swiglu", norm="rmsnorm", norm_eps=1e-6, bias=False,
              qkv_bias=True, tied_embeddings=False, rope_base=1e6, n_experts=60, top_k=4, moe_ffn_hidden=1408,
              topk_norm="none", capacity_factor=0.0, shared_expert_ffn=5632, shared_expert_gate=True,
              aux_loss_coef=0.001),
    # Small shapes for tests, smoke runs and the CPU.
    ModelSpec(name="tiny", n_layers=4, d_model=64, n_heads=4, seq_len=64, vocab_size=512),
    ModelSpec(name="tiny-moe", n_layers=4, d_model=64, n_heads=4, seq_len=64, vocab_size=512,
              n_experts=4, top_k=2, moe_every=2),
    # Tiny members of the Llama, Mixtral and Qwen2-MoE families: every feature of the full-size model (RMSNorm,
    # SwiGLU, grouped-query attention, Llama 3.1's rope scaling, untied head; routed experts without dropping
    # tokens; Qwen2's q/k/v biases and gated shared expert) at a size the CPU trains in seconds.
    ModelSpec(name="tiny-llama", **_TINY_LLAMA),
    ModelSpec(name="tiny-mixtral", **{**_TINY_LLAMA, "rope_scaling": None, "rope_base": 1e6}, n_experts=4, top_k=2,
              moe_ffn_hidden=128, topk_norm="renormalize", capacity_factor=0.0, aux_loss_coef=0.02),
    ModelSpec(name="tiny-qwen-moe", **{**_TINY_LLAMA, "rope_scaling": None, "rope_base": 1e6, "norm_eps": 1e-6},
              qkv_bias=True, n_experts=4, top_k=2, moe_ffn_hidden=64, topk_norm="none", capacity_factor=0.0,
              shared_expert_ffn=128, shared_expert_gate=True, aux_loss_coef=0.001),
)}

GPUS: dict[str, GPUSpec] = {name: GPUSpec(**gpu_fields(name)) for name in GPU_FIGURES}


def cluster(gpu: str = "A100-SXM-80GB", nodes: int = 1, gpus_per_node: int = 8, name: str = "",
            inter_node_bandwidth_gbs: float = PRESET_INTER_NODE_GBS, gpu_hour_cost: float = 0.0) -> ClusterSpec:
    """A cluster of ``nodes`` × ``gpus_per_node`` of a named GPU with its NVLink figure."""
    return ClusterSpec(gpu=GPUS[gpu], nodes=nodes, gpus_per_node=gpus_per_node,
                       name=name or f"{nodes}x{gpus_per_node} {gpu}",
                       intra_node_bandwidth_gbs=GPU_FIGURES[gpu]["nvlink_gbs"],
                       inter_node_bandwidth_gbs=inter_node_bandwidth_gbs, gpu_hour_cost=gpu_hour_cost)


def local_cpu_cluster(processes: int) -> ClusterSpec:
    """This machine as a cluster of ``processes`` CPU ranks (gloo)."""
    return cluster("cpu", nodes=1, gpus_per_node=processes, name=f"local cpu x{processes}",
                   inter_node_bandwidth_gbs=10.0)


# The demo corpus (trainer/data/corpus/README.md): the dataset a first run uses, and the text of the tests and
# benchmarks. Reached by path so that the contract stays free of imports; it ships as package data.
DEMO_TEXT = Path(__file__).resolve().parents[1] / "data" / "corpus" / "tinyshakespeare.txt"


def demo_text(max_bytes: int | None = None) -> bytes:
    """The demo text, or its first ``max_bytes`` bytes cut back to the last line break (whole lines only)."""
    data = DEMO_TEXT.read_bytes()
    if max_bytes is None or max_bytes >= len(data):
        return data
    head = data[:max_bytes]
    return head[:head.rfind(b"\n") + 1]
