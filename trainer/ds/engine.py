"""The DeepSpeed engine's training loop, writing the same run folder, metrics and events as the native engine.

A step: learning rate from trainer.optim.lr_at set on the client AdamW → this rank's micro-batches (the native
sampler, so both engines see the same data) → forward, ``engine.backward`` (which divides by the accumulation
steps) and ``engine.step`` per micro-batch (DeepSpeed reduces, clips and steps at the accumulation boundary) →
metrics. The model is the native GPT (MoE layers swapped for DeepSpeed's when the model has experts), so parameter
names, initial weights and the consolidated checkpoint match the native engine's.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer import flops as flops_mod
from trainer.ds.config import CONFIG_FILE, deepspeed_config
from trainer.memory import SavedActivations
from trainer.model import loss_fn
from trainer.optim import lr_at
from trainer.parallel.mesh import init_distributed
from trainer.contract.runfolder import write_json_atomic
from trainer.contract import RunSpec


def init_deepspeed() -> tuple[int, int, torch.device]:
    """Join the process group (the native helper: gloo on the CPU), then hand it to deepspeed.comm.

    On the CPU, DeepSpeed's torch backend JIT-compiles a shared-memory all-reduce kernel (30–70 s) the first
    time it starts. Training on gloo never needs it, so the op is marked unavailable before DeepSpeed looks."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if not torch.cuda.is_available() else "cuda")
    rank, world, device = init_distributed()
    import deepspeed
    import deepspeed.ops

    if device.type == "cpu":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world))
    deepspeed.init_distributed(dist_backend="gloo" if device.type == "cpu" else "nccl", dist_init_required=False)
    return rank, world, device


def run(spec: RunSpec, run_dir: Path, resume: bool, stop_at: int = 0) -> str:
    from trainer.train import RunFiles

    rank, world, device = init_deepspeed()
    files = RunFiles(run_dir, rank)
    with files.failure_recorded():
        return _run(spec, Path(run_dir), resume, files, device, stop_at)


def build(spec: RunSpec, device: torch.device, profile_flops: bool = False):
    """(DeepSpeed engine, its config, the flops cross-check or None) for ``spec``: the seeded native model, the
    client AdamW, the config."""
    from trainer.ds.layers import apply_deepspeed_ac, apply_deepspeed_moe
    from trainer.model import build_model

    config = deepspeed_config(spec)
    _forget_previous_engine()
    if spec.plan.pp > 1:
        from trainer.ds.pipeline import build_pipeline

        model = build_pipeline(spec.model, spec.plan.pp, spec.seed, loss_fn, spec.plan.activation_checkpointing)
        if spec.plan.activation_checkpointing != "none":
            _configure_checkpointing(config)
        return _initialize(model, spec, config), config, None
    model = build_model(spec.model, spec.seed, device)
    flops = None
    if profile_flops:  # on the plain module: inside a ZeRO-3 engine the profiler counts Linear MACs twice
        from trainer.ds.flops_check import profile_forward_flops

        flops = profile_forward_flops(model, spec.model)
    if spec.model.is_moe:
        apply_deepspeed_moe(model, spec)
    if spec.plan.activation_checkpointing != "none":
        _configure_checkpointing(config)
        apply_deepspeed_ac(model, spec.plan.activation_checkpointing)
    return _initialize(model, spec, config), config, flops


def _forget_previous_engine() -> None:
    """An earlier engine in this process (the tests run several jobs per launch) leaves DeepSpeed's module-level
    model-parallel handle pointing at its pipeline topology; a new engine must not inherit it."""
    from deepspeed.utils import groups

    groups.mpu = None


def _configure_checkpointing(config: dict) -> None:
    """The config's activation_checkpointing section, handed over field by field: given the whole config,
    DeepSpeed re-checks its batch sizes against the world size, which is wrong under a pipeline (dp = world/pp)."""
    import deepspeed

    ac = config["activation_checkpointing"]
    deepspeed.checkpointing.configure(None, partition_activations=ac["partition_activations"],
                                      contiguous_checkpointing=ac["contiguous_memory_optimization"],
                                      checkpoint_in_cpu=ac["cpu_checkpointing"],
                                      synchronize=ac["synchronize_checkpoint_boundary"], profile=ac["profile"])


def _initialize(model, spec: RunSpec, config: dict):
    import deepspeed

    from trainer.ds.layers import optimizer_param_groups

    opt = spec.optimizer
    optimizer = torch.optim.AdamW(optimizer_param_groups(model, opt.weight_decay), lr=opt.lr,
                                  betas=(opt.beta1, opt.beta2), eps=opt.eps)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config,
                                           dist_init_required=False)
    return engine


