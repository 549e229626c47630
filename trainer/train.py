"""The native engine's training loop: one process per rank, writing the run folder described in docs/architecture.md.

A step: learning rate for the step → this rank's micro-batches (a pure function of seed and step, so resume and
any dp degree see the same data) → forward and backward over them (through the pipeline schedule when pp > 1)
→ dp gradient average where DDP/FSDP do not do it → unscale (fp16) → global gradient norm, clip → AdamW → metrics.
"""
from __future__ import annotations

import contextlib
import math
import os
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from trainer import flops as flops_mod
from trainer import moe
from trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from trainer.memory import SavedActivations, gradient_bytes, max_allocated_bytes, model_state_bytes
from trainer.model import loss_fn
from trainer.optim import LossScaler, build_optimizer, lr_at, set_lr
from trainer.parallel.clip import clip_grads_
from trainer.parallel.mesh import Topology, build_topology, init_distributed
from trainer.parallel.parallelize import DTYPES, ParallelModel, parallelize
from trainer.contract.runfolder import EVENTS, LOGS, METRICS, append_jsonl
from trainer.contract import RunSpec


# ---------------------------------------------------------------- run folder writers


class RunFiles:
    """Events and metrics (rank 0, or any rank for failures) and this rank's own log file."""

    def __init__(self, run_dir: Path, rank: int):
        self.run_dir, self.rank = Path(run_dir), rank
        self.log_path = self.run_dir / LOGS / f"rank-{rank}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # When the launcher already sends stdout into our log file, printing too would write every line twice.
        try:
            self._echo = os.fstat(1).st_ino != os.stat(self.log_path).st_ino
        except OSError:
            self._echo = True

    def log(self, message: str) -> None:
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} rank {self.rank}: {message}"
        with open(self.log_path, "a") as f:
            f.write(line + "\n")
        if self._echo and self.rank == 0:
            print(line, flush=True)

    def event(self, kind: str, any_rank: bool = False, **fields: Any) -> None:
        if self.rank == 0 or any_rank:
            append_jsonl(self.run_dir / EVENTS, {"event": kind, "time": time.time(), "rank": self.rank, **fields})

    @contextlib.contextmanager
    def failure_recorded(self):
        """Any exception inside is logged and written as a "failed" event with its traceback, then re-raised."""
        try:
            yield
        except Exception as exc:
            self.log(f"failed: {exc!r}")
            self.event("failed", any_rank=True, error=repr(exc), traceback=traceback.format_exc())
            raise

    def metric(self, record: dict[str, Any]) -> None:
        if self.rank == 0:
            append_jsonl(self.run_dir / METRICS, record)


class StopRequest:
    """SIGTERM (scheduler pre-emption, scancel, the web app's stop): finish the step, save, exit cleanly."""

    def __init__(self):
        self.requested = False
        self.previous = signal.signal(signal.SIGTERM, self._handle)

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self.previous)

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def agreed(self, device: torch.device) -> bool:
        """Whether any rank was asked to stop: all ranks must stop at the same step."""
        flag = torch.tensor(float(self.requested), device=device)
        if dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


# ---------------------------------------------------------------- one step


