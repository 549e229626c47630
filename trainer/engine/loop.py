"""The training loop: one process per rank, writing the run folder (docs/architecture.md, The run folder).

``run`` makes a ``Trainer`` and calls ``train``. The Trainer's construction builds what a run needs on this rank:
the engine (joining the job's process group), the run's files and the rank's heartbeat (``heartbeat``: what it is
doing, for a watcher of hung collectives), the datasets and their sampler, where the run starts (``checkpointer``),
the profiler, the validation batches, the metrics recorder (``recorder``), the checkpoint cadence and the guards
(spikes, stragglers). ``train`` steps until the spec's last step or a stop (SIGTERM, or ``stop_at``) and writes the
final event.

A step (``train_step``): learning rate for the step → this rank's micro-batches (a pure function of seed and step,
so resume and any dp degree see the same data) → the engine's ``train_step`` (forward, backward, gradient
reduction, global norm, clipping, update) → its row of metrics (``recorder``), every rank's own compute time watched
for stragglers (``stragglers``) and the loss for spikes (``spikes``: back to the newest checkpoint, the batches
since skipped) → profiler, evaluation, the stop agreement and the checkpoint cadence (``checkpointer``).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.contract import RunSpec, blend_sources
from trainer.contract.records import Event, EvalMetrics, Phase
from trainer.data import BatchSampler, PreparedData, load_tokens, prepare_dataset, validation_batches
from trainer.data.sampler import BlendSampler
from trainer.engine.base import Engine
from trainer.engine.checkpointer import Checkpointer, Start, init_tokenizer, start_from
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
    # Listening for SIGTERM from the start: a stop asked for while the ranks meet, build and load (a time limit
    # near, a preemption) is honoured at the first step's end instead of killing a rank that has saved nothing.
    stop = StopRequest()
    if spec.profile:
        profiler.prepare()  # before the process group exists (profiler.prepare says why)
    try:
        return Trainer(spec, Path(run_dir), stop, resume=resume, stop_at=stop_at).train()
    finally:
        stop.restore()


class Trainer:
    """One rank's run of ``spec`` in ``run_dir``: built here, trained by ``train``. A failure once the run's files
    are open, while building or training, is written as an event (``RunFiles.failure_recorded``) after the rank's
    heartbeat and engine are closed, then raised. ``stop``: the process's SIGTERM listener, agreed on after each
    step; ``stop_at`` > 0: stop after that step too."""

    def __init__(self, spec: RunSpec, run_dir: Path, stop: StopRequest, *, resume: bool, stop_at: int = 0):
        self.spec, self.stop, self.stop_at = spec, stop, stop_at
        self.engine = build_engine(spec)  # joins the process group: the rank is known before anything can fail
        self.files = RunFiles(run_dir, self.engine.rank)
        self.heartbeat = HeartbeatThread(run_dir, self.engine.rank, self.engine.world_size).start()
        with self.files.failure_recorded():
            try:
                engine, files = self.engine, self.files
                datasets = _prepare_datasets(spec)
                engine.build()
                engine.announce(files)
                self.sampler = _sampler(spec, datasets, engine.dp_rank)
                loading = time.perf_counter()
                start = start_from(engine, run_dir, resume, spec, files)
                self._announce(start, load_s=time.perf_counter() - loading)
                self._begin_at(start)
                step_profiler = StepProfiler(spec.profile, run_dir, engine.rank, first_step=start.step)
                self.profile = ProfileReport(step_profiler, files, engine.world_size,
                                             engine.pipeline_schedule_record() if step_profiler.enabled else None)
                self.validation = {source.name: validation_batches(spec, load_tokens(d.val_path))
                                   for source, d in zip(blend_sources(spec), datasets)} if spec.eval_every else {}
                self.recorder = StepRecorder(spec, engine, files)
                self.checkpointer = Checkpointer(spec, engine, run_dir, files, datasets[0].tokenizer_path, start)
                self.spikes, self.skips = SpikeGuard(spec.spike_factor, spec.spike_window), DataSkips(run_dir)
                self.stragglers = StragglerWatch(spec.straggler_factor, spec.straggler_window,
                                                 _hosts(engine, self.heartbeat.host))
            except BaseException:
                self.close()
                raise

    def train(self) -> str:
        """Step until the spec's last step or an agreed stop, then write the final event; "finished" or
        "stopped". The rank's heartbeat and engine are closed whichever way it ends."""
        with self.files.failure_recorded():
            try:
                stopping = False
                while self.step < self.spec.steps and not stopping:
                    stopping = self.train_step()
                return self._finish("stopped" if stopping else "finished")
            finally:
                self.close()

    def train_step(self) -> bool:
        """One step and what follows it: its metrics row, the guards, then (unless a spike sent the run back) the
        profiler, evaluation, the stop agreement and the checkpoint cadence. True: the run stops here (saved)."""
        spec, engine, heartbeat = self.spec, self.engine, self.heartbeat
        lr = lr_at(self.step, spec.optimizer, spec.steps)
        heartbeat.enter(Phase.STEP, self.step)
        _synchronize(engine.device)
        t0 = time.perf_counter()
        result = engine.train_step(self.sampler.micro_batches(self.skips.data_step(self.step)), lr,
                                   measure=self.recorder.measuring)
        _synchronize(engine.device)
        step_time = time.perf_counter() - t0
        self.step += 1
        heartbeat.step_done(self.step, step_time)
        self.tokens_seen += self.sampler.tokens_per_step
        figures = self.recorder.record(result, step=self.step, tokens_seen=self.tokens_seen, lr=lr,
                                       step_time=step_time)
        self._name_stragglers(self.stragglers.observe(figures.get("compute_s", [])))
        spike = self.spikes.check(self.step, result.loss)
        if spike:
            heartbeat.enter(Phase.STARTING)  # loading, as when an attempt starts
            # the guard keeps its window: the steps before the spike are the measure of the steps after it
            self._begin_at(self._roll_back(spike))
            return False
        self.profile.after_step()
        if spec.eval_every and self.step % spec.eval_every == 0:
            heartbeat.enter(Phase.EVALUATING)
            self.evaluate()
            heartbeat.enter(Phase.STEP)  # the stop agreement: a collective, as a step's are
        stopping = self.stop.agreed(engine.device) or self.step == self.stop_at
        heartbeat.enter(Phase.SAVING)
        self.checkpointer.after_step(self.step, self.tokens_seen, stopping)
        return stopping

    def evaluate(self) -> None:
        """The validation loss of each source (one without a blend); a blend's val_loss is their mean by weight."""
        spec, files = self.spec, self.files
        losses = {name: self.engine.evaluate(b) for name, b in self.validation.items()}
        if not spec.blend:
            (val_loss,) = losses.values()
            files.metric(EvalMetrics(step=self.step, val_loss=val_loss))
        else:
            weights = {source.name: source.weight for source in blend_sources(spec)}
            val_loss = sum(weights[n] * loss for n, loss in losses.items()) / sum(weights.values())
            files.metric(EvalMetrics(step=self.step, val_loss=val_loss, val_loss_by_source=losses))
        files.log(f"step {self.step} val_loss {val_loss:.4f}" + "".join(f" {n} {v:.4f}" for n, v in losses.items()
                                                                       if spec.blend))

    def close(self) -> None:
        """The rank's last heartbeat, then the engine's own resources."""
        self.heartbeat.stop()
        self.engine.close()

    def _begin_at(self, start: Start) -> None:
        self.step, self.tokens_seen = start.step, start.tokens_seen

    def _announce(self, start: Start, load_s: float) -> None:
        """The "started" event and the engine's layout in the log."""
        described = self.engine.describe()
        self.files.event(Event.STARTED, step=start.step, world_size=self.engine.world_size, load_s=round(load_s, 6),
                         resumed_from=str(start.resumed_from) if start.resumed_from else None,
                         started_from=str(start.started_from) if start.started_from else None, **described.started)
        self.files.log(described.layout)

    def _roll_back(self, spike: Spike) -> Start:
        """Back to the newest checkpoint, the batches since skipped (spikes.py): the run goes on from there."""
        spec, engine, files = self.spec, self.engine, self.files
        back = self.skips.roll_back(spike, spec.spike_factor, engine.checkpoint_format, write=engine.rank == 0)
        manifest = engine.load(back.folder)
        skip = back.skip
        files.event(Event.LOSS_SPIKE, step=spike.step, loss=skip.loss, median=spike.median, factor=spec.spike_factor,
                    rolled_back_to=manifest.step, skipped_steps=[skip.after_step + 1, skip.spike_step])
        files.log(f"loss spike: {spike.describe(spec.spike_factor)}; back to step {manifest.step} ({back.folder}), "
                  f"skipping the batches of steps {skip.after_step + 1}–{skip.spike_step}")
        return Start(step=manifest.step, tokens_seen=manifest.tokens_seen, resumed_from=back.folder)

    def _name_stragglers(self, found: list[Straggler]) -> None:
        window = self.spec.straggler_window
        for s in found:
            self.files.event(Event.STRAGGLER, step=self.step, straggler={"rank": s.rank, "host": s.host},
                             compute_s=s.compute_s, others_s=s.others_s, ratio=s.ratio, window=window,
                             message=s.describe(window))

    def _finish(self, outcome: str) -> str:
        """A finished run's last checkpoint, the profile's end, the final event; every rank leaves together."""
        if outcome == "finished":
            self.heartbeat.enter(Phase.SAVING)
            self.checkpointer.at_end(self.step, self.tokens_seen)
        self.profile.close()
        self.files.event(Event.FINISHED if outcome == "finished" else Event.STOPPED, step=self.step,
                         tokens_seen=self.tokens_seen)
        self.files.log(f"{outcome} at step {self.step}")
        if self.engine.world_size > 1:
            dist.barrier()
        return outcome


