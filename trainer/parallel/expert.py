"""Expert parallel groups: the dp ranks of each (pp, tp) position split as (edp, ep), ep innermost.

Data-parallel rank d = edp_rank · ep + ep_rank. The ep ranks of one group hold different experts (E/ep each) and
exchange tokens; the edp ranks hold copies of the same experts and reduce their gradients. Built from a second
device mesh over the same ranks as ``Topology.mesh``, so the groups are objects handed to the layers, not globals.
"""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh

from trainer.moe import ExpertParallel
from trainer.contract import ParallelPlan


def build_expert_parallel(plan: ParallelPlan, device: torch.device) -> ExpertParallel:
    edp = plan.dp // plan.ep
    mesh = init_device_mesh(device.type, (plan.pp, edp, plan.ep, plan.tp), mesh_dim_names=("pp", "edp", "ep", "tp"))
    return ExpertParallel(ep=plan.ep, ep_rank=mesh.get_local_rank("ep"), ep_group=mesh.get_group("ep"),
                          edp=edp, edp_group=mesh.get_group("edp"))