@dataclass
class StepContext:
    spec: RunSpec
    topo: Topology
    pm: ParallelModel
    scaler: LossScaler
    probe: Optional[SavedActivations] = None  # measuring saved activations of the next micro-batch
    probe_loss: bool = False  # the pipeline's loss function still has to be measured once
    routing: Optional[dict] = None  # mixture-of-experts routing stats of this step's micro-batches

    def autocast(self):
        precision = self.spec.plan.precision
        enabled = precision != "fp32" and not self.pm.fsdp  # FSDP2 casts parameters itself
        return torch.autocast(self.topo.device_type, dtype=DTYPES[precision], enabled=enabled)

    def loss_context(self):
        # Cross-entropy on vocabulary-sharded logits (and its backward) must run inside loss_parallel().
        return loss_parallel() if self.pm.loss_parallel else contextlib.nullcontext()


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A loss computed under loss_parallel is a replicated DTensor; the value itself is its local tensor."""
    return t.to_local() if isinstance(t, DTensor) else t


def _tensor(batch, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(batch).to(device, non_blocking=True)


def _sync_context(ctx: StepContext, last: bool):
    """Skip the dp gradient reduction on all but the last micro-batch: one reduction per step, not per micro-batch."""
    model = ctx.pm.callables[0]
    if last or ctx.topo.dp == 1:
        return contextlib.nullcontext()
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def forward_backward(ctx: StepContext, micro: list) -> torch.Tensor:
    """Run this rank's micro-batches; return the mean micro-batch loss it saw (0 on non-last pipeline stages)."""
    device = ctx.topo.device
    if ctx.pm.schedule is not None:
        return _pipeline_forward_backward(ctx, micro)
    model = ctx.pm.callables[0]
    fsdp_module = ctx.pm.modules[0] if ctx.pm.fsdp else None
    total = torch.zeros((), device=device)
    n = len(micro)
    for i, (x, y) in enumerate(micro):
        x, y = _tensor(x, device), _tensor(y, device)
        last = i == n - 1
        if fsdp_module is not None and ctx.topo.dp > 1:
            fsdp_module.set_requires_gradient_sync(last)
        probe = ctx.probe if i == 0 else None
        with _sync_context(ctx, last), ctx.loss_context():
            with probe if probe is not None else contextlib.nullcontext():
                with ctx.autocast():
                    loss = loss_fn(model(x), y)
            aux = moe.aux_loss(ctx.pm.modules)  # None for a dense model
            objective = loss if aux is None else loss + ctx.spec.model.aux_loss_coef * aux
            ctx.routing = moe.step_stats(ctx.pm.modules, ctx.routing)
            (objective * (ctx.scaler.scale / n)).backward()
        total += _plain(loss.detach()).float()
    return total / n


def _pipeline_forward_backward(ctx: StepContext, micro: list) -> torch.Tensor:
    device = ctx.topo.device
    x = torch.cat([_tensor(a, device) for a, _ in micro])
    y = torch.cat([_tensor(b, device) for _, b in micro])
    losses: list[torch.Tensor] = []
    args = (x,) if ctx.pm.has_first_stage else ()
    kwargs = {"target": y, "losses": losses} if ctx.pm.has_last_stage else {}
    with ctx.loss_context(), ctx.autocast():
        ctx.pm.schedule.step(*args, **kwargs)
    if not losses:
        return torch.zeros((), device=device)
    # The loss function returned scale × loss; report the loss itself.
    return torch.stack([_plain(l.detach()).float() for l in losses]).mean() / ctx.scaler.scale


def make_pipeline_loss(get_ctx):
    """The loss function a pipeline schedule calls on the last stage, once per micro-batch."""

    def pipeline_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        ctx = get_ctx()
        probe = ctx.probe if ctx is not None and ctx.probe_loss else None
        with probe if probe is not None else contextlib.nullcontext():
            loss = loss_fn(logits, targets)
        if probe is not None:
            ctx.probe_loss = False  # only the first micro-batch is measured
        return loss * (ctx.scaler.scale if ctx is not None else 1.0)

    return pipeline_loss


def _probe_first_forward(module: torch.nn.Module, ctx: StepContext) -> None:
    """Enter ctx.probe around ``module``'s next forward only (pipeline stages run forwards inside the schedule)."""

    def pre(mod, args):
        if ctx.probe is not None:
            ctx.probe.__enter__()

    def post(mod, args, out):
        if ctx.probe is not None:
            ctx.probe.__exit__(None, None, None)
        handles[0].remove()
        handles[1].remove()

    handles = [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]