def _prepare_datasets(spec: RunSpec) -> list[PreparedData]:
    """The run's dataset, then a blend's others, tokenized as the run's own is: an id means one token in all."""
    data = prepare_dataset(spec.dataset, spec.model.vocab_size, tokenizer=init_tokenizer(spec))
    return [data] + [prepare_dataset(source.dataset, spec.model.vocab_size, tokenizer=data.tokenizer_path)
                     for source in spec.blend]


def _sampler(spec: RunSpec, datasets: list[PreparedData], dp_rank: int) -> BatchSampler:
    """This rank's share of each step's batches: of the run's dataset, or of the blend by its weights."""
    plan = spec.plan
    windows = dict(seq_len=spec.model.seq_len, micro_batch=plan.micro_batch, grad_accum=plan.grad_accum,
                   dp_rank=dp_rank, dp_size=plan.dp, seed=spec.seed)
    if spec.blend:
        return BlendSampler([load_tokens(d.train_path) for d in datasets],
                            [source.weight for source in blend_sources(spec)], **windows)
    return BatchSampler(load_tokens(datasets[0].train_path), **windows)


def _hosts(engine: Engine, mine: str) -> list[str]:
    """Every rank's host, in rank order (one gather as the run starts)."""
    if engine.world_size == 1:
        return [mine]
    hosts = [None] * engine.world_size
    dist.all_gather_object(hosts, mine)
    return hosts


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
