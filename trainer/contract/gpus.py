"""Accelerators by name, as plain figures. Standard library only, and free of the specs, so that a spec given a GPU
by name (``"gpu": "H100-SXM"``) can look it up.

Dense bf16 peak in TFLOP/s and memory bandwidth in GB/s are the vendors' datasheet numbers (docs/formulas.md, Hardware
peaks). Memory is in GB (10^9 bytes) as the driver reports it (nvidia-smi's total): a datasheet's "80GB" is 80 GiB
of HBM, of which the driver shows nearly all, 85.9 GB on an A100 and 85.5 GB on an H100. ``nvlink_gbs`` is the
NVLink bandwidth per GPU in one direction (half the datasheet's bidirectional figure); a preset cluster takes it as
its intra-node bandwidth.
"""
from __future__ import annotations

# memory: 81,920, 81,559, 143,771 and 183,359 MiB (nvidia-smi); the MI300X's 192 GiB
GPU_FIGURES: dict[str, dict[str, float]] = {
    "A100-SXM-80GB": dict(memory_gb=85.9, peak_tflops=312, memory_bandwidth_gbs=2039, nvlink_gbs=300.0),
    "H100-SXM": dict(memory_gb=85.52, peak_tflops=989, memory_bandwidth_gbs=3350, nvlink_gbs=450.0),
    "H200-SXM": dict(memory_gb=150.76, peak_tflops=989, memory_bandwidth_gbs=4800, nvlink_gbs=450.0),
    "B200": dict(memory_gb=192.27, peak_tflops=2250, memory_bandwidth_gbs=7700, nvlink_gbs=900.0),
    # Infinity Fabric: 7 links of 64 GB/s each way to the other GPUs of an 8-GPU node
    "MI300X": dict(memory_gb=206.16, peak_tflops=1307, memory_bandwidth_gbs=5300, nvlink_gbs=448.0),
    # A CPU "device" for local runs: figures of the order of one core, so MFU on CPU is a number, not a claim.
    "cpu": dict(memory_gb=24, peak_tflops=0.1, memory_bandwidth_gbs=20, nvlink_gbs=10.0),
}

# InfiniBand NDR at 400 Gb/s per GPU: what a preset cluster assumes between nodes unless told otherwise.
PRESET_INTER_NODE_GBS = 50.0


def gpu_fields(name: str) -> dict[str, float | str]:
    """The GPUSpec fields of a named GPU (KeyError for an unknown name)."""
    figures = GPU_FIGURES[name]
    return {"name": name, **{k: v for k, v in figures.items() if k != "nvlink_gbs"}}
