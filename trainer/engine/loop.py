"""The training loop: one process per rank, writing the run folder (docs/architecture.md, The run folder).

A step: learning rate for the step → this rank's micro-batches (a pure function of seed and step, so resume and any
dp degree see the same data) → the engine's ``train_step`` (forward, backward, gradient reduction, global norm,
clipping, update) → its row of metrics (``recorder``), every rank's own compute time watched for stragglers
(``stragglers``) and the loss for spikes (``spikes``: back to the newest checkpoint, the batches since skipped) →
profiler, evaluation, the stop agreement and the checkpoint cadence (``checkpointer``). Around the steps the loop
owns what every engine shares: the run's files, stop requests (SIGTERM), the rank's heartbeat (``heartbeat``: what
it is doing, for a watcher of hung collectives), where the run starts, and the final event.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.contract import RunSpec, blend_sources
from trainer.contract.records import Event, EvalMetrics, Phase
from trainer.data import BatchSampler, load_tokens, prepare_dataset, validation_batches
from trainer.data.sampler import BlendSampler
from trainer.engine.base import Engine
from trainer.engine.checkpointer import Checkpointer, init_tokenizer, start_from
from trainer.engine.heartbeat import HeartbeatThread
from trainer.engine.native import NativeEngine
from trainer.engine.recorder import StepRecorder
from trainer.engine.runfiles import ProfileReport, RunFiles, StopRequest
from trainer.engine.spikes import DataSkips, Spike, SpikeGuard
from trainer.engine.stragglers import Straggler, StragglerWatch
from trainer.optim import lr_at
from trainer.profiling import profiler
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
    if spec.profile:
        profiler.prepare()  # before the process group exists (profiler.prepare says why)
    try:
        engine = build_engine(spec)
        files = RunFiles(run_dir, engine.rank)
        heartbeat = HeartbeatThread(run_dir, engine.rank, engine.world_size).start()
        with files.failure_recorded():
            try:
                return _train(spec, run_dir, resume, stop_at, engine, files, stop, heartbeat)
            finally:
                heartbeat.stop()
                engine.close()
    finally:
        stop.restore()


def _train(spec: RunSpec, run_dir: Path, resume: bool, stop_at: int, engine: Engine, files: RunFiles,
           stop: StopRequest, heartbeat: HeartbeatThread) -> str:
    plan = spec.plan
    data = prepare_dataset(spec.dataset, spec.model.vocab_size, tokenizer=init_tokenizer(spec))
    # a blend's other datasets are tokenized as the run's own is, so that an id means one token in all of them
    prepared = [data] + [prepare_dataset(source.dataset, spec.model.vocab_size, tokenizer=data.tokenizer_path)
                         for source in spec.blend]
    engine.build()
    engine.announce(files)
    shape = (spec.model.seq_len, plan.micro_batch, plan.grad_accum)
    if spec.blend:
        sampler = BlendSampler([load_tokens(d.train_path) for d in prepared],
                               [source.weight for source in blend_sources(spec)], *shape, dp_rank=engine.dp_rank,
                               dp_size=plan.dp, seed=spec.seed)
    else:
        sampler = BatchSampler(load_tokens(data.train_path), *shape, dp_rank=engine.dp_rank, dp_size=plan.dp,
                               seed=spec.seed)
    loading = time.perf_counter()
    start = start_from(engine, run_dir, resume, spec, files)
    load_s = time.perf_counter() - loading
    started, layout = engine.describe()
    files.event(Event.STARTED, step=start.step, world_size=engine.world_size, load_s=round(load_s, 6),
                resumed_from=str(start.resumed_from) if start.resumed_from else None,
                started_from=str(start.started_from) if start.started_from else None, **started)
    files.log(layout)

    profiler = StepProfiler(spec.profile, run_dir, engine.rank, first_step=start.step)
    profile = ProfileReport(profiler, files, engine.world_size,
                            engine.pipeline_schedule_record() if profiler.enabled else None)
    val = {source.name: validation_batches(spec, load_tokens(d.val_path))
           for source, d in zip(blend_sources(spec), prepared)} if spec.eval_every else {}
    recorder = StepRecorder(spec, engine, files)
    checkpointer = Checkpointer(spec, engine, run_dir, files, data.tokenizer_path, start)
    guard, skips = SpikeGuard(spec.spike_factor, spec.spike_window), DataSkips(run_dir)
    stragglers = StragglerWatch(spec.straggler_factor, spec.straggler_window, _hosts(engine, heartbeat.host))
    step, tokens_seen, outcome = start.step, start.tokens_seen, "finished"
    while step < spec.steps:
        lr = lr_at(step, spec.optimizer, spec.steps)
        heartbeat.enter(Phase.STEP, step)
        _synchronize(engine.device)
        t0 = time.perf_counter()
        result = engine.train_step(sampler.micro_batches(skips.data_step(step)), lr, measure=recorder.measuring)
        _synchronize(engine.device)
        step_time = time.perf_counter() - t0
        step += 1
        heartbeat.step_done(step, step_time)
        tokens_seen += sampler.tokens_per_step
        figures = recorder.record(result, step=step, tokens_seen=tokens_seen, lr=lr, step_time=step_time)
        _name_stragglers(stragglers.observe(figures.get("compute_s", [])), step, spec, files)
        spike = guard.check(step, result.loss)
        if spike:
            heartbeat.enter(Phase.STARTING)  # loading, as when an attempt starts
            # the guard keeps its window: the steps before the spike are the measure of the steps after it
            step, tokens_seen = _roll_back(spike, spec, engine, files, skips)
            continue
        profile.after_step()
        if spec.eval_every and step % spec.eval_every == 0:
            heartbeat.enter(Phase.EVALUATING)
            _evaluate(engine, files, step, val, spec)
            heartbeat.enter(Phase.STEP)  # the stop agreement: a collective, as a step's are
        stopping = stop.agreed(engine.device) or step == stop_at
        heartbeat.enter(Phase.SAVING)
        checkpointer.after_step(step, tokens_seen, stopping)
        if stopping:
            outcome = "stopped"
            break
    if outcome == "finished":
        heartbeat.enter(Phase.SAVING)
        checkpointer.at_end(step, tokens_seen)
    profile.close()
    files.event(Event.FINISHED if outcome == "finished" else Event.STOPPED, step=step, tokens_seen=tokens_seen)
    files.log(f"{outcome} at step {step}")
    if engine.world_size > 1:
        dist.barrier()
    return outcome


def _hosts(engine: Engine, mine: str) -> list[str]:
    """Every rank's host, in rank order (one gather as the run starts)."""
    if engine.world_size == 1:
        return [mine]
    hosts = [None] * engine.world_size
    dist.all_gather_object(hosts, mine)
    return hosts


