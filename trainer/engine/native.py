"""The native engine: torch.distributed on one device mesh, the plan applied by ``trainer.parallel.parallelize``.

``train_step``: this rank's micro-batches forward and backward (``_forward_backward``: through the pipeline schedule
when pp > 1; DDP's and FSDP2's reductions skipped on all but the last micro-batch) → the dp gradient average where
DDP and FSDP2 do not do it → unscale (fp16) → global gradient norm over every shard and stage, clip → AdamW → clear
the gradients.
"""
from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from trainer.checkpoint.dcp import load_checkpoint, save_checkpoint
from trainer.checkpoint.weights import load_weights
from trainer.contract import RunSpec
from trainer.contract.manifest import FORMAT_DCP, CheckpointManifest
from trainer.engine.base import Backward, Description, MicroBatches, StepResult
from trainer.engine.runfiles import RunFiles
from trainer.engine.stragglers import ComputeClock
from trainer.model import loss_fn
from trainer.model.moe import aux_loss, moe_layers, step_stats
from trainer.optim import LossScaler, build_optimizer, set_lr
from trainer.parallel.clip import clip_grads_
from trainer.parallel.context import zigzag_slice
from trainer.parallel.expert import routing_metrics
from trainer.parallel.mesh import init_distributed
from trainer.parallel.parallelize import DTYPES, ParallelModel, parallelize
from trainer.parallel.pipeline import schedule_record
from trainer.planner.estimate.params import count
from trainer.profiling.memory import SavedActivations, gradient_bytes, model_state_bytes


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A loss computed under loss_parallel is a replicated DTensor; the value itself is its local tensor."""
    return t.to_local() if isinstance(t, DTensor) else t


def _tensor(batch, device: torch.device, cp: int = 1, cp_rank: int = 0) -> torch.Tensor:
    """A batch (B, T) of token ids on the device; under context parallel this rank's zig-zag share (B, T/cp) of it."""
    t = torch.from_numpy(batch)
    if cp > 1:
        t = zigzag_slice(t, cp, cp_rank)
    return t.to(device, non_blocking=True)


class _ScaledLoss(nn.Module):
    """The loss a pipeline schedule calls on the last stage, once per micro-batch: cross-entropy × the loss scale.
    A module, so that a measured step's probe hooks its first call as it hooks the stages' first forwards."""

    def __init__(self, scaler: LossScaler):
        super().__init__()
        self.scaler = scaler

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return loss_fn(logits, targets) * self.scaler.scale