def _run(spec: RunSpec, run_dir: Path, resume: bool, files, device: torch.device, stop_at: int) -> str:
    from trainer.data import BatchSampler, load_tokens, prepare_dataset
    from trainer.ds import checkpoint as ds_ckpt
    from trainer.ds.layers import aux_loss, routing_stats
    from trainer.ds.memory import engine_state_bytes
    from trainer.moe import stats_metrics
    from trainer.train import StopRequest, _eval_batches

    plan, rank, world = spec.plan, dist.get_rank(), dist.get_world_size()
    if world != plan.world_size:
        raise RuntimeError(f"the plan needs dp×pp={plan.dp}×{plan.pp}={plan.world_size} processes but this job "
                           f"has {world}: launch with --nproc_per_node={plan.world_size}")
    stop = StopRequest()
    data = prepare_dataset(spec.dataset, spec.model.vocab_size)
    train_tokens, val_tokens = load_tokens(data.train_path), load_tokens(data.val_path)
    sampler = BatchSampler(train_tokens, spec.model.seq_len, plan.micro_batch, plan.grad_accum,
                           dp_rank=rank % plan.dp, dp_size=plan.dp, seed=spec.seed)  # dp innermost
    engine, config, flops = build(spec, device, profile_flops=rank == 0)
    if rank == 0:
        write_json_atomic(run_dir / CONFIG_FILE, config)
    if rank == 0 and flops is not None:
        files.event("flops_check", **flops)
        files.log(f"flops profiler {flops['profiler_flops']:.4g} vs formula {flops['formula_flops']:.4g} per "
                  f"{flops['tokens']} tokens (ratio {flops['ratio']:.3f})")

    step, tokens_seen, resumed_from = 0, 0, None
    if resume:
        folder = ds_ckpt.latest(run_dir)
        if folder is not None:
            manifest = ds_ckpt.load(engine, folder, rank, same_layout=ds_ckpt.same_layout(folder, spec))
            step, tokens_seen, resumed_from = int(manifest["step"]), int(manifest["tokens_seen"]), str(folder)
            files.log(f"resumed from {folder} at step {step}")
        else:
            files.log("--resume given but no complete checkpoint found: starting from step 0")
    if resumed_from is None or not ds_ckpt.same_layout(Path(resumed_from), spec):
        torch.manual_seed(hash((spec.seed, rank, step)) % (2 ** 63))

    n_params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in engine.module.parameters())
    files.event("started", step=step, world_size=world, resumed_from=resumed_from, engine="deepspeed",
                plan={"dp": plan.dp, "tp": plan.tp, "pp": plan.pp, "zero_stage": plan.zero_stage},
                device=str(device))
    files.log(f"deepspeed ZeRO-{plan.zero_stage} dp={plan.dp}; {n_params:,} parameters; config {CONFIG_FILE}")
    from types import SimpleNamespace

    from trainer.profiling import StepProfiler, write_summary
    from trainer.train import ProfileReport

    profiler = StepProfiler(spec.profile, run_dir, rank, first_step=step)
    profile_report = ProfileReport(profiler, files, SimpleNamespace(rank=rank, world_size=world), write_summary)
    val = _eval_batches(spec, val_tokens) if spec.eval_every else []
    flops_step = flops_mod.flops_per_step(spec.model, plan.global_batch)
    tokens_step = plan.global_batch * spec.model.seq_len
    state_bytes: dict[str, Any] | None = None
    last_saved = step if resumed_from else -1
    outcome = "finished"
    coef = spec.model.aux_loss_coef

    while step < spec.steps:
        measure = state_bytes is None
        lr = lr_at(step, spec.optimizer, spec.steps)
        for group in engine.optimizer.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        total, routing, probe = 0.0, None, None
        micro = sampler.micro_batches(step)
        pipelined = plan.pp > 1
        if pipelined:  # DeepSpeed's 1F1B schedule runs all micro-batches; first and last stages read the batches
            batches = [(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)) for x, y in micro]
            # The probe sees every micro-batch this stage runs in the step, not one as in the native engine: the
            # schedule cannot be entered per micro-batch from outside.
            probe = SavedActivations(engine.module.parameters()) if measure else None
            with probe if probe is not None else contextlib.nullcontext():
                total = float(engine.train_batch(iter(batches))) * len(micro)
            activations = probe.bytes if probe is not None else 0
        for i, (x, y) in enumerate(micro if not pipelined else []):
            x, y = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
            probe = SavedActivations(engine.module.parameters()) if measure and i == 0 else None
            with probe if probe is not None else contextlib.nullcontext():
                loss = loss_fn(engine(x), y)
                aux = aux_loss(engine.module)
                objective = loss if aux is None else loss + coef * aux
            routing = routing_stats(engine.module, routing)
            engine.backward(objective)
            engine.step()
            total += float(loss.detach())
            if probe is not None:
                activations = probe.bytes
        norm = engine.get_global_grad_norm()
        skipped = not engine.was_step_applied()
        if measure:
            state_bytes = {**engine_state_bytes(engine), "activations_bytes": activations}
        loss_value = torch.tensor(total / len(micro), dtype=torch.float64)
        if world > 1 and not pipelined:  # the pipeline engine already averaged over dp and broadcast it
            dist.all_reduce(loss_value)
            loss_value /= world
        loss_value = float(loss_value)
        routing_metrics = stats_metrics(routing)
        step_time = time.perf_counter() - t0
        step += 1
        tokens_seen += tokens_step
        memory = dict(state_bytes)
        if measure and world > 1:
            everyone = [None] * world
            dist.all_gather_object(everyone, state_bytes)
            memory["per_rank"] = everyone
        files.metric({"step": step, "loss": loss_value, "lr": lr, "grad_norm": float(norm or 0.0),
                      "tokens_per_s": tokens_step / step_time, "step_time_s": step_time, "tokens_seen": tokens_seen,
                      "flops_per_step": flops_step, "loss_scale": float(getattr(engine.optimizer, "cur_scale", 1.0)),
                      "skipped": skipped, "mfu": flops_mod.mfu(flops_step, step_time, spec.cluster.gpu.peak_tflops,
                                                               world),
                      "memory": memory, **routing_metrics})
        if step % spec.log_every == 0:
            files.log(f"step {step} loss {loss_value:.4f} lr {lr:.2e} grad_norm {float(norm or 0):.3f} "
                      f"{step_time * 1000:.1f} ms")
        profiler.step()
        if profiler.written:  # every rank's trace is on disk (same step on all ranks)
            profile_report.once()
        if spec.eval_every and step % spec.eval_every == 0:
            val_loss = evaluate(engine, val, device, plan.grad_accum if plan.pp > 1 else 0)
            files.metric({"step": step, "val_loss": val_loss})
            files.log(f"step {step} val_loss {val_loss:.4f}")
        stopping = stop.agreed(device) or step == stop_at
        if (spec.checkpoint_every and step % spec.checkpoint_every == 0) or stopping:
            _save(engine, run_dir, step, tokens_seen, spec, data, files)
            last_saved = step
        if stopping:
            outcome = "stopped"
            break
    if outcome == "finished" and spec.checkpoint_every and last_saved != step:
        _save(engine, run_dir, step, tokens_seen, spec, data, files)
    profiler.close()
    if profiler.written:
        profile_report.once()
    stop.restore()
    files.event(outcome, step=step, tokens_seen=tokens_seen)
    files.log(f"{outcome} at step {step}")
    if world > 1:
        dist.barrier()
    engine.destroy()
    return outcome


