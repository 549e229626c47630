"""Short real trials on the local machine: the ``measure(plan) -> seconds per step`` that trial mode calls.

    measure = LocalTrials(model, dataset, root=Path("trials"))
    seconds = measure(plan)          # one trainer launch; its run folder stays under root

Each call writes a RunSpec (the plan on ``presets.local_cpu_cluster(plan.world_size)``, fp32 unless the plan says
otherwise) into a fresh folder under ``root`` and launches the trainer as a subprocess — torchrun (standalone
rendezvous, so concurrent trials never share a port) for several processes, a plain ``python -m trainer`` for one.
The trial's step time is the median of the steps after ``warmup``: the first steps pay for allocator growth, the
trainer's one-off memory probe and gloo's connection set-up, and a median ignores the odd step another process on
the machine slowed down.

Standard library only, like the rest of the planner: torch runs in the child processes, never here.
"""
from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from trainer.contract.command import trainer_command
from trainer.contract.presets import local_cpu_cluster
from trainer.contract.records import Event, step_times
from trainer.contract.runfolder import EVENTS, METRICS, SPEC, read_jsonl, write_json_atomic
from trainer.contract import DatasetSpec, ModelSpec, OptimizerSpec, ParallelPlan, RunSpec, SpecError

# The repository root goes on the children's PYTHONPATH: a trial runs this checkout's trainer, installed or not.
REPO = Path(__file__).resolve().parents[3]
LAUNCH_LOG = "launch.log"      # the launcher's stdout and stderr (each rank also writes logs/rank-<r>.log)
RESULT = "trial.json"          # what the trial measured, beside metrics.jsonl
TAIL_CHARS = 3000


class TrialError(RuntimeError):
    """A trial that gave no step time; the message carries the reason and the tail of the trial's log."""

    def __init__(self, message: str, plan: ParallelPlan, run_dir: Path, returncode: int | None = None,
                 log_tail: str = ""):
        super().__init__(f"{message}\n--- {run_dir / LAUNCH_LOG} (tail) ---\n{log_tail}" if log_tail else message)
        self.plan, self.run_dir, self.returncode, self.log_tail = plan, run_dir, returncode, log_tail


def plan_label(plan: ParallelPlan) -> str:
    """A short name for a plan, also used as the prefix of its trial folder."""
    parts = [f"dp{plan.dp}", f"tp{plan.tp}", f"pp{plan.pp}", f"b{plan.micro_batch}"]
    if plan.sequence_parallel:
        parts.append("sp")
    if plan.engine != "native" or plan.zero_stage:
        parts.append(("" if plan.engine == "native" else "ds-") + f"z{plan.zero_stage}")
    if plan.activation_checkpointing != "none":
        parts.append(f"ac-{plan.activation_checkpointing}")
    if plan.precision != "fp32":
        parts.append(plan.precision)
    if plan.pp > 1:
        parts.append(plan.pipeline_schedule + (f"{plan.virtual_stages}" if plan.virtual_stages > 1 else ""))
    return "-".join(parts)


@dataclass(frozen=True)
class StepTiming:
    median_s: float    # median step_time_s of the counted steps
    steps: int         # how many steps were counted


def step_time_from_metrics(path: Path, warmup: int) -> StepTiming:
    """The step times of a metrics.jsonl after the first ``warmup`` steps.

    Evaluation records carry no step_time_s and are skipped; so is a torn last line (the file discipline allows one).
    """
    if not Path(path).is_file():
        raise ValueError(f"{path} does not exist")
    times = step_times([record for _, record in read_jsonl(path)], after_step=warmup)
    if not times:
        raise ValueError(f"{path} has no step after the {warmup} warm-up step(s)")
    return StepTiming(statistics.median(times), len(times))


def _tail(path: Path, chars: int = TAIL_CHARS) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _failure_reason(run_dir: Path) -> str:
    """The trainer's own account: the last 'failed' event's error, if it wrote one."""
    failures = [record for _, record in read_jsonl(run_dir / EVENTS) if record.get("event") == Event.FAILED]
    return str(failures[-1].get("error", "")) if failures else ""


