"""One (model, plan) on the cluster as the four figures a suggestion compares: step time, peak memory per GPU, MFU
and tokens/s.

The planner (``estimate.core.Planner``) gives them; the advice then refines the compute term by the matmul shapes
(``gemms.shape_efficiency``) relative to the model it was asked about:

    compute' = compute · E_shape(asked) / E_shape(variant)
    step'    = the planner's step with compute' in place of compute, its pipeline bubble following the micro-batch's
               work (``StepTime.with_compute_scaled``)

so the asked-about model's figures are the planner's own, and a variant's differ from the planner's by its shapes
alone. Without tile figures (the CPU device) E_shape is 1 and every figure is the planner's. Where the planner
costs compute kernel by kernel (``EstimateOptions.compute_model`` "kernels" on a GPU with measured rates) its figures
already follow the shapes and are taken as they are.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan
from trainer.planner.estimate.gpu_kernels import kernels_for
from trainer.planner.estimate.gemms import shape_efficiency
from trainer.planner.estimate import flops as F
from trainer.planner.estimate.core import Planner
from trainer.planner.estimate.options import EstimateOptions
from trainer.planner.estimate.params import count
from trainer.planner.estimate.step_model import TOKENS_PER_S

GB = 1e9


@dataclass(frozen=True)
class Figures:
    model: ModelSpec
    plan: ParallelPlan
    step_time_s: float
    planner_step_time_s: float        # before the shape refinement
    peak_memory_bytes: float          # as expected
    peak_high_bytes: float            # at the most: what "fits" is decided by
    capacity_bytes: float
    mfu: float
    tokens_per_s: float
    shape_efficiency: float
    parameters: int
    model_flops_per_token: int

    @property
    def fits(self) -> bool:
        return self.peak_high_bytes <= self.capacity_bytes

    @property
    def memory_left_bytes(self) -> float:
        return self.capacity_bytes - self.peak_memory_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"step_time_s": self.step_time_s, "planner_step_time_s": self.planner_step_time_s,
                "peak_memory_bytes": self.peak_memory_bytes, "peak_memory_gb": self.peak_memory_bytes / GB,
                "peak_high_bytes": self.peak_high_bytes,
                "capacity_bytes": self.capacity_bytes, "fits": self.fits, "mfu": self.mfu,
                "tokens_per_s": self.tokens_per_s, "shape_efficiency": self.shape_efficiency,
                "parameters": self.parameters, "model_flops_per_token": self.model_flops_per_token,
                "plan": self.plan.to_dict()}


class Assessor:
    """Figures of variants of one model on one cluster, each refined against the asked-about model's shapes."""

    def __init__(self, model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec,
                 options: EstimateOptions | None = None):
        self.cluster, self.options = cluster, options or EstimateOptions()
        self.tiles = kernels_for(cluster.gpu.name)
        self.reference_efficiency = shape_efficiency(model, plan, self.tiles).value
        self._planners: dict[ModelSpec, Planner] = {}

    def planner(self, model: ModelSpec) -> Planner:
        hit = self._planners.get(model)
        if hit is None:
            hit = self._planners[model] = Planner(model, self.cluster, self.options)
        return hit

    def figures(self, model: ModelSpec, plan: ParallelPlan) -> Figures:
        planner = self.planner(model)
        numbers = planner.evaluate(plan)
        efficiency = shape_efficiency(model, plan, self.tiles).value
        # the planner's kernel-by-kernel compute already follows the shapes: refine only its FLOPs model
        scale = 1.0 if planner.clock else self.reference_efficiency / efficiency
        step = numbers.step_time.with_compute_scaled(scale)
        return Figures(model, plan, step, numbers.step_s, numbers.peak_bytes, numbers.peak_band.high,
                       numbers.capacity_bytes,
                       F.mfu(numbers.model_flops_per_step, step, self.cluster.gpu.peak_tflops, plan.world_size),
                       TOKENS_PER_S(plan.global_batch, model.seq_len, step), efficiency, count(model).total,
                       planner.model_flops_per_token)
