"""A tuning job with real trials: queued over REST, run by the worker, trials trained by the trainer."""
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from trainer.contract import ParallelPlan
from trainer.contract.presets import DEMO_TEXT
from webapp import models

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TINY = {"n_layers": 2, "d_model": 32, "n_heads": 2, "seq_len": 32, "vocab_size": 300}
ONE_CPU = {"gpu": "cpu", "nodes": 1, "gpus_per_node": 1}


@pytest.fixture
def tune_client(worker, redis_url, settings, tmp_path):
    """A client with a token, and a dataset of a little Shakespeare; the worker hears of the jobs it queues."""
    from webapp.services import tasks
    settings.CELERY_BROKER_URL = settings.CELERY_RESULT_BACKEND = redis_url
    tasks._client.cache_clear()
    settings.WORKBENCH = {**settings.WORKBENCH, "RUNS_ROOT": tmp_path / "runs", "DATA_ROOTS": [tmp_path]}
    owner = User.objects.create_user("tuner")
    corpus = tmp_path / "text.txt"
    corpus.write_text(DEMO_TEXT.read_text()[:100_000])
    dataset = models.Dataset.objects.create(owner=owner, name="text", path=str(corpus))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=owner).key}")
    yield client, dataset
    tasks._client.cache_clear()


def _finished(job_id: int, seconds: float) -> models.TuneJob:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        job = models.TuneJob.objects.get(pk=job_id)
        if job.status in ("done", "failed"):
            return job
        time.sleep(0.5)
    pytest.fail(f"tune job {job_id} still {job.status} after {seconds} s")


@pytest.mark.once  # trial processes measured: once, on the first database
def test_it_measures_the_best_plans_and_reports_progress(tune_client):
    client, dataset = tune_client
    request = {"model": TINY, "cluster": ONE_CPU, "global_batch": 4, "trials": {"dataset": dataset.id, "steps": 6}}
    response = client.post("/api/tune/", request, format="json")
    assert response.status_code == 202, response.data
    job = _finished(response.data["id"], 240)
    assert job.status == "done", job.message
    trials = job.report["trials"]
    assert 1 <= len(trials["measured"]) <= max(1, trials["pool"] // 3) and trials["failed"] == []
    assert all(c["measured_step_time_s"] > 0 for c in trials["measured"])
    assert trials["best"]["measured_step_time_s"] == min(c["measured_step_time_s"] for c in trials["measured"])
    assert job.progress["trials_done"] >= len(trials["measured"]) and job.progress["last"]["phase"] == "done"


def _trial_processes(markers: tuple[str, ...]):
    """(pid, spec path) of the live processes whose command line names a spec whose path contains every one of
    ``markers``: a trial's trainer (or its torchrun)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone since the listing
            continue
        for flag, value in zip(args, args[1:]):
            if flag == b"--spec" and all(m in value.decode(errors="replace") for m in markers):
                yield int(entry.name), Path(value.decode())


class TrialKiller(threading.Thread):
    """SIGKILLs the first trial process whose spec path contains ``markers``, as the kernel's OOM killer would."""

    def __init__(self, *markers: str, timeout_s: float):
        super().__init__(daemon=True)
        self.markers, self.timeout_s = markers, timeout_s
        self.killed: Path | None = None   # the spec of the trial it killed
        self.stop = threading.Event()     # set once the job is over: a later job must not lose a trial to it

    def run(self):
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline and not self.stop.is_set():
            for pid, spec in _trial_processes(self.markers):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                self.killed = spec
                return
            self.stop.wait(0.05)


def test_a_killed_trial_is_recorded_as_failed_and_the_job_measures_the_rest(tune_client, tmp_path_factory):
    """One trial's process dies of SIGKILL; the job completes with that trial failed and the other measured."""
    client, dataset = tune_client
    # two trials: the pool of the two best estimates, all of it measured
    request = {"model": TINY, "cluster": ONE_CPU, "global_batch": 4, "trial_pool": 2, "max_fraction": 1,
               "trials": {"dataset": dataset.id, "steps": 4}}
    response = client.post("/api/tune/", request, format="json")
    assert response.status_code == 202, response.data
    job_id = response.data["id"]
    # the worker's run folders lie under this session's temporary folder (its WORKBENCH_VAR), one per job: no other
    # test session's trials match
    killer = TrialKiller(f"{tmp_path_factory.getbasetemp()}{os.sep}", f"{os.sep}tune-{job_id}{os.sep}",
                         timeout_s=120)
    killer.start()
    try:
        job = _finished(job_id, 180)
    finally:
        killer.stop.set()
        killer.join()
    assert killer.killed is not None, "no trial process appeared to kill"
    assert job.status == "done", job.message
    trials = job.report["trials"]
    killed_plan = ParallelPlan.from_dict(json.loads(killer.killed.read_text())["plan"])
    assert [ParallelPlan.from_dict(c["plan"]) for c in trials["failed"]] == [killed_plan]
    failed = trials["failed"][0]
    assert "exit -9" in failed["failed"] and "\n" not in failed["failed"] and failed["measured_step_time_s"] is None
    assert trials["tried"] == 2 and len(trials["measured"]) == 1
    measured = trials["measured"][0]
    assert ParallelPlan.from_dict(measured["plan"]) != killed_plan and measured["measured_step_time_s"] > 0
    assert trials["best"] == measured
    assert job.report["best"] == trials["best"] and "1 more failed" in trials["note"]
    assert job.progress["trials_done"] == 2 and job.progress["trials_failed"] == 1