def all_ranks_mean(value: torch.Tensor, topo: Topology) -> float:
    """The loss every rank reports: sum over the world of what the last stages saw, over the dp·tp replicas."""
    value = value.detach().double().clone()
    if topo.world_size > 1:
        dist.all_reduce(value)
    return float(value) / (topo.dp * topo.tp)


# ---------------------------------------------------------------- evaluation


def evaluate(ctx: StepContext, batches: list) -> float:
    device = ctx.topo.device
    pm = ctx.pm
    for m in pm.modules:
        m.eval()
    try:
        with torch.no_grad(), ctx.loss_context(), ctx.autocast():
            if pm.schedule is None:
                total = torch.zeros((), device=device, dtype=torch.float64)
                for x, y in batches:
                    total += _plain(loss_fn(pm.callables[0](_tensor(x, device)), _tensor(y, device))).double()
                value = total / len(batches)
            else:
                m = ctx.spec.plan.grad_accum
                losses: list[torch.Tensor] = []
                for start in range(0, len(batches), m):
                    group = batches[start:start + m]
                    x = torch.cat([_tensor(a, device) for a, _ in group])
                    y = torch.cat([_tensor(b, device) for _, b in group])
                    args = (x,) if pm.has_first_stage else ()
                    kwargs = {"target": y, "losses": losses} if pm.has_last_stage else {}
                    pm.schedule.eval(*args, **kwargs)
                value = (torch.stack([_plain(l).double() for l in losses]).mean() / ctx.scaler.scale if losses
                         else torch.zeros((), device=device, dtype=torch.float64))
    finally:
        for m in pm.modules:
            m.train()
    # Every dp·tp replica of the last stage holds the same value; the others contribute 0.
    return all_ranks_mean(value, ctx.topo)


def _eval_batches(spec: RunSpec, val_tokens) -> list:
    from trainer.data import eval_batches

    n = spec.eval_batches
    if spec.plan.pp > 1:  # the pipeline evaluates whole groups of grad_accum micro-batches
        m = spec.plan.grad_accum
        n = math.ceil(n / m) * m
    return eval_batches(val_tokens, spec.model.seq_len, spec.plan.micro_batch, n, seed=spec.seed)


# ---------------------------------------------------------------- the run


def _seed_rank(spec: RunSpec, topo: Topology, step: int) -> None:
    """Dropout streams: equal across tensor-parallel partners (they hold the same activations), distinct across
    dp replicas and pipeline stages, and moved on per step so that a resumed run without saved RNG still differs."""
    torch.manual_seed(hash((spec.seed, topo.dp_rank, topo.pp_rank, step)) % (2 ** 63))


def run(spec: RunSpec, run_dir: Path, resume: bool, stop_at: int = 0) -> str:
    """Train; return "finished" or "stopped" (SIGTERM, or ``stop_at`` > 0 steps reached: checkpoint saved either
    way). Raises on failure (after writing the event). Callable again in the same process group."""
    if spec.plan.engine == "deepspeed":
        from trainer.ds.engine import run as deepspeed_run

        return deepspeed_run(spec, run_dir, resume, stop_at)
    rank, world, device = init_distributed()
    files = RunFiles(run_dir, rank)
    with files.failure_recorded():
        return _run(spec, Path(run_dir), resume, files, device, stop_at)