def _name_stragglers(found: list[Straggler], step: int, spec: RunSpec, files: RunFiles) -> None:
    for straggler in found:
        files.event(Event.STRAGGLER, step=step, straggler={"rank": straggler.rank, "host": straggler.host},
                    compute_s=straggler.compute_s, others_s=straggler.others_s, ratio=straggler.ratio,
                    window=spec.straggler_window, message=straggler.describe(spec.straggler_window))


def _roll_back(spike: Spike, spec: RunSpec, engine: Engine, files: RunFiles, skips: DataSkips) -> tuple[int, int]:
    """Back to the newest checkpoint, the batches since skipped (spikes.py); (steps done, tokens seen) there."""
    folder, skip = skips.roll_back(spike, spec.spike_factor, engine.checkpoint_format, write=engine.rank == 0)
    manifest = engine.load(folder)
    files.event(Event.LOSS_SPIKE, step=spike.step, loss=skip.loss, median=spike.median, factor=spec.spike_factor,
                rolled_back_to=manifest.step, skipped_steps=[skip.after_step + 1, skip.spike_step])
    files.log(f"loss spike: {spike.describe(spec.spike_factor)}; back to step {manifest.step} ({folder}), "
              f"skipping the batches of steps {skip.after_step + 1}–{skip.spike_step}")
    return manifest.step, manifest.tokens_seen


def _evaluate(engine: Engine, files: RunFiles, step: int, batches: dict[str, list], spec: RunSpec) -> None:
    """The validation loss of each source (one without a blend); a blend's val_loss is their mean by weight."""
    losses = {name: engine.evaluate(b) for name, b in batches.items()}
    if not spec.blend:
        (val_loss,) = losses.values()
        files.metric(EvalMetrics(step=step, val_loss=val_loss))
    else:
        weights = {source.name: source.weight for source in blend_sources(spec)}
        val_loss = sum(weights[n] * loss for n, loss in losses.items()) / sum(weights.values())
        files.metric(EvalMetrics(step=step, val_loss=val_loss, val_loss_by_source=losses))
    files.log(f"step {step} val_loss {val_loss:.4f}" + "".join(f" {n} {v:.4f}" for n, v in losses.items()
                                                              if spec.blend))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
