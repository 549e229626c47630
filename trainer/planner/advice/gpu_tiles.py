"""What the matmul-shape model needs to know of each GPU the contract names: streaming multiprocessors and the
16-bit tensor-core GEMM tiles (docs/advice.md, The matmul-shape model).

SM counts are the vendors' figures (A100 SXM: 108; H100 SXM and H200 SXM, the same GH100 configuration: 132).
The tile is the thread-block output tile cuBLAS favours for large 16-bit GEMMs, 256 × 128, the one NVIDIA's
"Matrix Multiplication Background User's Guide" uses in its wave-quantization example; K is consumed in slabs of
128 bytes (64 16-bit elements), the multiple the guide recommends on A100 and later, and a dimension that is not a
multiple of 16 bytes (8 16-bit elements) keeps a GEMM off the aligned tensor-core path. The CPU "device" has no
such figures: the advice leaves its matmuls at the planner's own efficiency.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuTiles:
    """A GPU's GEMM geometry. ``unaligned_efficiency`` is the rate, relative to an aligned GEMM, of one with a
    dimension that is not a multiple of ``align_bytes``: 0.5 is what reproduces the ~25 % that padding GPT-2's
    vocabulary to 50,304 was reported to save on A100s (docs/advice.md, Sources); no vendor figure exists."""

    name: str
    sms: int
    tile_m: int = 256
    tile_n: int = 128
    k_slab_bytes: int = 128
    align_bytes: int = 16
    unaligned_efficiency: float = 0.5


GPU_TILES: dict[str, GpuTiles] = {t.name: t for t in (
    GpuTiles("A100-SXM-80GB", sms=108),
    GpuTiles("H100-SXM", sms=132),
    GpuTiles("H200-SXM", sms=132),
)}


def tiles_for(gpu_name: str) -> GpuTiles | None:
    """The tile figures of a named GPU; None for the CPU device and for GPUs given only by their figures."""
    return GPU_TILES.get(gpu_name)
