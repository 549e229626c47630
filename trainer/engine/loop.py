"""The training loop: one process per rank, writing the run folder (docs/architecture.md, The run folder).

A step: learning rate for the step → this rank's micro-batches (a pure function of seed and step, so resume and any
dp degree see the same data) → the engine's forward and backward → its optimizer step (gradient reduction, global
norm, clipping, update) → metrics. Around the steps the loop owns what every engine shares: the run's files, stop
requests (SIGTERM), profiling, evaluation, checkpoint cadence and the final event.
"""
from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.contract import RunSpec
from trainer.contract.manifest import CheckpointManifest, latest_checkpoint
from trainer.contract.records import RANK_FIGURES, Event, EvalMetrics, StepMetrics
from trainer.data import BatchSampler, load_tokens, prepare_dataset, validation_batches
from trainer.engine.base import Engine
from trainer.engine.native import NativeEngine
from trainer.engine.runfiles import ProfileReport, RunFiles, StopRequest
from trainer.optim import lr_at
from trainer.planner.estimate.flops import mfu, model_flops_per_step
from trainer.profiling.memory import max_allocated_bytes
from trainer.profiling.profiler import StepProfiler


def build_engine(spec: RunSpec) -> Engine:
    """The plan's engine, joined to the job's process group. DeepSpeed is imported only when a plan asks for it:
    importing it costs seconds, and a native run never needs it."""
    if spec.plan.engine == "deepspeed":
        from trainer.engine.deepspeed.engine import DeepSpeedEngine

        return DeepSpeedEngine(spec)
    return NativeEngine(spec)


def run(spec: RunSpec, run_dir: Path, resume: bool, stop_at: int = 0) -> str:
    """Train ``spec`` (validated by the contract); return "finished" or "stopped" (SIGTERM, or step ``stop_at`` > 0
    reached: a checkpoint is saved either way). A failure is written as an event, then raised. Callable again in the
    same process group (the tests and benchmarks run several jobs per launch)."""
    run_dir = Path(run_dir)
    # Listening for SIGTERM from the start: a stop asked for while the ranks meet, build and load (a time limit
    # near, a preemption) is honoured at the first step's end instead of killing a rank that has saved nothing.
    stop = StopRequest()
    try:
        engine = build_engine(spec)
        files = RunFiles(run_dir, engine.rank)
        with files.failure_recorded():
            try:
                return _train(spec, run_dir, resume, stop_at, engine, files, stop)
            finally:
                engine.close()
    finally:
        stop.restore()


