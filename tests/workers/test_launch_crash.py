"""A worker killed with SIGKILL after sbatch has submitted the job and before the run records it: one job, recorded.

The worker's PATH starts with an sbatch that runs the real one, writes the job id down and then sleeps, so the kill
lands exactly between submitting and recording. The launch task was not acknowledged (task_acks_late), so Redis
gives it back once its visibility timeout has passed (tests/workers/redelivery_app.py makes that seconds) to a
worker started afterwards without the wrapper; the launch looks the job up by its name before it submits anything.
(task_reject_on_worker_lost gives a task back at once when a prefork child dies; here the whole worker dies.)

Each test has its own Redis and its own workers: the session's worker never takes these tasks.
"""
import re
import shutil
import time
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from celery.result import AsyncResult
from django.utils import timezone

from tests.worker_fixtures import reconcile_until
from tests.workers.own_broker import OwnRedis, kill, start_worker, stop, worker_env
from tests.workers.redelivery_app import VISIBILITY_TIMEOUT_S
from tests.xdist_groups import run_temp_root
from trainer.contract import ParallelPlan, presets
from webapp import models, services
from webapp.models import RunStatus
from workers.launchers import job_name, row_stamp
from workers.runs import launchable_run_ids, reconcile_pass

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

APP = "tests.workers.redelivery_app"
LAUNCH = "workbench.runs.launch"
SLOW_SBATCH = """#!/bin/bash
# The real sbatch; then, before its answer reaches the worker, the job id in a file and a long pause.
answer=$({real} "$@") || exit $?
printf '%s\\n' "$answer" > "$SUBMITTED.tmp" && mv "$SUBMITTED.tmp" "$SUBMITTED"
exec sleep 600
"""


class Crash:
    """A queued run on the Slurm cluster, its own Redis, and workers to start on it."""

    def __init__(self, folder: Path, slurm_cluster, run: models.Run, redis: OwnRedis, env: dict):
        self.folder, self.slurm, self.run, self.redis, self.env = folder, slurm_cluster, run, redis, env
        self.client = Celery(broker=redis.url, backend=redis.url)
        self.workers = []

    def worker(self, name: str, **extra_env) -> Path:
        """Start a worker (the tasks wait in Redis until it consumes them); its log."""
        log = self.folder / f"{name}.log"
        process = start_worker({**self.env, **extra_env}, log, name, app=APP)
        self.workers.append(process)
        return log

    def jobs(self) -> list[str]:
        """Every job the cluster knows by this run's first attempt's name, whatever its state."""
        name = job_name(self.run.pk, 1, row_stamp(self.run.created_at))
        return self.slurm.run(["squeue", "--noheader", "--states=all", f"--name={name}", "--format=%i"]).stdout.split()

    def launch_killed_after_submitting(self) -> tuple[str, AsyncResult]:
        """The launch task sent to a worker whose sbatch pauses after submitting, and that worker killed in the
        pause: the id of the job it submitted, and the task (whose result comes from the delivery that finishes)."""
        wrapper = self.folder / "bin" / "sbatch"
        wrapper.parent.mkdir()
        wrapper.write_text(SLOW_SBATCH.format(real=shutil.which("sbatch")))
        wrapper.chmod(0o755)
        submitted = self.folder / "submitted"
        log = self.worker("doomed", PATH=f"{wrapper.parent}:{self.env['PATH']}", SUBMITTED=str(submitted))
        result = self.client.send_task(LAUNCH, args=[self.run.pk])
        deadline = time.monotonic() + 90
        while not submitted.exists():
            assert time.monotonic() < deadline, f"sbatch was not called:\n{log.read_text()[-3000:]}"
            time.sleep(0.05)
        kill(self.workers[-1])
        run = models.Run.objects.get(pk=self.run.pk)
        assert (run.status, run.job_id, run.attempts) == (RunStatus.QUEUED, "", 0)  # submitted, not recorded
        assert run.launching_since is not None
        return submitted.read_text().strip().split(";")[0], result

    def stop(self) -> None:
        for process in self.workers:
            stop(process)
        for job_id in self.jobs():
            self.slurm.run(["scancel", job_id], check=False)
        self.redis.stop()


