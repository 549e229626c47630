"""Accelerators by name, as plain figures. Standard library only, and free of the specs, so that a spec given a GPU
by name (``"gpu": "H100-SXM"``) can look it up.

Memory in GB (10^9 bytes), dense bf16 peak in TFLOP/s and memory bandwidth in GB/s are the vendors' datasheet numbers
(docs/formulas.md, Hardware peaks). ``nvlink_gbs`` is the NVLink bandwidth per GPU in one direction (half the
datasheet's bidirectional figure); a preset cluster takes it as its intra-node bandwidth.
"""
from __future__ import annotations

GPU_FIGURES: dict[str, dict[str, float]] = {
    "A100-SXM-80GB": dict(memory_gb=80, peak_tflops=312, memory_bandwidth_gbs=2039, nvlink_gbs=300.0),
    "H100-SXM": dict(memory_gb=80, peak_tflops=989, memory_bandwidth_gbs=3350, nvlink_gbs=450.0),
    "H200-SXM": dict(memory_gb=141, peak_tflops=989, memory_bandwidth_gbs=4800, nvlink_gbs=450.0),
    # A CPU "device" for local runs: figures of the order of one core, so MFU on CPU is a number, not a claim.
    "cpu": dict(memory_gb=24, peak_tflops=0.1, memory_bandwidth_gbs=20, nvlink_gbs=10.0),
}

# InfiniBand NDR at 400 Gb/s per GPU: what a preset cluster assumes between nodes unless told otherwise.
PRESET_INTER_NODE_GBS = 50.0


def gpu_fields(name: str) -> dict[str, float | str]:
    """The GPUSpec fields of a named GPU (KeyError for an unknown name)."""
    figures = GPU_FIGURES[name]
    return {"name": name, **{k: v for k, v in figures.items() if k != "nvlink_gbs"}}
