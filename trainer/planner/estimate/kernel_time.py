"""A micro-batch's compute on one GPU rank, kernel by kernel (docs/formulas.md, Compute from the kernels).

Each layer is costed from its shapes, not from one efficiency constant:

    GEMMs         every matmul of ``gemms.layer_gemms`` (forward, input gradient, weight gradient) at
                  max(FLOPs / (peak · gemm_fraction · shape efficiency), bytes / (HBM · hbm_fraction)): the tile,
                  K-slab, wave and alignment losses of its shape below the best GEMM the GPU reaches, or the memory
                  roofline when it is too thin to be compute-bound
    attention     fused: the flash kernel's FLOPs (causal: half the s × s square; backward 2.5 × forward) at
                  peak · flash_fraction; math: q·kᵀ and p·v as batched GEMMs per head (the same rule) plus the
                  softmax and its dropout streaming the b·(a/t)·s² scores through HBM
    elementwise   what streams the residual width through HBM: two norms, two residual adds (with their dropout
                  masks when the model has dropout), the activation of the MLP, rotary embeddings; the norms and
                  residuals on 1/t of the tokens under sequence parallel

Backward passes stream more than forward ones (a norm's backward reads its input and the gradient and writes one;
the activation's backward reads its input and the gradient). Recompute replays the forward (full) or the attention
core's forward (selective). The constants are bytes per element that each kernel reads and writes; the GPU's rates
are ``gpu_kernels``' measurements.
"""
from __future__ import annotations

from dataclasses import dataclass

from trainer.contract import ModelSpec, ParallelPlan
from trainer.planner.estimate.gemms import Gemm, gemm_efficiency, layer_gemms, linear_gemms
from trainer.planner.estimate.gpu_kernels import GpuKernels
from trainer.planner.estimate.memory import activation_bytes_per_element
from trainer.planner.estimate.step_model import PASS_KERNELS

FLASH_BACKWARD_RATIO = 2.5   # a flash backward's FLOPs over its forward's (it recomputes the scores)
MASK_BYTES = 1               # a dropout mask element (a bool)


@dataclass(frozen=True, slots=True)
class Work:
    """Seconds of one pass by kind of kernel."""

    gemm: float = 0.0
    attention: float = 0.0
    elementwise: float = 0.0

    @property
    def seconds(self) -> float:
        return PASS_KERNELS.function(self.gemm, self.attention, self.elementwise)

    def __add__(self, other: "Work") -> "Work":
        return Work(self.gemm + other.gemm, self.attention + other.attention, self.elementwise + other.elementwise)


@dataclass(frozen=True, slots=True)
class LayerWork:
    """A layer's forward, its backward (input and weight gradients) and what recompute adds, for one micro-batch on
    one rank; ``weight_grad_s`` is the part of the backward's GEMMs that computes weight gradients, what a
    tensor-parallel all-reduce of the input gradient can run behind."""

    forward: Work
    backward: Work
    recompute: Work
    weight_grad_s: float

    @property
    def seconds(self) -> float:
        return self.forward.seconds + self.backward.seconds + self.recompute.seconds


class KernelClock:
    """Seconds of kernels on one GPU: its peak FLOP/s and HBM bytes/s with the measured shares ``kernels`` gives,
    each at the share a training step's kernels sustain one after another (``GpuKernels.layer_fraction``)."""

    def __init__(self, kernels: GpuKernels, peak_flops: float, hbm_bytes_per_s: float):
        self.kernels = kernels
        sustained = kernels.layer_fraction
        self.gemm_flops = peak_flops * kernels.gemm_fraction * sustained
        self.flash_flops = peak_flops * kernels.flash_fraction * sustained
        self.hbm = hbm_bytes_per_s * kernels.hbm_fraction * sustained

    def gemm(self, g: Gemm, e: int) -> float:
        """The roofline of one (batched) GEMM: its FLOPs at the shape's rate, or its operands through HBM."""
        # fp32 matmuls run on TF32 tensor cores, at half the 16-bit rate (the datasheets' dense figures)
        rate = self.gemm_flops * gemm_efficiency(g, self.kernels, e).total / (2 if e == 4 else 1)
        moved = e * (g.m * g.k + g.k * g.n + g.m * g.n) * g.count
        return max(g.flops / rate, moved / self.hbm)

    def streamed(self, nbytes: float) -> float:
        return nbytes / self.hbm


def _passes(gemms: list[Gemm], clock: KernelClock, e: int) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) seconds of a list of linear layers' GEMMs."""
    out = {"forward": 0.0, "input_grad": 0.0, "weight_grad": 0.0}
    for g in gemms:
        out[g.name.rsplit(".", 1)[1]] += clock.gemm(g, e)
    return out["forward"], out["input_grad"], out["weight_grad"]


