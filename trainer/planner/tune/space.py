"""Every valid plan for a model, cluster and global batch, with counts of why the others are not.

The loops walk the choices in order (tp, pp, dp, micro-batch, sequence parallel, ep, engine/ZeRO/offload,
checkpointing, schedule/virtual stages) and apply, at the first level where they can fail, the same divisibility
rules as ``ParallelPlan.problems()`` and ``rules.check_plan`` — inline, because building and checking a spec object
per raw combination would dominate the search. What each engine and device refuses is asked of the contract itself,
once per (tp, sp, pp, precision), and what a pipeline schedule needs of the micro-batches once per plan.
tests/trainer/planner/test_plan_space.py checks that the tuner and the contract agree on whole grids, and
tests/trainer/test_plan_agreement.py on plans drawn by hypothesis.

Where a pipeline's stages cannot share the layers equally (126 layers on pp=16), the tuner tries Megatron-LM's
layout: the middle stages ⌈L/S⌉ layers each and the first and last stages the rest, a layer or a few lighter (Llama 3
405B: 7, fourteen stages of 8, 7), since they also hold the embedding and the head (``lighter_ends``).

Two choices are not enumerated because they change nothing: the pipeline schedule when pp = 1 (one plan with the
default '1f1b'), and ep > 1 for a dense model.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterator, get_args

from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan, SpecError
from trainer.contract.rules import check_plan, device_problems, engine_problems, pipeline_problems
from trainer.contract.schedules import LOOPED_SCHEDULES, V_SCHEDULES, Schedule
from trainer.contract.specjson import from_dict
from trainer.contract.specs import Checkpointing, Engine, Precision


# The most values a space or a tune may list (micro-batch sizes, global batches): each multiplies the search.
MAX_LISTED = 64


@functools.lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """Divisors of n in increasing order. Cached: the loops ask for the same few numbers many times."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


@dataclass(frozen=True)
class SearchSpace:
    """Which values each plan field may take. None: every value the model, cluster and batch allow."""

    precisions: tuple[str, ...] = ("bf16",)
    engines: tuple[str, ...] = ("native", "deepspeed")
    checkpointing: tuple[str, ...] = ("none", "selective", "full")
    schedules: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zb-interleaved", "zbv", "dualpipev")
    micro_batches: tuple[int, ...] | None = None
    max_micro_batch: int = 64
    max_virtual_stages: int = 8
    offload: bool = True
    sequence_parallel: tuple[bool, ...] = (False, True)
    # context parallel (cp > 1) is searched for sequences of at least this many tokens: below it a sequence's
    # activations rarely decide what fits, and the grid stays as large as it was
    cp_from_seq_len: int = 16384

    @classmethod
    def from_dict(cls, data: dict | None) -> "SearchSpace":
        """A space from JSON values (lists for the tuples), type-checked field by field; raises SpecError."""
        return from_dict(cls, dict(data or {})).validate()

    def problems(self) -> dict[str, list[str]]:
        p: dict[str, list[str]] = {}
        for name, kind in (("precisions", Precision), ("engines", Engine), ("checkpointing", Checkpointing),
                           ("schedules", Schedule)):
            allowed, values = get_args(kind), getattr(self, name)
            if not values or any(v not in allowed for v in values):
                p[name] = [f"{name}={list(values)} must be a non-empty list among {list(allowed)}"]
        if not self.sequence_parallel:
            p["sequence_parallel"] = ["sequence_parallel must list true, false or both"]
        if self.micro_batches is not None and (not self.micro_batches or min(self.micro_batches) < 1):
            p["micro_batches"] = [f"micro_batches={list(self.micro_batches)} must be positive integers"]
        elif self.micro_batches is not None and len(self.micro_batches) > MAX_LISTED:
            p["micro_batches"] = [f"give at most {MAX_LISTED} micro-batch sizes, got {len(self.micro_batches)}"]
        for name in ("max_micro_batch", "max_virtual_stages", "cp_from_seq_len"):
            if getattr(self, name) < 1:
                p[name] = [f"{name}={getattr(self, name)} must be at least 1"]
        return p

    def validate(self) -> "SearchSpace":
        problems = self.problems()
        if problems:
            raise SpecError(problems)
        return self


