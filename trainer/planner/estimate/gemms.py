"""How efficiently a GPU runs a matmul of given shapes: tile quantization, K slabs, wave quantization and alignment
(NVIDIA, "Matrix Multiplication Background User's Guide", Deep Learning Performance documentation).

A GEMM C[M×N] = A[M×K]·B[K×N] is cut into output tiles of tile_m × tile_n; each tile runs on one SM and walks K in
slabs. So

    tile efficiency  = M·N / (⌈M/tile_m⌉·tile_m · ⌈N/tile_n⌉·tile_n)     (the padded part of the edge tiles is wasted)
    K efficiency     = K / (⌈K/k_slab⌉·k_slab)
    wave efficiency  = tiles / (⌈tiles/SMs⌉ · SMs)                         (the last wave runs part-empty)
    alignment        = 1, or unaligned_efficiency when M, N or K is not a multiple of 16 bytes

and the GEMM runs at the product of these times the rate of a large aligned GEMM. A model's shape efficiency is
the FLOP-weighted harmonic mean over its matmuls (the time they take at these efficiencies against the time at 1),
with the fused attention core left at 1: its tiles follow head_dim and the sequence, not these shapes.

Standard library only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from trainer.contract import ModelSpec, ParallelPlan
from trainer.planner.estimate.gpu_kernels import GpuKernels
from trainer.planner.estimate import memory as M


@dataclass(frozen=True)
class Gemm:
    """``count`` independent M×N×K products (a batched GEMM: experts, or one per head). ``useful`` is the fraction
    of the M rows that carry real tokens (an expert runs at its capacity, empty slots included)."""

    name: str
    m: int
    n: int
    k: int
    count: int = 1
    useful: float = 1.0

    @property
    def flops(self) -> float:
        """Useful FLOPs: 2·M·N·K per product, the empty rows not counted."""
        return 2.0 * self.m * self.n * self.k * self.count * self.useful


@dataclass(frozen=True)
class GemmEfficiency:
    tile: float
    k: float
    wave: float
    alignment: float
    useful: float
    tiles: int
    waves: int

    @property
    def total(self) -> float:
        return self.tile * self.k * self.wave * self.alignment * self.useful

    def to_dict(self) -> dict:
        return {"tile": self.tile, "k": self.k, "wave": self.wave, "alignment": self.alignment,
                "useful": self.useful, "tiles": self.tiles, "waves": self.waves, "total": self.total}


def _padded(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple


def gemm_efficiency(g: Gemm, gpu: GpuKernels, bytes_per_element: int = 2) -> GemmEfficiency:
    """The factors above for one (batched) GEMM on ``gpu`` with elements of ``bytes_per_element`` bytes."""
    if min(g.m, g.n, g.k, g.count) < 1:
        raise ValueError(f"GEMM {g.name!r} needs positive dimensions, got M={g.m} N={g.n} K={g.k} count={g.count}")
    tiles = -(-g.m // gpu.tile_m) * -(-g.n // gpu.tile_n) * g.count
    tile = g.m * g.n / (_padded(g.m, gpu.tile_m) * _padded(g.n, gpu.tile_n))
    slab = max(1, gpu.k_slab_bytes // bytes_per_element)
    k = g.k / _padded(g.k, slab)
    waves = -(-tiles // gpu.sms)
    wave = tiles / (waves * gpu.sms)
    align = max(1, gpu.align_bytes // bytes_per_element)
    aligned = g.m % align == 0 and g.n % align == 0 and g.k % align == 0
    return GemmEfficiency(tile, k, wave, 1.0 if aligned else gpu.unaligned_efficiency, g.useful, tiles, waves)


def linear_gemms(name: str, tokens: int, out: int, inp: int, count: int = 1, useful: float = 1.0) -> list[Gemm]:
    """A linear layer's three GEMMs: forward (T, out, in), input gradient (T, in, out), weight gradient
    (in, out, T)."""
    return [Gemm(f"{name}.forward", tokens, out, inp, count, useful),
            Gemm(f"{name}.input_grad", tokens, inp, out, count, useful),
            Gemm(f"{name}.weight_grad", inp, out, tokens, count, useful)]


def forward_gemm(name: str, tokens: int, out: int, inp: int, count: int = 1, useful: float = 1.0) -> list[Gemm]:
    """A linear layer's forward GEMM alone (T, out, in): what serving runs."""
    return [Gemm(name, tokens, out, inp, count, useful)]


Linear = Callable[..., list[Gemm]]  # linear_gemms or forward_gemm