def _attention(model: ModelSpec, plan: ParallelPlan, clock: KernelClock, e: int, fused: bool,
               scale: float) -> tuple[Work, Work]:
    """The attention core's forward and backward for one micro-batch on one rank, × ``scale``."""
    s, b, t = model.seq_len, plan.micro_batch, plan.tp
    heads = b * model.n_heads // t
    d = model.head_dim
    if fused:
        forward_flops = 2.0 * b * s * s * model.d_model / t   # causal: half of q·kᵀ and p·v over the s × s square
        forward = scale * forward_flops / clock.flash_flops
        return Work(attention=forward), Work(attention=FLASH_BACKWARD_RATIO * forward)
    scores = heads * s * s
    qk, pv = Gemm("qk.forward", s, s, d, heads), Gemm("pv.forward", s, d, s, heads)
    forward_gemm = clock.gemm(qk, e) + clock.gemm(pv, e)
    # backward: dq and dk from the score gradient (s × d × s each), dp and dv (s × s × d and s × d × s)
    backward_gemm = 3 * clock.gemm(Gemm("dq", s, d, s, heads), e) + clock.gemm(Gemm("dp", s, s, d, heads), e)
    drop = model.dropout > 0
    forward_bytes = scores * (2 * e + (2 * e + MASK_BYTES if drop else 0))   # softmax; dropout
    backward_bytes = scores * (3 * e + (2 * e + MASK_BYTES if drop else 0))
    return (Work(attention=scale * (forward_gemm + clock.streamed(forward_bytes))),
            Work(attention=scale * (backward_gemm + clock.streamed(backward_bytes))))


def _elementwise(model: ModelSpec, plan: ParallelPlan, clock: KernelClock, e: int, ffn: int) -> tuple[float, float]:
    """Forward and backward seconds of the kernels that stream a layer's activations: per token, the norms and
    residual adds over h (1/t of the tokens under sequence parallel), the MLP's activation over f/t, rotary
    embeddings over q and k."""
    T, t, h = plan.micro_batch * model.seq_len, plan.tp, model.d_model
    r = t if plan.sequence_parallel else 1
    mask = MASK_BYTES if model.dropout > 0 else 0
    width = ffn / t
    # forward: a norm reads and writes h; a residual add reads two and writes one (and a mask); the activation reads
    # its input (two for SwiGLU) and writes one; rotary reads and writes q and k
    forward = 2 * (2 * e * h) / r + 2 * (3 * e + mask) * h / r + (3 if model.is_gated else 2) * e * width
    # backward: a norm reads its input and the gradient and writes one; a residual reads the gradient (and the
    # mask) and writes two; the activation reads its inputs and the gradient and writes the inputs' gradients
    backward = 2 * (3 * e * h) / r + 2 * (3 * e + mask) * h / r + (5 if model.is_gated else 3) * e * width
    if model.positions == "rope":
        qk = (h + model.kv_heads * model.head_dim) / t
        forward += 2 * e * qk
        backward += 2 * e * qk
    return clock.streamed(T * forward), clock.streamed(T * backward)


def layer_work(model: ModelSpec, plan: ParallelPlan, clock: KernelClock, fused_attention: bool, moe: bool,
               attention_scale: float = 1.0) -> LayerWork:
    """One block's work for one micro-batch on one tensor-parallel rank. Under context parallel ``model`` is a
    rank's share (s/cp positions) and ``attention_scale`` = cp: its queries attend to all s keys."""
    e = activation_bytes_per_element(plan.precision)
    fwd_gemm, dx_gemm, dw_gemm = _passes(layer_gemms(model, plan, moe), clock, e)
    attention_fwd, attention_bwd = _attention(model, plan, clock, e, fused_attention, attention_scale)
    ffn = model.moe_ffn * model.top_k + model.shared_expert_ffn if moe else model.ffn
    elem_fwd, elem_bwd = _elementwise(model, plan, clock, e, ffn)
    forward = Work(gemm=fwd_gemm, elementwise=elem_fwd) + attention_fwd
    backward = Work(gemm=dx_gemm + dw_gemm, elementwise=elem_bwd) + attention_bwd
    ckpt = plan.activation_checkpointing
    recompute = forward if ckpt == "full" else (attention_fwd if ckpt == "selective" else Work())
    return LayerWork(forward, backward, recompute, dw_gemm)


def head_work(model: ModelSpec, plan: ParallelPlan, clock: KernelClock, loss_bytes: int) -> Work:
    """The output norm, the vocabulary-parallel head and the loss for one micro-batch on the last stage: the head's
    GEMMs, and the logits streamed as the loss casts them to ``loss_bytes``, takes their softmax and writes its
    gradient back."""
    e = activation_bytes_per_element(plan.precision)
    T, h = plan.micro_batch * model.seq_len, model.d_model
    vocab = -(-model.vocab_size // plan.tp)
    gemm = sum(clock.gemm(g, e) for g in linear_gemms("head", T, vocab, h))
    logits = T * vocab * (e + loss_bytes + 2 * loss_bytes + loss_bytes + e)   # cast, softmax, gradient, cast back
    norm = T * h * (2 * e + 3 * e) / (plan.tp if plan.sequence_parallel else 1)
    return Work(gemm=gemm, elementwise=clock.streamed(logits + norm))