class LocalTrials:
    """``measure(plan) -> seconds per step`` by short trainer runs on the local machine.

    ``steps`` measured steps follow ``warmup`` discarded ones. Every trial reads the same prepared dataset: when
    ``dataset.prepared_dir`` is empty it is pointed at ``root/data``, so the first trial tokenizes the text (under the
    trainer's lock) and the rest find it prepared. ``progress(event)`` hears of each trial's start, end and failure.
    """

    def __init__(self, model: ModelSpec, dataset: DatasetSpec, root: Path, steps: int = 20, warmup: int = 5,
                 seed: int = 1234, timeout_s: float = 600.0, progress: Callable[[dict], None] | None = None,
                 python: str = sys.executable, threads: int = 1):
        if steps < 1 or warmup < 0:
            raise SpecError.single("steps", f"steps={steps} must be ≥ 1 and warmup={warmup} ≥ 0")
        self.root = Path(root)
        self.model, self.steps, self.warmup, self.seed = model, steps, warmup, seed
        self.dataset = dataset if dataset.prepared_dir else replace(dataset, prepared_dir=str(self.root / "data"))
        self.timeout_s, self.progress, self.python, self.threads = timeout_s, progress, python, threads
        self.runs: list[dict] = []   # one record per finished trial, in order

    def spec_for(self, plan: ParallelPlan, run_dir: Path) -> RunSpec:
        """The trial's RunSpec; raises SpecError when the plan does not fit the model (nothing is launched)."""
        return RunSpec(model=self.model, plan=plan, cluster=local_cpu_cluster(plan.world_size), dataset=self.dataset,
                       output_dir=str(run_dir), steps=self.warmup + self.steps, seed=self.seed,
                       # a constant rate: the trial times steps, and a schedule would only add a parameter to explain
                       optimizer=OptimizerSpec(lr=1e-3, min_lr=1e-3, schedule="constant"),
                       log_every=self.warmup + self.steps, name=f"trial {plan_label(plan)}").validate()

    def command(self, plan: ParallelPlan, spec_path: Path) -> list[str]:
        # one node, standalone rendezvous for several ranks; a world of one runs the trainer alone
        return trainer_command(["--spec", str(spec_path)], nproc_per_node=plan.world_size, launcher_for_one=False,
                               python=self.python)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Each rank one thread: ranks share the cores, and a thread pool per rank would fight over them.
        env["OMP_NUM_THREADS"] = str(self.threads)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        env.pop("DJANGO_SETTINGS_MODULE", None)  # the trainer never loads Django; a stray setting only confuses
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)  # a trial is its own job, whatever job this process belongs to
        return env

    def __call__(self, plan: ParallelPlan) -> float:
        self.root.mkdir(parents=True, exist_ok=True)
        label = plan_label(plan)
        try:  # a plan that cannot run leaves no folder behind
            spec = self.spec_for(plan, self.root / label)
        except SpecError as exc:
            raise TrialError(f"trial {label}: the plan cannot run: {exc}", plan, self.root) from None
        # mkdtemp: a fresh folder even when several tuners share the root
        run_dir = Path(tempfile.mkdtemp(prefix=f"{len(self.runs):03d}-{label}-", dir=self.root))
        spec = spec.replace(output_dir=str(run_dir))
        spec_path = run_dir / SPEC
        write_json_atomic(spec_path, spec.to_dict())
        cmd = self.command(plan, spec_path)
        self._report({"phase": "measure", "event": "started", "plan": label, "run_dir": str(run_dir),
                      "processes": plan.world_size})
        started = time.perf_counter()
        returncode = self._launch(cmd, run_dir)
        wall = time.perf_counter() - started
        log = run_dir / LAUNCH_LOG
        if returncode != 0:
            what = ("timed out after {:.0f} s".format(self.timeout_s) if returncode is None else
                    "was refused by the trainer" if returncode == 2 else f"failed (exit {returncode})")
            reason = _failure_reason(run_dir) or _refusal(log)
            self._report({"phase": "measure", "event": "failed", "plan": label, "run_dir": str(run_dir),
                          "returncode": returncode, "reason": reason})
            raise TrialError(f"trial {label} {what}" + (f": {reason}" if reason else ""), plan, run_dir,
                             returncode, _tail(log))
        try:
            timing = step_time_from_metrics(run_dir / METRICS, self.warmup)
        except (OSError, ValueError) as exc:
            raise TrialError(f"trial {label} finished without step times: {exc}", plan, run_dir, 0,
                             _tail(log)) from None
        seconds, counted = timing.median_s, timing.steps
        record = {"plan": plan.to_dict(), "label": label, "processes": plan.world_size, "step_time_s": seconds,
                  "steps_counted": counted, "warmup": self.warmup, "wall_s": wall, "run_dir": str(run_dir),
                  "command": cmd}
        write_json_atomic(run_dir / RESULT, record)
        self.runs.append(record)
        self._report({"phase": "measure", "event": "finished", "plan": label, "run_dir": str(run_dir),
                      "step_time_s": seconds, "wall_s": wall})
        return seconds

    def _launch(self, cmd: list[str], run_dir: Path) -> int | None:
        """The exit status, or None when the trial outran the timeout (then its whole process group is killed)."""
        with open(run_dir / LAUNCH_LOG, "wb") as log:
            # a process group of its own: on a timeout, torchrun and every rank it started go down together
            proc = subprocess.Popen(cmd, cwd=run_dir, env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                return proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return None
            except BaseException:
                _kill_group(proc)  # an interrupted tuner must not leave ranks spinning on the cores
                raise

    def _report(self, event: dict) -> None:
        if self.progress:
            self.progress(event)


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


_ERROR_LINE = re.compile(r"^error: (.*)$", re.MULTILINE)


def _refusal(log: Path) -> str:
    """The trainer's refusals (exit 2) are its 'error: …' lines; the first ranks' copies are the same text."""
    seen: list[str] = []
    for reason in _ERROR_LINE.findall(_tail(log, 20000)):
        if reason not in seen:
            seen.append(reason)
    return "; ".join(seen)