def _run(spec: RunSpec, run_dir: Path, resume: bool, files: RunFiles, device: torch.device, stop_at: int) -> str:
    from trainer.data import BatchSampler, load_tokens, prepare_dataset

    plan = spec.plan
    topo = build_topology(plan, device)
    stop = StopRequest()
    data = prepare_dataset(spec.dataset, spec.model.vocab_size)
    train_tokens, val_tokens = load_tokens(data.train_path), load_tokens(data.val_path)
    sampler = BatchSampler(train_tokens, spec.model.seq_len, plan.micro_batch, plan.grad_accum,
                           dp_rank=topo.dp_rank, dp_size=plan.dp, seed=spec.seed)
    scaler = LossScaler(plan.precision == "fp16")
    # The pipeline schedule (built in parallelize) takes its loss function before the step context exists; the
    # function looks the context up when called.
    holder: dict[str, StepContext] = {}
    pm = parallelize(spec.model, plan, topo, spec.seed, make_pipeline_loss(lambda: holder.get("ctx")))
    ctx = holder["ctx"] = StepContext(spec, topo, pm, scaler)
    optimizers = [build_optimizer(m, spec.optimizer) for m in pm.modules]
    params = pm.parameters()

    step, tokens_seen, resumed_from = 0, 0, None
    if resume:
        folder = latest_checkpoint(run_dir)
        if folder is not None:
            manifest = load_checkpoint(folder, pm.modules, optimizers, topo.rank,
                                       same_world=_same_layout(folder, spec))
            step, tokens_seen = int(manifest["step"]), int(manifest["tokens_seen"])
            scaler.load_state_dict(manifest.get("loss_scaler", {}))
            resumed_from = str(folder)
            files.log(f"resumed from {folder} at step {step}")
        else:
            files.log("--resume given but no complete checkpoint found: starting from step 0")
    if resumed_from is None or not _same_layout(Path(resumed_from), spec):
        _seed_rank(spec, topo, step)

    n_params = sum(p.numel() for p in params)
    files.event("started", step=step, world_size=topo.world_size, resumed_from=resumed_from,
                plan={"dp": plan.dp, "tp": plan.tp, "pp": plan.pp}, device=str(device))
    files.log(f"mesh pp={plan.pp} dp={plan.dp} tp={plan.tp}; stages {pm.stage_ids}; {n_params:,} local parameters")

    from trainer.profiling import StepProfiler, write_summary

    profiler = StepProfiler(spec.profile, run_dir, topo.rank, first_step=step)
    profile_report = ProfileReport(profiler, files, topo, write_summary)
    val = _eval_batches(spec, val_tokens) if spec.eval_every else []
    flops_step = flops_mod.flops_per_step(spec.model, plan.global_batch)
    tokens_step = plan.global_batch * spec.model.seq_len
    state_bytes: dict[str, Any] | None = None
    last_saved = step if resumed_from else -1
    outcome = "finished"

    while step < spec.steps:
        measure = state_bytes is None  # the first step this process runs
        if measure:
            ctx.probe = SavedActivations(params)
            if pm.schedule is not None:
                ctx.probe_loss = True
                for m in pm.modules:
                    _probe_first_forward(m, ctx)
        lr = lr_at(step, spec.optimizer, spec.steps)
        set_lr(optimizers, lr)
        _synchronize(device)
        t0 = time.perf_counter()

        ctx.routing = None
        local_loss = forward_backward(ctx, sampler.micro_batches(step))
        # Gradients as backward leaves them (their peak): later syncs may reshard some (tied pipeline embedding).
        grads_bytes = gradient_bytes(pm.modules) if measure else 0
        pm.sync_gradients()
        finite = scaler.unscale_and_check(params, device)
        norm = pm.grad_norm(topo.dp * topo.tp, device)
        if finite:
            clip_grads_(params, spec.optimizer.grad_clip, norm)
            for opt in optimizers:
                opt.step()
        scaler.update(finite)
        if measure:
            probe, ctx.probe = ctx.probe, None
            state_bytes = {**model_state_bytes(pm.modules, optimizers), "grads_bytes": grads_bytes,
                           "activations_bytes": probe.bytes}
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        loss = all_ranks_mean(local_loss, topo)
        routing = moe.stats_metrics(ctx.routing, topo.dp_group)  # {} for a dense model
        _synchronize(device)
        step_time = time.perf_counter() - t0
        step += 1
        tokens_seen += tokens_step

        memory = dict(state_bytes)
        memory["max_allocated_bytes"] = max_allocated_bytes(device)
        if measure and topo.world_size > 1:
            everyone = [None] * topo.world_size
            dist.all_gather_object(everyone, state_bytes)
            memory["per_rank"] = everyone
        files.metric({"step": step, "loss": loss, "lr": lr, "grad_norm": float(norm), "tokens_per_s":
                      tokens_step / step_time, "step_time_s": step_time, "tokens_seen": tokens_seen,
                      "flops_per_step": flops_step, "loss_scale": scaler.scale, "skipped": not finite,
                      "mfu": flops_mod.mfu(flops_step, step_time, spec.cluster.gpu.peak_tflops, topo.world_size),
                      "memory": memory, **routing})
        if step % spec.log_every == 0:
            files.log(f"step {step} loss {loss:.4f} lr {lr:.2e} grad_norm {float(norm):.3f} "
                      f"{step_time * 1000:.1f} ms")
        profiler.step()
        if profiler.written:  # the trace of every rank is on disk (same step on all ranks)
            profile_report.once()

        if spec.eval_every and step % spec.eval_every == 0:
            val_loss = evaluate(ctx, val)
            files.metric({"step": step, "val_loss": val_loss})
            files.log(f"step {step} val_loss {val_loss:.4f}")

        stopping = stop.agreed(device) or step == stop_at
        if (spec.checkpoint_every and step % spec.checkpoint_every == 0) or stopping:
            _save(run_dir, step, tokens_seen, pm, optimizers, scaler, spec, data, topo, files)
            last_saved = step
        if stopping:
            outcome = "stopped"
            break

    if outcome == "finished" and spec.checkpoint_every and last_saved != step:
        _save(run_dir, step, tokens_seen, pm, optimizers, scaler, spec, data, topo, files)
    profiler.close()  # a window cut short by the end of the run still writes what it recorded
    if profiler.written:
        profile_report.once()
    stop.restore()
    files.event(outcome, step=step, tokens_seen=tokens_seen)
    files.log(f"{outcome} at step {step}")
    if topo.world_size > 1:
        dist.barrier()
    return outcome