class NativeEngine:
    checkpoint_format = FORMAT_DCP

    def __init__(self, spec: RunSpec):
        self.spec = spec
        self.rank, self.world_size, self.device = init_distributed()
        self.scaler = LossScaler(spec.plan.precision == "fp16")
        self.pipeline_loss = _ScaledLoss(self.scaler)
        self.pm: Optional[ParallelModel] = None

    # ---- build ---------------------------------------------------------------------------------------------
    def build(self) -> None:
        spec = self.spec
        self.pm = parallelize(spec.model, spec.plan, self.device, spec.seed, self.pipeline_loss,
                              aux_scale=lambda: spec.model.aux_loss_coef * self.scaler.scale)
        self.topo = self.pm.topo
        self.dp_rank = self.topo.dp_rank
        self.optimizers = [build_optimizer(m, spec.optimizer) for m in self.pm.modules]
        self.params = self.pm.parameters()
        self.moe_layers = moe_layers(self.pm.modules)  # found once: a dense model's step walks no module tree
        self._compute_clock = ComputeClock.for_plan(spec.plan, self.pm.modules[0], self.pm.fsdp)

    def describe(self) -> Description:
        plan, pm = self.spec.plan, self.pm
        held = sum(_plain(p).numel() for p in self.params)  # a DTensor's numel() is the whole tensor's
        return Description(
            {"plan": {"dp": plan.dp, "cp": plan.cp, "tp": plan.tp, "pp": plan.pp}, "device": str(self.device)},
            f"mesh pp={plan.pp} dp={plan.dp} cp={plan.cp} tp={plan.tp}; stages {pm.stage_ids}; this rank holds "
            f"{held:,} of the model's {count(self.spec.model).total:,} parameters")

    def announce(self, files: RunFiles) -> None:
        """Nothing beyond the loop's own "started" event."""

    def seed(self, step: int) -> None:
        """Dropout streams: equal across tensor-parallel partners (they hold the same activations), distinct across
        dp replicas and pipeline stages, moved on per step so that a resumed run without saved RNG still differs."""
        torch.manual_seed(hash((self.spec.seed, self.topo.dp_rank, self.topo.pp_rank, step)) % (2 ** 63))

    # ---- one step ------------------------------------------------------------------------------------------
    def _share(self, batch) -> torch.Tensor:
        """This rank's share of a batch: all of it, or its zig-zag share of each sequence under context parallel
        (every cp rank of a dp replica draws the same sequences)."""
        return _tensor(batch, self.device, self.topo.cp, self.topo.cp_rank)

    def _autocast(self):
        precision = self.spec.plan.precision
        enabled = precision != "fp32" and not self.pm.fsdp  # FSDP2 casts parameters itself
        return torch.autocast(self.device.type, dtype=DTYPES[precision], enabled=enabled)

    def _loss_context(self):
        # Cross-entropy on vocabulary-sharded logits (and its backward) must run inside loss_parallel().
        return loss_parallel() if self.pm.loss_parallel else contextlib.nullcontext()

    def train_step(self, micro: MicroBatches, lr: float, measure: bool) -> StepResult:
        pm = self.pm
        set_lr(self.optimizers, lr)
        self._compute_clock.start()
        passed = self._forward_backward(micro, measure)
        # Gradients as backward leaves them (their peak): the syncs below may reshard some (tied pipeline embedding).
        grads_bytes = gradient_bytes(pm.modules) if measure else 0
        pm.sync_gradients()
        finite = self.scaler.unscale_and_check(self.params, self.device)
        norm = pm.grad_norm(self.device)
        if finite:
            clip_grads_(self.params, self.spec.optimizer.grad_clip, norm)
            for opt in self.optimizers:
                opt.step()
        self.scaler.update(finite)
        state = None
        if measure:
            state = {**model_state_bytes(pm.modules, self.optimizers), "grads_bytes": grads_bytes,
                     "activations_bytes": passed.activations.bytes}
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        return StepResult(loss=self._mean_loss(passed.loss), grad_norm=float(norm), applied=finite,
                          loss_scale=self.scaler.scale, routing=routing_metrics(passed.routing, self.topo.dp_group),
                          state_bytes=state, compute_s=self._compute_clock.read())

    def _forward_backward(self, micro: MicroBatches, measure: bool) -> Backward:
        """Gradients of this rank's micro-batches, left unreduced where DDP and FSDP2 do not reduce them."""
        probe = SavedActivations(self.params) if measure else None
        if self.pm.schedule is not None:
            return self._pipeline_forward_backward(micro, probe)
        return self._accumulate(micro, probe)

    def _accumulate(self, micro: MicroBatches, probe: Optional[SavedActivations]) -> Backward:
        """Gradient accumulation over the micro-batches; one dp reduction, on the last of them. The probe sees the
        first micro-batch's forward."""
        model, pm, spec = self.pm.callables[0], self.pm, self.spec
        total = torch.zeros((), device=self.device)
        routing = None
        n = len(micro)
        for i, (x, y) in enumerate(micro):
            x, y = self._share(x), self._share(y)
            with pm.gradient_sync(i == n - 1), self._loss_context():
                with probe if probe is not None and i == 0 else contextlib.nullcontext():
                    with self._autocast():
                        loss = loss_fn(model(x), y)
                objective = loss
                if self.moe_layers:
                    aux = aux_loss(self.moe_layers)
                    if isinstance(loss, DTensor):  # loss_parallel's replicated loss: the aux loss is replicated too
                        aux = DTensor.from_local(aux, loss.device_mesh, loss.placements, run_check=False)
                    objective = loss + spec.model.aux_loss_coef * aux
                    routing = step_stats(self.moe_layers, routing)
                (objective * (self.scaler.scale / n)).backward()
            total += _plain(loss.detach()).float()
        return Backward(loss=total / n, routing=routing, activations=probe)

    def _pipeline_forward_backward(self, micro: MicroBatches, probe: Optional[SavedActivations]) -> Backward:
        """The schedule runs every micro-batch; the probe sees the first forward of each stage this rank holds, and
        the first loss."""
        pm = self.pm
        x = torch.cat([self._share(a) for a, _ in micro])
        y = torch.cat([self._share(b) for _, b in micro])
        losses: list[torch.Tensor] = []
        args = (x,) if pm.has_first_stage else ()
        kwargs = {"target": y, "losses": losses} if pm.has_last_stage else {}
        measured = probe.around_first_forward([*pm.modules, self.pipeline_loss]) if probe is not None \
            else contextlib.nullcontext()
        with measured, self._loss_context(), self._autocast():
            pm.schedule.step(*args, **kwargs)
        # MoE stages attached their aux losses to backward themselves; their routing, gathered over the stages
        routing = pm.routing.take(len(micro), self.device) if pm.routing is not None else None
        if not losses:
            return Backward(loss=torch.zeros((), device=self.device), routing=routing, activations=probe)
        # The loss function returned scale × loss; report the loss itself.
        loss = torch.stack([_plain(l.detach()).float() for l in losses]).mean() / self.scaler.scale
        return Backward(loss=loss, routing=routing, activations=probe)

    def _mean_loss(self, local: torch.Tensor) -> float:
        """Sum over the world of what the last stages saw, over the dp·tp replicas that each saw it; under context
        parallel each of the cp ranks saw the mean of an equal share of every sequence's tokens, so their mean is
        the sequences' mean."""
        value = local.detach().double().clone()
        if self.world_size > 1:
            dist.all_reduce(value)
        return float(value) / (self.topo.dp * self.topo.cp * self.topo.tp)

    def pipeline_schedule_record(self) -> dict[str, Any] | None:
        plan = self.spec.plan
        if self.pm.schedule is None:
            return None
        return schedule_record(self.pm.schedule, plan.pipeline_schedule, plan.pp, self.topo.pp_rank,
                               plan.model_chunks, plan.grad_accum)

    # ---- evaluation and checkpoints ------------------------------------------------------------------------
    def evaluate(self, batches: MicroBatches) -> float:
        pm, device = self.pm, self.device
        for m in pm.modules:
            m.eval()
        try:
            with torch.no_grad(), self._loss_context(), self._autocast():
                if pm.schedule is None:
                    total = torch.zeros((), device=device, dtype=torch.float64)
                    for x, y in batches:
                        total += _plain(loss_fn(pm.callables[0](self._share(x)), self._share(y))).double()
                    value = total / len(batches)
                else:
                    value = self._pipeline_evaluate(batches)
        finally:
            for m in pm.modules:
                m.train()
        # Every dp·tp replica of the last stage holds the same value; the others contribute 0.
        return self._mean_loss(value)

    def _pipeline_evaluate(self, batches: MicroBatches) -> torch.Tensor:
        pm, device, m = self.pm, self.device, self.spec.plan.grad_accum
        losses: list[torch.Tensor] = []
        for start in range(0, len(batches), m):  # the schedule's unit: grad_accum micro-batches
            group = batches[start:start + m]
            x = torch.cat([self._share(a) for a, _ in group])
            y = torch.cat([self._share(b) for _, b in group])
            args = (x,) if pm.has_first_stage else ()
            kwargs = {"target": y, "losses": losses} if pm.has_last_stage else {}
            pm.schedule.eval(*args, **kwargs)
        if not losses:
            return torch.zeros((), device=device, dtype=torch.float64)
        return torch.stack([_plain(l).double() for l in losses]).mean() / self.scaler.scale

    def save(self, run_dir: Path, manifest: CheckpointManifest, keep: int) -> Path:
        manifest = replace(manifest, loss_scaler=self.scaler.state_dict())
        return save_checkpoint(run_dir, manifest, self.pm.modules, self.optimizers, self.rank, keep)

    def load(self, folder: Path) -> CheckpointManifest:
        manifest = load_checkpoint(folder, self.pm.modules, self.optimizers, self.rank, self.spec.plan)
        self.scaler.load_state_dict(manifest.loss_scaler or {})
        return manifest

    def load_weights(self, folder: Path) -> CheckpointManifest:
        return load_weights(folder, self.pm.modules, self.spec.model)

    def close(self) -> None:
        pass
