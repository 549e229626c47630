"""Redis stopped and started again while a run trains: the worker reconnects, reconcile catches up, nothing is lost.

The Redis is the test's own and keeps nothing on disk, so its restart loses every queued message and every stored
task result, as a crashed broker would. The runs do not depend on either: a job runs detached from the worker, the
run folder and the database hold its state, and the test never reads a task's result; it only sends reconcile
passes, as beat would, and watches the database. A run queued while the broker is down, whose launch message could
not be sent, is launched by reconcile once it has waited long enough for its message to count as lost.
"""
import time
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from django.utils import timezone
from kombu.exceptions import OperationalError

from tests.workers.own_broker import OwnRedis, start_worker, stop, wait_until_consuming, worker_env
from tests.xdist_groups import run_temp_root
from trainer.contract.runfolder import METRICS, read_jsonl
from webapp import models, services
from webapp.models import RunStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STEPS = 1500  # about ten seconds of training for the two-layer model on one idle CPU


@pytest.fixture
def own_redis(tmp_path, settings):
    """A Redis of the test's own, which the web side's tasks (the run's launch) go to."""
    from webapp.services import tasks
    redis = OwnRedis(tmp_path / "redis")
    redis.start()
    settings.CELERY_BROKER_URL = settings.CELERY_RESULT_BACKEND = redis.url
    tasks._client.cache_clear()
    yield redis
    tasks._client.cache_clear()
    redis.stop()


@pytest.fixture
def own_worker(own_redis, tmp_path, tmp_path_factory):
    log = tmp_path / "worker.log"
    worker = start_worker(worker_env(own_redis.url, tmp_path / "var", run_temp_root(tmp_path_factory)), log, "restart")
    yield worker, log
    stop(worker)


def _reconcile(client: Celery) -> None:
    """One reconcile pass sent, its result never asked for."""
    try:
        client.send_task("workbench.runs.reconcile")
    except OperationalError:  # the broker is not back yet: the next pass goes
        pass


def _reconcile_until(client, run_id: int, done, log, timeout: float = 120) -> models.Run:
    deadline = time.monotonic() + timeout
    while not done(run := models.Run.objects.get(pk=run_id)):
        assert time.monotonic() < deadline, f"run {run_id} is {run.status}: {run.status_message}\n" \
                                            f"{log.read_text()[-3000:]}"
        _reconcile(client)
        time.sleep(0.5)
    return run


def _trained(run: models.Run) -> int:
    """The steps the run folder holds (not the database: nothing is ingested while the broker is down)."""
    return sum(1 for _, record in read_jsonl(Path(run.run_dir) / METRICS) if "loss" in record)


@pytest.mark.once  # a broker and a worker restarted around a real run: once, on the first database
def test_a_run_trained_across_a_broker_restart_completes_with_every_step_ingested(own_redis, own_worker,
                                                                                 tiny_run_parts):
    worker, log = own_worker
    client = Celery(broker=own_redis.url, backend=own_redis.url)
    wait_until_consuming(client, worker, log)
    owner, plan, dataset = tiny_run_parts
    run = services.run_create(owner=owner, name="across", plan=plan, dataset=dataset, steps=STEPS, launch=True)
    run = _reconcile_until(client, run.pk, lambda r: r.status == RunStatus.RUNNING and r.last_step >= 1, log)

    own_redis.stop()
    stopped_at = _trained(run)
    # A run queued meanwhile: the row commits, its launch message cannot be sent (the request would answer 500).
    queued = services.run_create(owner=owner, name="meanwhile", plan=plan, dataset=dataset, steps=20)
    with pytest.raises(OperationalError):
        services.run_queue(queued)
    unsent = models.Run.objects.get(pk=queued.pk)
    assert unsent.status == RunStatus.QUEUED and unsent.launch_sent_at is None  # not sent: a pass may send it
    time.sleep(3)  # the job trains on, and the worker keeps trying the broker
    assert _trained(run) > stopped_at, "the run did not train while the broker was down: make it longer"
    own_redis.start()
    assert worker.poll() is None, log.read_text()[-3000:]
    # reconcile sends a launch again for a run queued over two minutes ago without a claim: as if that long ago
    models.Run.objects.filter(pk=queued.pk).update(queued_at=timezone.now() - timedelta(minutes=3))

    for one in (run, queued):
        one = _reconcile_until(client, one.pk, lambda r: r.is_finished and r.ingest_state.get("job_ended"), log)
        assert one.status == RunStatus.COMPLETED, one.status_message
        steps = list(one.metrics.filter(kind="train").order_by("step").values_list("step", flat=True))
        assert steps == list(range(1, one.steps + 1)) and one.last_step == one.steps and one.attempts == 1
    assert "Connection to broker lost" in log.read_text()  # the worker did lose it, and came back


def test_a_worker_keeps_trying_its_broker_for_as_long_as_it_is_away():
    """Celery's default gives up after 100 tries, some 50 minutes, and the worker then exits."""
    from workers.celery_app import app

    assert app.conf.broker_connection_retry is True and app.conf.broker_connection_max_retries is None
