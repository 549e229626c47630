"""The DeepSpeed engine: ZeRO 1–3 (optional CPU offload), DeepSpeed's pipeline, activation checkpointing and MoE.

``train_step``: the learning rate from the loop on the client AdamW → this rank's micro-batches (the loop's sampler,
so both engines see the same data) → per micro-batch forward, ``engine.backward`` (which divides by the accumulation
steps) and ``engine.step`` (DeepSpeed reduces, clips and updates only at the accumulation boundary), or
``train_batch`` through the pipeline schedule → what DeepSpeed did (norm, applied, loss scale), read back. The model
is the native GPT (MoE layers swapped for DeepSpeed's), so parameter names, initial weights and the consolidated
checkpoint match the native engine's.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Optional

import deepspeed
import deepspeed.ops
import torch
import torch.distributed as dist
from deepspeed.utils import groups

from trainer.contract import RunSpec
from trainer.contract.manifest import FORMAT_DEEPSPEED, CheckpointManifest
from trainer.contract.records import Event
from trainer.contract.runfolder import write_json_atomic
from trainer.engine.base import Backward, Description, MicroBatches, StepResult
from trainer.engine.runfiles import RunFiles
from trainer.engine.deepspeed import checkpoint
from trainer.engine.deepspeed.config import CONFIG_FILE, deepspeed_config
from trainer.engine.deepspeed.flops_check import profile_forward_flops
from trainer.engine.deepspeed.layers import (apply_deepspeed_ac, apply_deepspeed_moe, aux_loss,
                                             optimizer_param_groups, routing_stats)
from trainer.engine.deepspeed.memory import engine_state_bytes
from trainer.engine.deepspeed.pipeline import build_pipeline
from trainer.model import build_model, loss_fn
from trainer.parallel.expert import routing_metrics
from trainer.parallel.mesh import init_distributed
from trainer.planner.estimate.params import count
from trainer.profiling.memory import SavedActivations


def _tensors(micro: MicroBatches, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)) for x, y in micro]


class DeepSpeedEngine:
    checkpoint_format = FORMAT_DEEPSPEED

    def __init__(self, spec: RunSpec):
        self.spec = spec
        self.rank, self.world_size, self.device = _join()
        self.dp_rank = self.rank % spec.plan.dp  # dp innermost
        self.engine = None
        self.flops_check: Optional[dict] = None

    def build(self) -> None:
        """The seeded native model (DeepSpeed layers swapped in), the client AdamW, the config from the plan."""
        spec, plan = self.spec, self.spec.plan
        if self.world_size != plan.world_size:
            raise RuntimeError(f"the plan needs dp×pp={plan.dp}×{plan.pp}={plan.world_size} processes but this "
                               f"job has {self.world_size}: launch with --nproc_per_node={plan.world_size}")
        self.config = config = deepspeed_config(spec)
        groups.mpu = None  # an earlier engine in this process (tests, benchmarks) leaves its pipeline topology here
        if plan.pp > 1:
            model = build_pipeline(spec.model, plan.pp, spec.seed, loss_fn, plan.activation_checkpointing)
        else:
            model = build_model(spec.model, spec.seed, self.device)
            if self.rank == 0:  # on the plain module: inside a ZeRO-3 engine the profiler counts Linear MACs twice
                self.flops_check = profile_forward_flops(model, spec.model)
            if spec.model.is_moe:
                apply_deepspeed_moe(model, spec)
            if plan.activation_checkpointing != "none":
                apply_deepspeed_ac(model, plan.activation_checkpointing)
        if plan.activation_checkpointing != "none":
            _configure_checkpointing(config)
        opt = spec.optimizer
        optimizer = torch.optim.AdamW(optimizer_param_groups(model, opt.weight_decay), lr=opt.lr,
                                      betas=(opt.beta1, opt.beta2), eps=opt.eps)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config,
                                                    dist_init_required=False)

    def describe(self) -> Description:
        plan = self.spec.plan
        n_params = count(self.spec.model).total  # ZeRO-3 and the pipeline leave each rank a part; this is the whole
        return Description(
            {"engine": "deepspeed",
             "plan": {"dp": plan.dp, "tp": plan.tp, "pp": plan.pp, "zero_stage": plan.zero_stage},
             "device": str(self.device)},
            f"deepspeed ZeRO-{plan.zero_stage} dp={plan.dp} pp={plan.pp}; the model's {n_params:,} parameters on "
            f"{self.world_size} ranks; config {CONFIG_FILE}")

    def announce(self, files: RunFiles) -> None:
        """What only this engine records once built: the config it made, the flops profiler against the formula."""
        if self.rank != 0:
            return
        write_json_atomic(files.run_dir / CONFIG_FILE, self.config)
        if self.flops_check is not None:
            f = self.flops_check
            files.event(Event.FLOPS_CHECK, **f)
            files.log(f"flops profiler {f['profiler_flops']:.4g} vs formula {f['formula_flops']:.4g} per "
                      f"{f['tokens']} tokens (ratio {f['ratio']:.3f})")

    def seed(self, step: int) -> None:
        torch.manual_seed(hash((self.spec.seed, self.rank, step)) % (2 ** 63))

    def train_step(self, micro: MicroBatches, lr: float, measure: bool) -> StepResult:
        """Forward, backward and update are one call here: DeepSpeed steps inside its own loop (see the module's
        docstring), so the result is read from the engine afterwards."""
        engine = self.engine
        for group in engine.optimizer.param_groups:
            group["lr"] = lr
        passed = self._run_batch(micro, measure)
        state = {**engine_state_bytes(engine), "activations_bytes": passed.activations.bytes} if measure else None
        grad_norm, applied = float(engine.get_global_grad_norm() or 0.0), engine.was_step_applied()
        return StepResult(loss=self._mean_loss(passed.loss), grad_norm=grad_norm, applied=applied,
                          loss_scale=float(getattr(engine.optimizer, "cur_scale", 1.0)),
                          routing=routing_metrics(passed.routing), state_bytes=state)

    def _run_batch(self, micro: MicroBatches, measure: bool) -> Backward:
        """Forward, backward and DeepSpeed's update over this rank's micro-batches."""
        probe = SavedActivations(self.engine.module.parameters()) if measure else None
        if self.spec.plan.pp > 1:
            return self._pipeline_batch(micro, probe)
        return self._micro_batches(micro, probe)

    def _micro_batches(self, micro: MicroBatches, probe: Optional[SavedActivations]) -> Backward:
        """Forward, backward and ``engine.step`` per micro-batch; the probe sees the first one's forward. Losses are
        summed on the device: reading each one would wait for its backward."""
        engine, coef = self.engine, self.spec.model.aux_loss_coef
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        routing = None
        for i, (x, y) in enumerate(_tensors(micro, self.device)):
            with probe if probe is not None and i == 0 else contextlib.nullcontext():
                loss = loss_fn(engine(x), y)
                aux = aux_loss(engine.module)
                objective = loss if aux is None else loss + coef * aux
            routing = routing_stats(engine.module, routing)
            engine.backward(objective)
            engine.step()
            total += loss.detach().double()
        return Backward(loss=total / len(micro), routing=routing, activations=probe)

    def _pipeline_batch(self, micro: MicroBatches, probe: Optional[SavedActivations]) -> Backward:
        """DeepSpeed's 1F1B schedule runs every micro-batch, first and last stages read them; the probe sees every
        micro-batch this stage runs (not one, as elsewhere: the schedule cannot be entered per micro-batch from
        outside). The loss comes back averaged over the micro-batches and broadcast to every stage."""
        with probe if probe is not None else contextlib.nullcontext():
            loss = self.engine.train_batch(iter(_tensors(micro, self.device)))
        return Backward(loss=loss.detach().double(), activations=probe)

    def _mean_loss(self, local: torch.Tensor) -> float:
        if self.world_size > 1 and self.spec.plan.pp == 1:  # the pipeline engine already averaged and broadcast it
            local = local.clone()
            dist.all_reduce(local)
            local /= self.world_size
        return float(local)

    def pipeline_schedule_record(self) -> dict[str, Any] | None:
        return None  # DeepSpeed's pipeline engine runs its own 1F1B, whose order it does not expose

    def evaluate(self, batches: MicroBatches) -> float:
        """Mean validation loss; every rank evaluates every batch (ZeRO-3 gathers weights as it goes). A pipeline
        evaluates grad_accum micro-batches at a time (its schedule's unit)."""
        engine, tensors = self.engine, _tensors(batches, self.device)
        if self.spec.plan.pp > 1:
            group = self.spec.plan.grad_accum
            losses = [float(engine.eval_batch(iter(tensors[i:i + group]))) for i in range(0, len(tensors), group)]
            return sum(losses) / len(losses)
        engine.eval()
        try:
            with torch.no_grad():
                total = sum(float(loss_fn(engine(x), y)) for x, y in tensors)
        finally:
            engine.train()
        return total / len(tensors)

    def save(self, run_dir: Path, manifest: CheckpointManifest, keep: int) -> Path:
        return checkpoint.save(self.engine, run_dir, manifest, self.spec, keep)

    def load(self, folder: Path) -> CheckpointManifest:
        return checkpoint.load(self.engine, folder, self.rank, self.spec.plan, self.spec.model.to_dict())

    def load_weights(self, folder: Path) -> CheckpointManifest:
        return checkpoint.load_weights(self.engine, folder, self.spec)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.destroy()


def _join() -> tuple[int, int, torch.device]:
    """Join the process group (the native helper: gloo on the CPU), then hand it to deepspeed.comm.

    On the CPU, DeepSpeed's torch backend JIT-compiles a shared-memory all-reduce kernel (30–70 s) the first time it
    starts. Training on gloo never needs it, so the op is marked unavailable before DeepSpeed looks."""
    rank, world, device = init_distributed()
    if device.type == "cpu":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world))
    deepspeed.init_distributed(dist_backend="gloo" if device.type == "cpu" else "nccl", dist_init_required=False)
    return rank, world, device


def _configure_checkpointing(config: dict) -> None:
    """The config's activation_checkpointing section, handed over field by field: given the whole config,
    DeepSpeed re-checks its batch sizes against the world size, which is wrong under a pipeline (dp = world/pp)."""
    ac = config["activation_checkpointing"]
    deepspeed.checkpointing.configure(None, partition_activations=ac["partition_activations"],
                                      contiguous_checkpointing=ac["contiguous_memory_optimization"],
                                      checkpoint_in_cpu=ac["cpu_checkpointing"],
                                      synchronize=ac["synchronize_checkpoint_boundary"], profile=ac["profile"])
