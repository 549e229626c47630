"""The device mesh and its process groups, as one explicit object (never module globals).

Ranks are laid out as a (pp, dp, cp, tp) grid with tp innermost: tensor-parallel partners are neighbouring ranks,
which on a GPU cluster means the same node (NVLink), where its per-layer all-reduces belong; context-parallel
partners come next, their K/V ring per layer the next most frequent traffic. rank = ((stage·dp + d)·cp + c)·tp + j.
Every group a rank talks to is a dimension of this mesh, or of a view of it: expert parallel splits dp into
(edp, ep); the gradient average runs over dp and cp flattened into one dimension ("dp_cp"), since the cp ranks of
one sequence, like dp replicas, each hold a share of the batch's tokens and whole copies of the weights.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainer.contract import ParallelPlan


@dataclass
class Topology:
    """Where this rank sits in the (pp, dp, cp, tp) grid, with the groups it talks to."""

    mesh: DeviceMesh
    device: torch.device
    rank: int
    world_size: int
    dp: int
    tp: int
    pp: int
    cp: int = 1

    @property
    def dp_mesh(self) -> DeviceMesh:
        return self.mesh["dp"]

    @cached_property
    def replica_mesh(self) -> DeviceMesh:
        """The ranks gradients are averaged over: dp, or dp × cp flattened when the sequence is shared (FSDP2
        shards over it, DDP and the flat average reduce over its group)."""
        if self.cp == 1:
            return self.mesh["dp"]
        return self.mesh["dp", "cp"]._flatten("dp_cp")

    @property
    def replica_group(self):
        return self.replica_mesh.get_group()

    @property
    def replicas(self) -> int:
        """dp·cp: ranks holding the same weights and different tokens."""
        return self.dp * self.cp

    @property
    def cp_group(self):
        return self.mesh.get_group("cp")

    @property
    def cp_rank(self) -> int:
        return self.mesh.get_local_rank("cp")

    @property
    def tp_mesh(self) -> DeviceMesh:
        return self.mesh["tp"]

    @property
    def dp_group(self):
        return self.mesh.get_group("dp")

    @property
    def pp_group(self):
        return self.mesh.get_group("pp")

    @property
    def dp_rank(self) -> int:
        return self.mesh.get_local_rank("dp")

    @property
    def pp_rank(self) -> int:
        return self.mesh.get_local_rank("pp")

    def expert_mesh(self, ep: int) -> DeviceMesh:
        """The same ranks as (pp, edp, ep, tp): dp rank d = edp_rank · ep + ep_rank."""
        return self.mesh._unflatten("dp", (self.dp // ep, ep), ("edp", "ep"))


def init_distributed(timeout_s: float = 600.0) -> tuple[int, int, torch.device]:
    """Join the job's process group: NCCL on CUDA, gloo on the CPU. Works under torchrun, under srun (SLURM_*
    variables), and alone (a world of one, no launcher needed)."""
    # srun's tasks, one a rank (a single task is a world of one, which needs no rendezvous)
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
        os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    if not dist.is_initialized():
        if "RANK" in os.environ:
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s),
                                    device_id=device if cuda else None)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), device


def build_topology(plan: ParallelPlan, device: torch.device) -> Topology:
    world = dist.get_world_size()
    if world != plan.world_size:
        raise RuntimeError(f"the plan needs dp×cp×tp×pp={plan.dp}×{plan.cp}×{plan.tp}×{plan.pp}={plan.world_size} "
                           f"processes but this job has {world}: launch with --nproc_per_node={plan.world_size}")
    mesh = init_device_mesh(device.type, (plan.pp, plan.dp, plan.cp, plan.tp), mesh_dim_names=("pp", "dp", "cp", "tp"))
    return Topology(mesh=mesh, device=device, rank=dist.get_rank(), world_size=world,
                    dp=plan.dp, tp=plan.tp, pp=plan.pp, cp=plan.cp)