def layer_gemms(model: ModelSpec, plan: ParallelPlan, moe: bool) -> list[Gemm]:
    """One block's GEMMs for one micro-batch on one tensor-parallel rank (q, k, v, out; the MLP or the router and
    experts)."""
    t, T = plan.tp, plan.micro_batch * model.seq_len
    out = _attention(model, T, t, linear_gemms)
    if moe:
        E, k, c = model.n_experts, model.top_k, model.capacity_factor
        cap = M.expert_capacity(T, E, k, c)
        useful = M.moe_kept(T, E, k, c) / (E * cap)
        out += linear_gemms("router", T, E, model.d_model) \
            + _mlp("expert", model, cap, model.moe_ffn // t, linear_gemms, E, useful)
        if model.shared_expert_ffn:
            out += _mlp("shared_expert", model, T, model.shared_expert_ffn // t, linear_gemms)
    else:
        out += _mlp("mlp", model, T, model.ffn // t, linear_gemms)
    return out


def _attention(model: ModelSpec, tokens: int, t: int, linear: Linear) -> list[Gemm]:
    """The attention block's projections per tensor-parallel rank: q, k, v and out."""
    h, kv = model.d_model, model.kv_heads * model.head_dim
    return linear("q", tokens, h // t, h) + linear("k", tokens, kv // t, h) + linear("v", tokens, kv // t, h) \
        + linear("out", tokens, h, h // t)


def _mlp(name: str, model: ModelSpec, tokens: int, width: int, linear: Linear, count: int = 1,
         useful: float = 1.0) -> list[Gemm]:
    """An MLP of ``width`` (per tensor-parallel rank): up and down, and SwiGLU's gate beside up."""
    h = model.d_model
    gate = linear(f"{name}.gate", tokens, width, h, count, useful) if model.is_gated else []
    return gate + linear(f"{name}.up", tokens, width, h, count, useful) \
        + linear(f"{name}.down", tokens, h, width, count, useful)


def serving_gemms(model: ModelSpec, tokens: int, sequences: int) -> list[tuple[Gemm, int]]:
    """(GEMM, how many layers run it) of one serving forward of ``tokens`` new tokens over ``sequences`` sequences
    on one device: every block's projections and MLP at ``tokens`` rows, the head at one row per sequence (only
    each sequence's last token is sampled). An MoE block computes each chosen expert of each token, nothing dropped:
    with routing spread evenly, the tokens·k choices reach E·(1 − (1 − k/E)^tokens) experts on average, each
    running the choices' share of rows. The MoE blocks' GEMMs are named moe_…, apart from the dense blocks'."""
    n_moe = len(model.moe_layers)
    out = []
    if model.n_layers > n_moe:
        dense = _attention(model, tokens, 1, forward_gemm) + _mlp("mlp", model, tokens, model.ffn, forward_gemm)
        out += [(g, model.n_layers - n_moe) for g in dense]
    if n_moe:
        E, k = model.n_experts, model.top_k
        reached = max(1, math.ceil(E * (1 - (1 - k / E) ** tokens)))
        experts = _mlp("expert", model, math.ceil(tokens * k / reached), model.moe_ffn, forward_gemm, reached)
        if model.shared_expert_ffn:
            experts += _mlp("shared_expert", model, tokens, model.shared_expert_ffn, forward_gemm)
            if model.shared_expert_gate:
                experts += forward_gemm("shared_gate", tokens, 1, model.d_model)
        block = _attention(model, tokens, 1, forward_gemm) + forward_gemm("router", tokens, E, model.d_model) + experts
        out += [(replace(g, name=f"moe_{g.name}"), n_moe) for g in block]
    return out + [(Gemm("head", sequences, model.vocab_size, model.d_model), 1)]


def model_gemms(model: ModelSpec, plan: ParallelPlan) -> list[tuple[Gemm, int]]:
    """(GEMM, how many times a step's micro-batch runs it): every block and the head (vocabulary split by t)."""
    n_moe = len(model.moe_layers)
    out = [(g, model.n_layers - n_moe) for g in layer_gemms(model, plan, False)] if model.n_layers > n_moe else []
    if n_moe:
        out += [(g, n_moe) for g in layer_gemms(model, plan, True)]
    T = plan.micro_batch * model.seq_len
    out += [(g, 1) for g in linear_gemms("head", T, -(-model.vocab_size // plan.tp), model.d_model)]
    return out


def attention_core_flops(model: ModelSpec, plan: ParallelPlan) -> float:
    """The attention core's FLOPs (q·kᵀ and the weighted values, forward and backward) for one micro-batch on one
    rank: 12·L·h·s per token (docs/formulas.md, FLOPs), over T tokens and t ranks."""
    return 12.0 * model.n_layers * model.d_model * model.seq_len * plan.micro_batch * model.seq_len / plan.tp


@dataclass(frozen=True)
class ShapeEfficiency:
    value: float                       # FLOP-weighted harmonic mean over the matmuls and the attention core
    gemms: list[tuple[Gemm, int, GemmEfficiency]]

    def worst(self, n: int = 3) -> list[dict]:
        """The ``n`` GEMMs that lose the most time to their shapes, for the reason text."""
        lost = sorted(self.gemms, key=lambda r: -r[0].flops * r[1] * (1 / r[2].total - 1))
        return [{"gemm": g.name, "m": g.m, "n": g.n, "k": g.k, "count": g.count, "efficiency": e.to_dict()}
                for g, _, e in lost[:n] if e.total < 1]


def shape_efficiency(model: ModelSpec, plan: ParallelPlan, gpu: GpuKernels | None) -> ShapeEfficiency:
    """1 without tile figures (the CPU device, or a GPU given by its figures only)."""
    if gpu is None:
        return ShapeEfficiency(1.0, [])
    e = 4 if plan.precision == "fp32" else 2
    rows = [(g, n, gemm_efficiency(g, gpu, e)) for g, n in model_gemms(model, plan)]
    useful = sum(g.flops * n for g, n, _ in rows)
    spent = sum(g.flops * n / eff.total for g, n, eff in rows)
    attention = attention_core_flops(model, plan)
    value = (useful + attention) / (spent + attention)
    return ShapeEfficiency(value if math.isfinite(value) else 1.0, rows)