@functools.lru_cache(maxsize=4096)
def lighter_ends(n_layers: int, stages: int) -> tuple[int, int] | None:
    """Megatron-LM's uneven layout of ``n_layers`` over ``stages`` (S) pipeline stages, as (first_stage_layers,
    last_stage_layers): the S − 2 middle stages k = ⌈L/S⌉ layers each, the first and the last the L − (S−2)·k left
    (the last, which holds the head, the lighter by one when they are odd); None when the layers divide evenly or
    that leaves the ends no layer each."""
    if stages < 2 or n_layers % stages == 0:
        return None
    k = -(-n_layers // stages)
    rest = n_layers - (stages - 2) * k
    if rest < 2:
        return None
    return rest - rest // 2, rest // 2


@dataclass(frozen=True, slots=True)
class EngineChoice:
    engine: str
    zero_stage: int = 0
    offload_optimizer: bool = False
    offload_params: bool = False


def _candidate_engines(space: SearchSpace) -> list[EngineChoice]:
    """Every engine, ZeRO stage and offload combination the space names, in the order the tuner lists them."""
    out = [EngineChoice("native", 0), EngineChoice("native", 3)] if "native" in space.engines else []
    if "deepspeed" in space.engines:
        for zero in (0, 1, 2, 3):
            out.append(EngineChoice("deepspeed", zero))
            if space.offload:
                out += [EngineChoice("deepspeed", zero, offload_optimizer=True),
                        EngineChoice("deepspeed", zero, offload_optimizer=True, offload_params=True),
                        EngineChoice("deepspeed", zero, offload_params=True)]
    if "megatron" in space.engines:  # planning a Megatron-LM run: with and without its distributed optimizer
        out += [EngineChoice("megatron", 0), EngineChoice("megatron", 1)]
    return out


def _engine_choices(space: SearchSpace, model: ModelSpec, cluster: ClusterSpec, tp: int, sp: bool, pp: int,
                    precision: str, cp: int = 1) -> list[EngineChoice]:
    """The combinations the contract's engine rules allow for this tp, sp, pp and precision: asked of
    ``rules.engine_problems``, ``rules.check_plan`` and ``rules.device_problems`` themselves, once per distinct case,
    so the tuner holds no copy of what each engine refuses. Where pp does not divide the layers the probe carries
    the uneven layout the plans will have."""
    out = []
    ends = lighter_ends(model.n_layers, pp) if pp > 1 else None
    layout = dict(first_stage_layers=ends[0], last_stage_layers=ends[1]) if ends else {}
    for c in _candidate_engines(space):
        probe = ParallelPlan(tp=tp, pp=pp, cp=cp, sequence_parallel=sp, precision=precision, engine=c.engine,
                             zero_stage=c.zero_stage, offload_optimizer=c.offload_optimizer,
                             offload_params=c.offload_params, **layout)
        if not engine_problems(probe) and not check_plan(model, probe) and not device_problems(probe, cluster):
            out.append(c)
    return out


def _pp_cp(space: SearchSpace, model: ModelSpec, ranks: int, reject) -> Iterator[tuple[int, int]]:
    """(pp, cp) over the ``ranks`` left beside tp: every pp, and with it cp = 1, or for a long sequence
    (``cp_from_seq_len``) every cp whose 2·cp chunks divide it, for a model context parallel runs (dense, no
    dropout: ``rules.check_plan``)."""
    for pp in divisors(ranks):
        yield pp, 1
        if model.seq_len < space.cp_from_seq_len:
            continue
        for cp in divisors(ranks // pp)[1:]:
            if model.seq_len % (2 * cp):
                reject("cp: 2·cp does not divide seq_len")
            elif model.is_moe or model.dropout > 0:
                reject("context parallel runs dense models without dropout")
            else:
                yield pp, cp


def enumerate_plans(model: ModelSpec, cluster: ClusterSpec, global_batch: int, space: SearchSpace | None = None,
                    rejected: dict[str, int] | None = None) -> Iterator[ParallelPlan]:
    """Yield each valid plan once; add to ``rejected`` (reason → pruned choices) what the rules cut away."""
    space = space or SearchSpace()
    rejected = rejected if rejected is not None else {}

    def reject(reason: str, n: int = 1):
        rejected[reason] = rejected.get(reason, 0) + n

    world, gpn = cluster.world_size, cluster.gpus_per_node
    moe = model.is_moe
    engines: dict[tuple, list[EngineChoice]] = {}  # engine choices per (tp, sp, pp, precision)
    for tp in divisors(world):
        if tp > gpn:
            reject("tp spans nodes (tp > gpus_per_node)")
            continue
        widths = (model.ffn, model.moe_ffn, model.shared_expert_ffn) if moe else (model.ffn,)
        if tp > 1 and (model.n_heads % tp or any(w % tp for w in widths) or
                       (model.kv_heads != model.n_heads and model.kv_heads % tp)):
            reject("tp does not divide heads or an MLP's width (dense, expert or shared expert)")
            continue
        for pp, cp in _pp_cp(space, model, world // tp, reject):
            if pp > 1 and model.n_layers % pp and lighter_ends(model.n_layers, pp) is None:
                reject("pp does not divide n_layers, nor leave lighter first and last stages")
                continue
            dp = world // (tp * pp * cp)
            if global_batch % dp:
                reject("global batch not divisible by dp")
                continue
            per_rank = global_batch // dp
            mbs = space.micro_batches or tuple(d for d in divisors(per_rank) if d <= space.max_micro_batch)
            for b in mbs:
                if per_rank % b:
                    reject("global batch not divisible by micro_batch × dp")
                    continue
                for sp in space.sequence_parallel:
                    if sp and (tp == 1 or (model.seq_len // cp) % tp):
                        if tp > 1:
                            reject("sequence parallel: tp does not divide seq_len")
                        continue
                    for ep in (divisors(dp) if moe else (1,)):
                        if moe and model.n_experts % ep:
                            reject("ep does not divide n_experts")
                            continue
                        for precision in space.precisions:
                            key = (tp, sp, pp, precision, cp)
                            if key not in engines:
                                engines[key] = _engine_choices(space, model, cluster, tp, sp, pp, precision, cp)
                            for c in engines[key]:
                                if ep > 1 and c.engine == "native" and c.zero_stage == 3:
                                    reject("FSDP2 does not shard experts spread by ep > 1")
                                    continue
                                for ckpt in space.checkpointing:
                                    yield from _schedules(space, model, pp, reject, dict(
                                        dp=dp, cp=cp, tp=tp, pp=pp, micro_batch=b, global_batch=global_batch,
                                        sequence_parallel=sp, ep=ep, engine=c.engine, zero_stage=c.zero_stage,
                                        activation_checkpointing=ckpt, precision=precision,
                                        offload_optimizer=c.offload_optimizer, offload_params=c.offload_params))


def _schedules(space: SearchSpace, model: ModelSpec, pp: int, reject, fields: dict):
    if pp == 1:
        yield ParallelPlan(**fields)
        return
    for schedule in space.schedules:
        if fields["engine"] == "deepspeed" and schedule != "1f1b":
            continue
        for v in _virtual_stages(space, model, pp, schedule, reject):
            ends = lighter_ends(model.n_layers, pp * v)  # v is the chunks a rank under every schedule listing v > 1
            layout = dict(first_stage_layers=ends[0], last_stage_layers=ends[1]) if ends else {}
            plan = ParallelPlan(pipeline_schedule=schedule, virtual_stages=v, **fields, **layout)
            if pipeline_problems(plan):  # what the schedule needs of m, asked of the contract
                reject(f"{schedule} schedule: too few micro-batches, or not in equal rounds")
                break
            yield plan


def _virtual_stages(space: SearchSpace, model: ModelSpec, pp: int, schedule: str, reject) -> list[int]:
    """Model chunks per rank worth trying: interleaved needs v ≥ 2, zb-interleaved takes any v, the V-shaped
    schedules exactly 2, the others 1. pp·v must divide the layers, or leave lighter first and last stages
    (``lighter_ends``)."""
    L = model.n_layers
    if schedule in LOOPED_SCHEDULES:
        least = 2 if schedule == "interleaved" else 1
        return [v for v in range(least, space.max_virtual_stages + 1)
                if L % (pp * v) == 0 or lighter_ends(L, pp * v)]
    if schedule in V_SCHEDULES:
        if L % (2 * pp) and lighter_ends(L, 2 * pp) is None:
            reject(f"{schedule} schedule: two chunks a rank need pp·2 to divide n_layers, or to leave lighter "
                   f"first and last stages")
            return []
        return [2]
    return [1]
