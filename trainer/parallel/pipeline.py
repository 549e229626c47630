"""Pipeline parallel with torch.distributed.pipelining: the blocks are cut into pp·v contiguous stages.

Stage s holds blocks [s·L/(pp·v), (s+1)·L/(pp·v)); the first stage also holds the embedding, the last the final
norm and LM head. Rank r of the pp group holds stage r (v = 1) or stages r, r+pp, …, r+(v−1)·pp (interleaved,
"looped" placement). One step feeds m = grad_accum micro-batches through the stages:
- GPipe: all m forwards, then all m backwards; up to m micro-batches' activations in flight.
- 1F1B: after a warm-up of pp−1−r forwards, alternate one forward and one backward: at most pp in flight.
  Both idle (p−1)/(m+p−1) of the step (the bubble).
- Interleaved 1F1B: v smaller chunks per rank cut the bubble to (p−1)/(v·m) for more point-to-point messages.
The schedule averages gradients over the m micro-batches (scale_grads) so that the loss function returns a
micro-batch mean, as without pipelining.
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.tensor import DTensor

from trainer.model import GPT

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}


def stage_ids(pp_rank: int, pp: int, virtual_stages: int) -> list[int]:
    return [pp_rank + i * pp for i in range(virtual_stages)]


def split_stage(full: GPT, stage: int, n_stages: int) -> GPT:
    """A copy of ``full`` keeping only what stage ``stage`` of ``n_stages`` computes; parameter names unchanged."""
    model = copy.deepcopy(full)
    per = full.spec.n_layers // n_stages
    keep = {str(i) for i in range(stage * per, (stage + 1) * per)}
    for name in list(model.layers.keys()):
        if name not in keep:
            del model.layers[name]
    if stage != 0:
        model.embed = None
    if stage != n_stages - 1:
        model.norm = None
        model.head = None
    return model


def build_schedule(kind: str, stage_modules: list[nn.Module], ids: list[int], n_stages: int, n_microbatches: int,
                   loss_fn: Callable, pp_group, device: torch.device):
    stages = [PipelineStage(module, stage_index=i, num_stages=n_stages, device=device, group=pp_group)
              for module, i in zip(stage_modules, ids)]
    cls = SCHEDULES[kind]
    # Multi-stage schedules take every stage of the rank; the single-stage ones its one stage.
    return cls(stages if kind == "interleaved" else stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn,
               scale_grads=True)


class TiedEmbeddingSync:
    """Keep the token embedding (first stage) and the LM head (last stage) one matrix across a pipeline.

    Both stages start from the same seeded values (they were one tensor before the split). After backward the two
    gradients are summed over a group of exactly those two ranks (one group per (dp, tp) coordinate, so that
    tensor-parallel and FSDP shards meet their counterparts), giving both the gradient of the tied weight,
    dL/dE = dL/dE|lookup + dL/dE|head; identical updates then keep them equal (Megatron-LM's embedding group).
    The last stage's copy is left out of the gradient norm so that the weight counts once.
    """

    def __init__(self, param: nn.Parameter | None, group, is_duplicate: bool):
        self.param, self.group, self.is_duplicate = param, group, is_duplicate

    def __call__(self) -> None:
        if self.param is None or self.param.grad is None:
            return
        grad = self.param.grad
        if isinstance(grad, DTensor) and grad.placements != self.param.placements:
            # DTensor's embedding backward leaves a replicated gradient; bring it to the weight's own shards so
            # that both stages hand the group tensors of the same shape.
            grad = grad.redistribute(grad.device_mesh, self.param.placements)
            self.param.grad = grad
        dist.all_reduce(grad.to_local() if isinstance(grad, DTensor) else grad, group=self.group)


def tied_embedding_sync(modules: list[GPT], mesh, pp: int) -> TiedEmbeddingSync:
    """Create the first/last-stage groups: for each (dp, tp) position of the mesh, the ranks at both ends of its pp
    dimension (every rank must take part in creating every group)."""
    grid = mesh.mesh  # (pp, dp, tp) tensor of global ranks
    me = dist.get_rank()
    mine = None
    for d in range(grid.size(1)):
        for t in range(grid.size(2)):
            ranks = [int(grid[0, d, t]), int(grid[pp - 1, d, t])]
            group = dist.new_group(ranks)
            if me in ranks:
                mine = group
    param, duplicate = None, False
    for m in modules:
        if m.embed is not None:
            param = m.embed.tokens.weight
        elif m.head is not None:
            param, duplicate = m.head.weight, True
    return TiedEmbeddingSync(param, mine, duplicate)