def evaluate(engine, batches: list, device: torch.device, group: int = 0) -> float:
    """Mean validation loss; every rank evaluates every batch (ZeRO-3 gathers weights as it goes). A pipeline
    evaluates ``group`` micro-batches at a time (its schedule's unit)."""
    if group:
        tensors = [(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)) for x, y in batches]
        losses = [float(engine.eval_batch(iter(tensors[i:i + group]))) for i in range(0, len(tensors), group)]
        return sum(losses) / len(losses)
    engine.eval()
    try:
        total = 0.0
        with torch.no_grad():
            for x, y in batches:
                total += float(loss_fn(engine(torch.from_numpy(x).to(device)), torch.from_numpy(y).to(device)))
    finally:
        engine.train()
    return total / len(batches)


def _save(engine, run_dir: Path, step: int, tokens_seen: int, spec: RunSpec, data, files) -> None:
    from trainer.ds import checkpoint as ds_ckpt

    t0 = time.perf_counter()
    manifest = {"tokens_seen": tokens_seen, "model": spec.model.to_dict(), "plan": spec.plan.to_dict(),
                "world_size": spec.plan.world_size, "tokenizer": str(data.tokenizer_path), "seed": spec.seed,
                "run": spec.name}
    folder = ds_ckpt.save(engine, run_dir, step, manifest, spec)
    files.event("checkpoint_saved", step=step, path=str(folder.relative_to(run_dir)), tokens_seen=tokens_seen)
    files.log(f"checkpoint step {step} saved in {time.perf_counter() - t0:.2f} s")


def dump_config(spec: RunSpec) -> str:
    return json.dumps(deepspeed_config(spec), indent=2)
