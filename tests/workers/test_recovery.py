"""Runs that survive failures: a rank killed with SIGKILL restarts from the newest checkpoint, and a Slurm job that
reaches its time limit checkpoints, is requeued and resumes; both end with the loss of a run that was never
interrupted. Real worker, real torchrun, real Slurm."""
import json
import os
import signal
from pathlib import Path

import pytest

from tests.worker_fixtures import final_loss, log_tails, reconcile_until
from trainer.contract import ParallelPlan, presets
from trainer.contract.runfolder import METRICS, SPEC, read_jsonl
from webapp import models, services

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _plan(owner, model, cluster: models.Cluster, **fields) -> models.ParallelismPlan:
    return models.ParallelismPlan.objects.create(
        owner=owner, name=f"p{models.ParallelismPlan.objects.count()}", model_config=model, cluster=cluster,
        spec=ParallelPlan(micro_batch=2, global_batch=4, **fields).to_dict())


def _train_records(run: models.Run) -> list[dict]:
    """Every step record in the order written: an attempt that resumes writes its steps again after the last."""
    return [r for _, r in read_jsonl(Path(run.run_dir) / METRICS) if "loss" in r and "step" in r]


def _steps_redone(run: models.Run) -> int:
    """Steps trained twice: those the killed attempt did beyond the checkpoint the next one resumed from (every
    step's record is written again when it is redone)."""
    return len(_train_records(run)) - run.steps


def _rank_pid(run_dir: str, rank: int) -> int | None:
    """The pid of the trainer process of ``rank`` in the run (its environment names the rank, its command line the
    run's spec)."""
    spec = str(Path(run_dir) / SPEC).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if spec in command and b"torch.distributed.run" not in command and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


@pytest.mark.once
def test_a_rank_killed_mid_run_restarts_from_its_newest_checkpoint_and_ends_with_the_uninterrupted_loss(
        broker, tiny_run_parts):
    owner, one_rank, dataset = tiny_run_parts
    cluster = models.Cluster.objects.create(name="local-2", spec=presets.local_cpu_cluster(2).to_dict())
    plan = _plan(owner, one_rank.model_config, cluster, dp=2)
    every = 20
    killed = services.run_create(owner=owner, name="killed", plan=plan, dataset=dataset, steps=200,
                                 checkpoint_every=every, max_restarts=1, launch=True)
    running = reconcile_until(broker, killed.pk, lambda r: r.status == "running" and r.last_step >= every + 5)
    pid = _rank_pid(running.run_dir, 1)
    assert pid is not None, "rank 1's process was not found"
    os.kill(pid, signal.SIGKILL)
    # the reference waits for the machine's two CPU slots, which the killed run holds until it completes
    reference = services.run_create(owner=owner, name="uninterrupted", plan=plan, dataset=dataset, steps=200,
                                    checkpoint_every=every, max_restarts=0, launch=True)
    waiting = reconcile_until(broker, reference.pk, lambda r: r.status_message.startswith("waiting"))
    assert (waiting.status, waiting.status_message) == ("queued", "waiting for 2 free CPU slots: 2 of 2 are in use "
                                                                  "by other runs")
    killed = reconcile_until(broker, killed.pk, lambda r: r.is_finished and r.ingest_state.get("job_ended"),
                             timeout=300)
    assert killed.status == "completed", killed.status_message
    first, second = killed.attempt_records.order_by("number")
    assert (first.state, first.counts_as_restart, second.resume) == ("FAILED", True, True), first.reason
    assert (killed.attempts, killed.restarts) == (2, 1)
    assert 0 <= _steps_redone(killed) <= every, _steps_redone(killed)
    assert killed.history.filter(source="trainer", kind="started", data__resumed_from__isnull=False).exists()
    reference = reconcile_until(broker, reference.pk, lambda r: r.is_finished, timeout=300)
    assert reference.status == "completed" and reference.attempts == 1, reference.status_message
    assert abs(final_loss(killed) - final_loss(reference)) <= 1e-6, (final_loss(killed), final_loss(reference))


@pytest.mark.once
# each release's REST API (its fields differ from release to release), and Slurm's commands on one release
@pytest.mark.parametrize("any_slurm, kind", [("22.05", "slurm"), ("22.05", "slurm-rest"), ("24.11", "slurm-rest")],
                         indirect=["any_slurm"])
def test_a_slurm_run_longer_than_its_time_limit_checkpoints_requeues_and_ends_with_the_uninterrupted_loss(
        broker, tiny_run_parts, any_slurm, kind):
    """Through Slurm's commands and through slurmrestd; the reference through the commands."""
    owner, one_rank, dataset = tiny_run_parts
    model = one_rank.model_config

    def cluster(name: str, kind: str = "slurm", **fields) -> models.Cluster:
        return models.Cluster.objects.create(
            name=name, kind=kind, spec=presets.local_cpu_cluster(1).to_dict(), partition=any_slurm.partition,
            rest_url=any_slurm.rest_url if kind == "slurm-rest" else "",
            env_setup=[f"export GLOO_SOCKET_IFNAME={any_slurm.interface}"], **fields)

    # Slurm's shortest limit is a minute. Asked to stop 50 s before it, the first attempt starts, trains for what is
    # left of 10 s, saves and stops; once it has, the limit is lifted (as staff would for a run that needs longer), so
    # that however fast or loaded the machine, the run ends in an attempt or two more rather than in many short ones.
    limited = cluster("one-minute", kind, time_limit="1", stop_before_limit_s=50)
    steps = 1500  # more than 10 s of training even at 10 ms a step (10-40 ms here, more under load)
    run = services.run_create(owner=owner, name="limited", plan=_plan(owner, model, limited), dataset=dataset,
                              steps=steps, checkpoint_every=200, max_restarts=0, launch=True)
    reference = services.run_create(owner=owner, name="unlimited", plan=_plan(owner, model, cluster("unlimited")),
                                    dataset=dataset, steps=steps, checkpoint_every=200, launch=True)
    reconcile_until(broker, run.pk, lambda r: r.history.filter(source="trainer", kind="stopped").exists(),
                    timeout=240)
    models.Cluster.objects.filter(pk=limited.pk).update(time_limit="")
    run = reconcile_until(broker, run.pk, lambda r: r.is_finished and r.ingest_state.get("job_ended"), timeout=420)
    assert run.status == "completed", f"{run.status_message}\n{log_tails(run)}"
    attempts = list(run.attempt_records.order_by("number"))
    assert len(attempts) >= 2 and run.restarts == 0 and {a.backend for a in attempts} == {kind}
    assert all(a.why == "requeued after its time limit" for a in attempts[1:]), [a.why for a in attempts]
    # The script's own timer signals the attempts under the limit (no Slurm signal on a minute), all but a last one
    # that may finish before it (one launched before the limit was lifted)
    limited_attempts = [a for a in attempts if "#SBATCH --time=1\n" in a.script]
    assert limited_attempts and all("sleep 10 && kill -USR1" in a.script and "#SBATCH --signal" not in a.script
                                    for a in limited_attempts)
    signalled = run.history.filter(source="trainer", kind="time_limit_near").count()
    assert len(limited_attempts) - 1 <= signalled <= len(limited_attempts)
    reference = reconcile_until(broker, reference.pk, lambda r: r.is_finished, timeout=300)
    assert reference.status == "completed" and reference.attempts == 1, reference.status_message
    assert abs(final_loss(run) - final_loss(reference)) <= 1e-6
    assert json.loads(Path(run.run_dir, "launch.json").read_text())["resume"] is True