def _train(spec: RunSpec, run_dir: Path, resume: bool, stop_at: int, engine: Engine, files: RunFiles,
           stop: StopRequest) -> str:
    plan = spec.plan
    data = prepare_dataset(spec.dataset, spec.model.vocab_size)
    train_tokens, val_tokens = load_tokens(data.train_path), load_tokens(data.val_path)
    engine.build()
    engine.announce(files)
    sampler = BatchSampler(train_tokens, spec.model.seq_len, plan.micro_batch, plan.grad_accum,
                           dp_rank=engine.dp_rank, dp_size=plan.dp, seed=spec.seed)

    folder = latest_checkpoint(run_dir, engine.checkpoint_format) if resume else None
    if resume and folder is None:
        files.log("--resume given but no complete checkpoint found: starting from step 0")
    resumed = engine.load(folder) if folder is not None else None
    step, tokens_seen = (resumed.step, resumed.tokens_seen) if resumed else (0, 0)
    if resumed:
        files.log(f"resumed from {folder} at step {step}")
    if resumed is None or not resumed.same_layout(plan):
        engine.seed(step)
    started, layout = engine.describe()
    files.event(Event.STARTED, step=step, world_size=engine.world_size,
                resumed_from=str(folder) if resumed else None, **started)
    files.log(layout)

    profiler = StepProfiler(spec.profile, run_dir, engine.rank, first_step=step)
    report = ProfileReport(profiler, files, engine.world_size,
                           engine.pipeline_schedule_record() if profiler.enabled else None)
    val = validation_batches(spec, val_tokens) if spec.eval_every else []
    flops_step = model_flops_per_step(spec.model, plan.global_batch)
    tokens_step = plan.global_batch * spec.model.seq_len
    manifest = CheckpointManifest(step=step, format=engine.checkpoint_format, tokens_seen=tokens_seen,
                                  model=spec.model.to_dict(), plan=plan.to_dict(), world_size=plan.world_size,
                                  tokenizer=str(data.tokenizer_path), seed=spec.seed, run=spec.name)
    outcome, last_saved, state_bytes = "finished", (step if resumed else -1), None
    while step < spec.steps:
        measure = state_bytes is None  # the first step this process runs: every state's bytes, activations
        lr = lr_at(step, spec.optimizer, spec.steps)
        engine.set_lr(lr)
        _synchronize(engine.device)
        t0 = time.perf_counter()
        local_loss = engine.forward_backward(sampler.micro_batches(step), measure)
        done = engine.step(measure)
        loss = engine.mean_loss(local_loss)
        routing = engine.routing_metrics()
        _synchronize(engine.device)
        step_time = time.perf_counter() - t0
        step += 1
        tokens_seen += tokens_step
        if measure:
            state_bytes = done.state_bytes
        memory = {**state_bytes, "max_allocated_bytes": max_allocated_bytes(engine.device)}
        if measure and engine.world_size > 1:
            memory["per_rank"] = _gather(state_bytes, engine.world_size)
        ranks = _gather_figures(engine, (step_time, tokens_step / step_time, memory["max_allocated_bytes"]))
        files.metric(StepMetrics(
            step=step, loss=loss, lr=lr, grad_norm=done.grad_norm, tokens_per_s=tokens_step / step_time,
            step_time_s=step_time, tokens_seen=tokens_seen, flops_per_step=flops_step,
            loss_scale=done.loss_scale, skipped=not done.applied,
            mfu=mfu(flops_step, step_time, spec.cluster.gpu.peak_tflops, engine.world_size), memory=memory,
            routing=routing, ranks=ranks))
        if step % spec.log_every == 0:
            files.log(f"step {step} loss {loss:.4f} lr {lr:.2e} grad_norm {done.grad_norm:.3f} "
                      f"{step_time * 1000:.1f} ms")
        profiler.step()
        if profiler.written:  # every rank's trace is on disk (the same step on all ranks)
            report.once()
        if spec.eval_every and step % spec.eval_every == 0:
            val_loss = engine.evaluate(val)
            files.metric(EvalMetrics(step=step, val_loss=val_loss))
            files.log(f"step {step} val_loss {val_loss:.4f}")
        stopping = stop.agreed(engine.device) or step == stop_at
        if (spec.checkpoint_every and step % spec.checkpoint_every == 0) or stopping:
            _save(engine, run_dir, manifest, step, tokens_seen, spec, files)
            last_saved = step
        if stopping:
            outcome = "stopped"
            break
    if outcome == "finished" and spec.checkpoint_every and last_saved != step:
        _save(engine, run_dir, manifest, step, tokens_seen, spec, files)
    profiler.close()  # a window cut short by the end of the run still writes what it recorded
    if profiler.written:
        report.once()
    files.event(Event.FINISHED if outcome == "finished" else Event.STOPPED, step=step, tokens_seen=tokens_seen)
    files.log(f"{outcome} at step {step}")
    if engine.world_size > 1:
        dist.barrier()
    return outcome


def _save(engine: Engine, run_dir: Path, manifest: CheckpointManifest, step: int, tokens_seen: int, spec: RunSpec,
          files: RunFiles) -> None:
    t0 = time.perf_counter()
    folder = engine.save(run_dir, replace(manifest, step=step, tokens_seen=tokens_seen), spec.keep_checkpoints)
    files.event(Event.CHECKPOINT_SAVED, step=step, path=str(folder.relative_to(run_dir)), tokens_seen=tokens_seen)
    files.log(f"checkpoint step {step} saved in {time.perf_counter() - t0:.2f} s")


def _gather(state_bytes: dict, world_size: int) -> list[dict]:
    """Every rank's bytes (each holds different shards, stages or experts)."""
    everyone = [None] * world_size
    dist.all_gather_object(everyone, state_bytes)
    return everyone


def _gather_figures(engine: Engine, figures: tuple[float, float, int | None]) -> dict[str, list]:
    """Every rank's RANK_FIGURES of this step, in one all-gather of three float64s (exact for bytes below 2^53);
    a world of one sends nothing."""
    if engine.world_size == 1:
        return {}
    # a device that does not report its memory (the CPU) sends NaN, written as null
    mine = torch.tensor([math.nan if f is None else f for f in figures], dtype=torch.float64, device=engine.device)
    everyone = [torch.empty_like(mine) for _ in range(engine.world_size)]
    dist.all_gather(everyone, mine)
    table = torch.stack(everyone).tolist()
    out = {name: [row[i] for row in table] for i, name in enumerate(RANK_FIGURES)}
    out["max_allocated_bytes"] = [None if math.isnan(b) else int(b) for b in out["max_allocated_bytes"]]
    return out


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
