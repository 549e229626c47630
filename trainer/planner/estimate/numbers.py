"""The planner's results as named values: a stage's memory, a step's time, a plan's numbers, the tuner's summary.

``PlanNumbers`` is what ``Planner.evaluate`` gives (every named term); ``PlanSummary`` is what ``Planner.quick``
gives the tuner (the totals it ranks and rejects by). The types the tuner creates once per plan are slotted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from trainer.planner.estimate.comm import Collectives
from trainer.planner.estimate.memory import Band, Held, Saved
from trainer.planner.estimate.memory_model import ACTIVATIONS
from trainer.contract import ParallelPlan


# The step-time terms that are a micro-batch's work on its pipeline rank, in the order step time adds them: what the
# pipeline's bubble stretches (the estimate, its figures, calibration's features and the advice all read this)
IN_MICROBATCH = ("compute", "host_overhead", "expert_overhead", "tensor_parallel", "context_parallel",
                 "expert_all_to_all", "gradient_accumulation")


@dataclass
class StageMemory:
    stage: int
    params: int                    # parameters stored on the rank before data-parallel sharding
    params_sharded: int            # after ZeRO-3 / FSDP sharding
    states: dict[str, float]       # weights, gradients, optimizer, host
    activations_per_microbatch: dict[str, float]
    in_flight: float
    layers: int
    buffers: dict[str, float]
    overheads: dict[str, Band]     # what the GPU holds besides the tensors: named, each a range
    # the terms of ``memory_model`` the activations and buffers came from, with the numbers they took (the figures')
    activation_terms: dict[str, Held] = field(default_factory=dict)
    buffer_terms: dict[str, tuple[Saved, ...]] = field(default_factory=dict)   # each buffer the sum of its terms
    state_terms: dict[str, Saved] = field(default_factory=dict)                # weights, gradients, optimizer

    @property
    def overhead(self) -> float:
        """The overheads as expected."""
        return sum(band.expected for band in self.overheads.values())

    @property
    def activations(self) -> float:
        return ACTIVATIONS(self.in_flight, sum(self.activations_per_microbatch.values()))

    @property
    def model_state_bytes(self) -> float:
        s = self.states
        return s["weights"] + s["gradients"] + s["optimizer"]

    @property
    def total(self) -> float:
        """The peak as expected (``band`` gives its range)."""
        return self.band.expected

    @property
    def band(self) -> Band:
        """The peak at the least, as expected, at the most: the tensors plus each overhead's range."""
        tensors = Band.exact(self.model_state_bytes + self.activations + sum(self.buffers.values()))
        return sum(self.overheads.values(), tensors)


@dataclass(slots=True)
class StageStatic:
    """The parts of a stage's memory that do not depend on the global batch or the schedule (the tuner caches them):
    model states, activations of one micro-batch, buffers (bytes), and the rank's parameters before and after
    data-parallel sharding."""

    state_bytes: float
    activation_bytes_per_microbatch: float
    buffer_bytes: float
    params: int
    params_sharded: int


@dataclass(slots=True)
class StepTime:
    """One step's seconds by named part, with the FLOPs and the rates they came from."""

    parts: dict[str, float]            # compute, tensor_parallel, pipeline_bubble, … (seconds)
    seconds: float                     # their sum
    model_flops: float                 # per step, without recompute
    hardware_flops: float              # per step, with recompute
    efficiency: float                  # fraction of peak the compute term runs at
    bandwidths: Mapping[str, float]    # bytes/s of the tp, pp, dp and ep groups (shared between plans: read only)
    collectives: Collectives
    terms: dict[str, tuple]            # each part's step_model term and the numbers it took; their parts' too

    def with_compute_scaled(self, scale: float) -> float:
        """The step's seconds with its compute term × ``scale``: the pipeline bubble, a share of a micro-batch's
        work (``step_model.PIPELINE_BUBBLE``), follows it, called with the new work."""
        compute = self.parts.get("compute", 0.0)
        new_compute = compute * scale
        seconds = self.seconds - compute + new_compute
        if "pipeline_bubble" in self.parts:
            term, (work, bubble) = self.terms["pipeline_bubble"]
            seconds += term.function(work - compute + new_compute, bubble) - self.parts["pipeline_bubble"]
        return seconds


@dataclass
class PlanNumbers:
    plan: ParallelPlan
    stages: list[StageMemory]
    peak_stage: int
    peak_bytes: float
    peak_rank: int
    capacity_bytes: float
    step_time: StepTime

    @property
    def peak_band(self) -> Band:
        """The peak's range: of the stage whose high end is highest."""
        return max((st.band for st in self.stages), key=lambda band: band.high)

    @property
    def fits(self) -> bool:
        """Whether the plan fits however its overheads turn out: the high end of the peak's band."""
        return self.peak_band.high <= self.capacity_bytes

    @property
    def time(self) -> dict[str, float]:
        """Named seconds per step."""
        return self.step_time.parts

    @property
    def step_s(self) -> float:
        return self.step_time.seconds

    @property
    def model_flops_per_step(self) -> float:
        return self.step_time.model_flops

    @property
    def hardware_flops_per_step(self) -> float:
        return self.step_time.hardware_flops

    @property
    def efficiency(self) -> float:
        return self.step_time.efficiency

    @property
    def bandwidths(self) -> Mapping[str, float]:
        return self.step_time.bandwidths

    @property
    def collectives(self) -> dict[str, float]:
        """Collectives (messages) per step, by group."""
        return self.step_time.collectives.calls

    @property
    def latency_hops(self) -> dict[str, float]:
        """Ring steps those collectives take: α multiplies these."""
        return self.step_time.collectives.hops


@dataclass(slots=True)
class PlanSummary:
    """What ``Planner.quick`` gives the tuner: the totals of ``PlanNumbers`` without the named parts."""

    step_s: float
    peak_bytes: float
    peak_stage: int
    model_flops_per_step: float
    peak_state_bytes: float          # the peak stage's model states
    peak_activation_bytes: float     # and its activations in flight
    peak_high_bytes: float           # the high end of the peak's band: what "fits" is decided by