class ProfileReport:
    """Once every rank has written its trace: rank 0 merges the summaries and records a profile_written event."""

    def __init__(self, profiler, files: RunFiles, topo: Topology, write_summary):
        self.profiler, self.files, self.topo, self.write_summary = profiler, files, topo, write_summary
        self.done = False

    def once(self) -> None:
        if self.done:
            return
        self.done = True
        if self.topo.world_size > 1:
            dist.barrier()
        if self.topo.rank == 0:
            folder = self.profiler.folder
            summary = self.write_summary(folder)
            scalars = {k: v for k, v in summary.items() if not isinstance(v, (list, dict))} \
                if isinstance(summary, dict) else None
            self.files.event("profile_written", name=self.profiler.spec.name,
                             path=str(folder.relative_to(self.files.run_dir)), summary=scalars)


def _same_layout(folder: Path, spec: RunSpec) -> bool:
    from trainer.contract.runfolder import MANIFEST, read_json

    manifest = read_json(folder / MANIFEST) or {}
    return manifest.get("world_size") == spec.plan.world_size and manifest.get("plan") == spec.plan.to_dict()


def _save(run_dir, step, tokens_seen, pm, optimizers, scaler, spec, data, topo, files) -> None:
    t0 = time.perf_counter()
    manifest = {"tokens_seen": tokens_seen, "model": spec.model.to_dict(), "plan": spec.plan.to_dict(),
                "world_size": topo.world_size, "tokenizer": str(data.tokenizer_path), "seed": spec.seed,
                "loss_scaler": scaler.state_dict(), "run": spec.name}
    folder = save_checkpoint(run_dir, step, pm.modules, optimizers, manifest, topo.rank, spec.keep_checkpoints)
    files.event("checkpoint_saved", step=step, path=str(folder.relative_to(run_dir)), tokens_seen=tokens_seen)
    files.log(f"checkpoint step {step} saved in {time.perf_counter() - t0:.2f} s")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