@pytest.fixture
def crash(tiny_run_parts, slurm_cluster, tmp_path, tmp_path_factory, settings):
    owner, local_plan, dataset = tiny_run_parts
    cluster = models.Cluster.objects.create(
        name="slurm-1x1", kind="slurm", spec=presets.cluster("cpu", nodes=1, gpus_per_node=1).to_dict(),
        partition=slurm_cluster.partition, env_setup=[f"export GLOO_SOCKET_IFNAME={slurm_cluster.interface}"])
    plan = models.ParallelismPlan.objects.create(owner=owner, name="one-rank", model_config=local_plan.model_config,
                                                 cluster=cluster, spec=ParallelPlan(micro_batch=2,
                                                                                    global_batch=4).to_dict())
    run = services.run_create(owner=owner, name="crash", plan=plan, dataset=dataset, steps=2)
    run.transition(RunStatus.QUEUED)  # the test sends the launch itself, to keep the task's id
    run.save()
    redis = OwnRedis(tmp_path / "redis")
    redis.start()
    # The web side's tasks (reconcile's launches) go to this Redis too.
    from webapp.services import tasks
    settings.CELERY_BROKER_URL = settings.CELERY_RESULT_BACKEND = redis.url
    tasks._client.cache_clear()
    env = worker_env(redis.url, tmp_path / "var", run_temp_root(tmp_path_factory), **slurm_cluster.env)
    state = Crash(tmp_path, slurm_cluster, run, redis, env)
    yield state
    state.stop()
    tasks._client.cache_clear()


def _launch_results(*logs: Path) -> list[str]:
    """What every launch task run by these workers answered, from their logs."""
    text = "".join(log.read_text() for log in logs)
    return re.findall(rf"Task {re.escape(LAUNCH)}\[[\w-]+\] succeeded in [\d.]+s: '([^']*)'", text)


def test_the_redelivered_launch_adopts_the_job_the_killed_worker_submitted(crash):
    job_id, launch = crash.launch_killed_after_submitting()
    assert crash.jobs() == [job_id]

    log = crash.worker("restarted")
    assert launch.get(timeout=VISIBILITY_TIMEOUT_S + 90) == "submitted"  # the same task, delivered again

    run = models.Run.objects.get(pk=crash.run.pk)
    assert (run.status, run.job_id, run.attempts) == (RunStatus.SUBMITTED, job_id, 1)
    assert "found already submitted" in run.history.get(kind="submitted").message
    run = reconcile_until(crash.client, run.pk, lambda r: r.is_finished and r.ingest_state.get("job_ended"))
    assert run.status == RunStatus.COMPLETED, run.status_message
    assert run.last_step == 2 and crash.jobs() == [job_id]
    assert _launch_results(log)[0] == "submitted"


def test_the_redelivery_racing_reconciles_resends_of_the_abandoned_launch_submits_once(crash):
    job_id, launch = crash.launch_killed_after_submitting()
    # As if the run had been queued, and its worker killed, minutes ago: the claim is stale, reconcile sends the
    # launch again, and any delivery may take the run over.
    long_ago = timezone.now() - timedelta(minutes=10)
    models.Run.objects.filter(pk=crash.run.pk).update(queued_at=long_ago, launching_since=long_ago)
    assert launchable_run_ids() == [crash.run.pk]  # the killed worker took its task: none waits in the queue
    for _ in range(3):  # passes of another worker's beat while these workers were down: the first sends the launch
        reconcile_pass()  # again, the others see it waiting in the queue
    assert launchable_run_ids() == []
    time.sleep(VISIBILITY_TIMEOUT_S)  # and the killed worker's task is due back: two launches wait for two workers
    logs = [crash.worker("first"), crash.worker("second")]
    assert launch.get(timeout=90) in ("submitted", "skipped: run is submitted",
                                      "skipped: another delivery of the launch already recorded this job")

    run = reconcile_until(crash.client, crash.run.pk, lambda r: r.is_finished and r.ingest_state.get("job_ended"))
    assert run.status == RunStatus.COMPLETED, run.status_message
    assert (run.job_id, run.attempts, run.attempt_records.count()) == (job_id, 1, 1)
    assert crash.jobs() == [job_id]
    answers = _launch_results(*logs)
    # whichever came first recorded the job (a task slower than the visibility timeout would even run twice)
    assert len(answers) >= 2 and answers.count("submitted") == 1, answers
    assert run.history.filter(kind="submitted").count() == 1
