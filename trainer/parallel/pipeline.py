"""Pipeline parallel with torch.distributed.pipelining: the blocks are cut into pp·v contiguous stages.

Stage s holds the blocks ``trainer.contract.stages.stage_layer_ranges`` gives it: L/(pp·v) each by default, or the
plan's own layout (``stage_layers``, or Megatron-LM's lighter first and last stages), in model order; the first stage
also holds the embedding, the last the final norm and LM head. Stages of unequal size change nothing else: each
PipelineStage learns its input and output shapes from its own module, and names stay those of the whole model.
Rank r of the pp group holds stage r (v = 1) or stages r, r+pp, …, r+(v−1)·pp (interleaved, "looped" placement).
One step feeds m = grad_accum micro-batches through the stages:
- GPipe: all m forwards, then all m backwards; up to m micro-batches' activations in flight.
- 1F1B: after a warm-up of pp−1−r forwards, alternate one forward and one backward: at most pp in flight.
  Both idle (p−1)/(m+p−1) of the step (the bubble).
- Interleaved 1F1B: v smaller chunks per rank cut the bubble to (p−1)/(v·m) for more point-to-point messages.
- Zero bubble (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): backward splits into the gradient of the
  inputs (I), which the previous stage waits for, and that of the weights (W), which nobody waits for and so fills
  what would be idle. With forward, input-backward and weight-backward alike, zb-interleaved (ZB-1P, looped
  placement, any v) idles a third of what interleaved 1F1B does, (p−1)/(3·v·m), holding p micro-batches on every
  rank; zbv (ZB-V) and dualpipev (DeepSeek-V3's DualPipe folded onto p ranks) place two chunks per rank in a V —
  rank r holds stages r and 2p−1−r, so the first rank also runs the last stage — for (p−1)/(6·m).
The schedule averages gradients over the m micro-batches (scale_grads) so that the loss function returns a
micro-batch mean, as without pipelining.
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from trainer.contract.schedules import V_SCHEDULES
from trainer.model import GPT
from trainer.planner.schedule import schedule_orders

# By name, so that a torch without the newer schedules still runs the others (and says which one it lacks).
SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
                    "zb-interleaved": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
                    "dualpipev": "ScheduleDualPipeV"}
SINGLE_STAGE = ("gpipe", "1f1b")  # schedules that take a rank's one stage, not a list of its stages


def stage_ids(pp_rank: int, pp: int, virtual_stages: int, schedule: str = "1f1b") -> list[int]:
    """The stages pipeline rank ``pp_rank`` holds: looped (r, r+p, …), or r and 2p−1−r in a V."""
    if schedule in V_SCHEDULES:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + i * pp for i in range(virtual_stages)]


def split_stage(full: GPT, stage: int, layers: tuple[range, ...]) -> GPT:
    """A copy of ``full`` keeping only what stage ``stage`` computes, of the stages whose block indices are
    ``layers`` (``stage_layer_ranges``: one range a stage, in model order); parameter names unchanged."""
    model = copy.deepcopy(full)
    n_stages = len(layers)
    keep = {str(i) for i in layers[stage]}
    for name in list(model.layers.keys()):
        if name not in keep:
            del model.layers[name]
    if stage != 0:
        model.embed = None
    if stage != n_stages - 1:
        model.norm = None
        model.head = None
    return model


def schedule_class(kind: str) -> type:
    """torch's class for the schedule ``kind``. torch.distributed.pipelining is imported here: it costs every rank
    almost a second, and only a pipeline needs it."""
    from torch.distributed import pipelining

    cls = getattr(pipelining, SCHEDULE_CLASSES[kind], None)
    if cls is None:
        raise RuntimeError(f"the {kind!r} pipeline schedule needs torch.distributed.pipelining."
                           f"{SCHEDULE_CLASSES[kind]}, which torch {torch.__version__} does not have; choose another "
                           f"pipeline_schedule or a newer torch")
    return cls


def build_schedule(kind: str, stage_modules: list[nn.Module], ids: list[int], n_stages: int, n_microbatches: int,
                   loss_fn: Callable, pp_group, device: torch.device):
    from torch.distributed.pipelining import PipelineStage

    stages = [PipelineStage(module, stage_index=i, num_stages=n_stages, device=device, group=pp_group)
              for module, i in zip(stage_modules, ids)]
    return schedule_class(kind)(stages[0] if kind in SINGLE_STAGE else stages, n_microbatches=n_microbatches,
                                loss_fn=loss_fn, scale_grads=True)


class TiedEmbeddingSync:
    """Keep the token embedding (first stage) and the LM head (last stage) one matrix across a pipeline.

    Both stages start from the same seeded values (they were one tensor before the split). After backward the two
    gradients are summed, giving both the gradient of the tied weight, dL/dE = dL/dE|lookup + dL/dE|head; identical
    updates then keep them equal (Megatron-LM's embedding group). Where the two stages sit on different ranks the
    sum is an all-reduce over a group of exactly those two ranks (one group per (dp, tp) coordinate, so that
    tensor-parallel and FSDP shards meet their counterparts); under a V-shaped schedule the first rank holds both
    (``partner``: its copy of the head) and the sum is local. The head's copy is left out of the gradient norm so
    that the weight counts once.
    """

    def __init__(self, param: nn.Parameter | None, group, is_duplicate: bool, partner: nn.Parameter | None = None):
        self.param, self.group, self.is_duplicate, self.partner = param, group, is_duplicate, partner

    @property
    def norm_duplicate(self) -> nn.Parameter | None:
        """The copy of the tied weight on this rank that the gradient norm must not count again."""
        return self.partner if self.partner is not None else (self.param if self.is_duplicate else None)

    def __call__(self) -> None:
        if self.param is None or self.param.grad is None:
            return
        grad = _in_own_placement(self.param)
        if self.partner is not None:
            other = _in_own_placement(self.partner)
            local, other_local = (g.to_local() if isinstance(g, DTensor) else g for g in (grad, other))
            local.add_(other_local)
            other_local.copy_(local)
            return
        dist.all_reduce(grad.to_local() if isinstance(grad, DTensor) else grad, group=self.group)


def _in_own_placement(param: nn.Parameter) -> torch.Tensor:
    """``param.grad``, brought to the weight's own shards: DTensor's embedding backward leaves a replicated
    gradient, and the two copies must add and travel as tensors of one shape."""
    grad = param.grad
    if isinstance(grad, DTensor) and grad.placements != param.placements:
        grad = grad.redistribute(grad.device_mesh, param.placements)
        param.grad = grad
    return grad


def tied_embedding_sync(modules: list[GPT], mesh, pp: int, schedule: str) -> TiedEmbeddingSync:
    """Find this rank's copies of the tied weight; create the first/last-stage groups unless a V-shaped schedule
    puts both ends on one rank. For each (dp, cp, tp) position of the mesh the group holds the ranks at both ends of
    its pp dimension (every rank must take part in creating every group)."""
    embed = next((m.embed.tokens.weight for m in modules if m.embed is not None), None)
    head = next((m.head.weight for m in modules if m.head is not None), None)
    if schedule in V_SCHEDULES:
        return TiedEmbeddingSync(embed, None, False, partner=head)
    grid = mesh.mesh.reshape(pp, -1)  # (pp, dp, cp, tp) tensor of global ranks: one column per (dp, cp, tp)
    me = dist.get_rank()
    mine = None
    for column in range(grid.size(1)):
        ranks = [int(grid[0, column]), int(grid[pp - 1, column])]
        group = dist.new_group(ranks)
        if me in ranks:
            mine = group
    if embed is not None:
        return TiedEmbeddingSync(embed, mine, False)
    return TiedEmbeddingSync(head, mine, head is not None)


_COMPUTE_KINDS = ("F", "B", "I", "W")


def schedule_record(schedule, kind: str, pp: int, pp_rank: int, virtual_stages: int, n_microbatches: int) -> dict:
    """The schedule's own order of compute actions for every pipeline rank, as ``[kind, stage, micro-batch]``
    lists (F forward, B full backward, I backward for inputs, W backward for weights): what an ideal run of the
    plan does, for a timeline to set the measured one beside. An overlapped forward-and-backward (dualpipev) counts
    as its two parts in order; sends, receives and gradient reductions are left out."""

    def compute(action) -> list[list]:
        if action is None:
            return []
        if action.sub_actions:
            return [part for sub in action.sub_actions for part in compute(sub)]
        kind_ = action.computation_type.value
        return [[kind_, action.stage_index, action.microbatch_index]] if kind_ in _COMPUTE_KINDS else []

    if kind in SINGLE_STAGE:
        # GPipe and 1F1B run a loop of their own, not their ``pipeline_order`` (which, for 1F1B, is off by one
        # micro-batch on the last rank): record the order the loop runs
        order = {str(rank): [list(action) for action in actions]
                 for rank, actions in schedule_orders(kind, pp, n_microbatches).items()}
    else:
        order = {str(rank): [part for action in actions for part in compute(action)]
                 for rank, actions in sorted((schedule.pipeline_order or {}).items())}
    return {"schedule": kind, "pp": pp, "pp_rank": pp_rank, "stages_per_rank": virtual_stages,
            "microbatches": n_microbatches, "order": order}
