"""What the step-time model needs to know of each GPU the contract names beyond its datasheet: the geometry of its
16-bit GEMMs and the share of the datasheet rates that real kernels sustain (docs/formulas.md, Kernel rates).

Geometry. SM counts are the vendors' figures (A100 SXM: 108; H100 SXM and H200 SXM, the same GH100 configuration:
132; B200: 148; MI300X: 304 compute units). The tile is the thread-block output tile cuBLAS favours for large 16-bit
GEMMs, 256 × 128, the one NVIDIA's "Matrix Multiplication Background User's Guide" uses in its wave-quantization
example; K is consumed in slabs of 128 bytes (64 16-bit elements), the multiple the guide recommends on A100 and
later, and a dimension that is not a multiple of 16 bytes (8 16-bit elements) keeps a GEMM off the aligned
tensor-core path. MI300X is given the same tile: AMD publishes no preferred tile, and its compute-unit count sets
the waves.

Rates, each a measurement, never fitted to a training run:
    gemm_fraction    the best 16-bit GEMM the vendor's library reaches over the dense datasheet peak: Bekman's
                     Maximum Achievable Matmul FLOPS (MAMF) table (ML Engineering, "Maximum Achievable Matmul
                     FLOPS comparison table", BF16): A100 SXM 271.2 of 312 TFLOP/s, H100 SXM 794.5 of 989 (the
                     table: "H200 is the same"), B200 SXM 1745 of 2250, MI300X 668.4 of 1300.
                     The tile, K and wave factors of ``gemms`` then take what a given shape loses below that.
    hbm_fraction     a streaming kernel's bandwidth over the datasheet's (BabelStream's triad, Deakin et al.,
                     as published for A100 and H100: about 0.9 of the datasheet figure; MI300X: about 0.8).
    flash_fraction   the fused attention kernel's rate, forward and backward together, over the dense peak, at
                     head dimension 128 and causal masking: FlashAttention-2 on A100 (Dao 2023, Fig. 4: about 190
                     of 312 TFLOP/s), FlashAttention-3 on H100 (Shah et al. 2024: about 0.55 of peak forward and
                     backward); H200 and B200 taken at H100's share, MI300X at the share AMD's CK kernels report
                     (about 0.4).
    layer_fraction   what a training step's kernels sustain back to back, over the sum of the rates above: the
                     benchmarks time one kernel alone at its best, a layer runs its GEMMs, attention and streaming
                     kernels one after another with the gaps between them. A100: Korthikanti et al. 2022, Table 4
                     measures one 22 B layer's forward (h 6144, s 2048, micro-batch 4, t = 8, no recompute) at 7.7 ms;
                     the kernel model gives 5.39 ms of kernels and 1.47 ms of all-reduces, so the kernels took
                     6.23 ms: 0.864 of the model's rates. The same figure then predicts the table's other rows
                     (docs/formulas.md, Against published runs). H100 and H200: the GPU check (docs/gpu-check.md)
                     measured gpt3-1.3b's layer GEMMs at 262 ms a step against 230 ms modelled: 0.878. B200 and
                     MI300X, unmeasured, are taken at Hopper's share.
The CPU "device" has none of these: its compute stays on the calibrated efficiency of ``EstimateOptions``.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuKernels:
    """A GPU's GEMM geometry and sustained rates. ``unaligned_efficiency`` is the rate, relative to an aligned GEMM,
    of one with a dimension that is not a multiple of ``align_bytes``: 0.5 is what reproduces the ~25 % that padding
    GPT-2's vocabulary to 50,304 was reported to save on A100s (docs/advice.md, Sources); no vendor figure exists.
    On Hopper (H100, H200) cuBLAS runs such a GEMM with a Turing-era kernel (``cutlass_75_…_align1``) instead of its
    sm90 ones: the GPU check measured GPT-3 1.3B's 50,257-wide head at 0.15 of an aligned GEMM's rate on an H200
    (docs/gpu-check.md)."""

    name: str
    sms: int
    gemm_fraction: float
    hbm_fraction: float
    flash_fraction: float
    tile_m: int = 256
    tile_n: int = 128
    k_slab_bytes: int = 128
    align_bytes: int = 16
    unaligned_efficiency: float = 0.5
    layer_fraction: float = 1.0


# 124 ms a step for the three head GEMMs (3 × 5.06 TFLOP) on an H200, against 0.803 × 989 TFLOP/s aligned
HOPPER_UNALIGNED = 0.15
A100_LAYER = 0.864   # Korthikanti et al. 2022, Table 4: (7.7 − 1.47) ms measured over 5.39 ms modelled
HOPPER_LAYER = 0.878   # the GPU check on an H200: 230 ms of layer GEMMs modelled over 262 ms measured

GPU_KERNELS: dict[str, GpuKernels] = {k.name: k for k in (
    GpuKernels("A100-SXM-80GB", sms=108, gemm_fraction=0.869, hbm_fraction=0.9, flash_fraction=0.6,
               layer_fraction=A100_LAYER),
    GpuKernels("H100-SXM", sms=132, gemm_fraction=0.803, hbm_fraction=0.9, flash_fraction=0.55,
               unaligned_efficiency=HOPPER_UNALIGNED, layer_fraction=HOPPER_LAYER),
    GpuKernels("H200-SXM", sms=132, gemm_fraction=0.803, hbm_fraction=0.9, flash_fraction=0.55,
               unaligned_efficiency=HOPPER_UNALIGNED, layer_fraction=HOPPER_LAYER),
    GpuKernels("B200", sms=148, gemm_fraction=0.776, hbm_fraction=0.9, flash_fraction=0.55,
               layer_fraction=HOPPER_LAYER),
    GpuKernels("MI300X", sms=304, gemm_fraction=0.514, hbm_fraction=0.8, flash_fraction=0.4,
               layer_fraction=HOPPER_LAYER),
)}


def kernels_for(gpu_name: str) -> GpuKernels | None:
    """The figures of a named GPU; None for the CPU device and for GPUs given only by their datasheet figures."""
    return GPU_KERNELS.get(gpu_name)
