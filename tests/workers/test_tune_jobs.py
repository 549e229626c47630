"""A tuning job with real trials: queued over REST, run by the worker, trials trained by the trainer."""
import time

import pytest
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from trainer.contract.presets import DEMO_TEXT
from webapp import models

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_it_measures_the_best_plans_and_reports_progress(worker, redis_url, settings, tmp_path):
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

    request = {"model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "seq_len": 32, "vocab_size": 300},
               "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 1}, "global_batch": 4,
               "trials": {"dataset": dataset.id, "steps": 6}}
    response = client.post("/api/tune/", request, format="json")
    assert response.status_code == 202, response.data
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        job = models.TuneJob.objects.get(pk=response.data["id"])
        if job.status in ("completed", "failed"):
            break
        time.sleep(1)
    assert job.status == "completed", job.error
    trials = job.result["trials"]
    assert 1 <= len(trials["measured"]) <= max(1, trials["pool"] // 3)
    assert all(c["measured_step_time_s"] > 0 for c in trials["measured"])
    assert trials["best"]["measured_step_time_s"] == min(c["measured_step_time_s"] for c in trials["measured"])
    assert job.progress["trials_done"] >= len(trials["measured"]) and job.progress["last"]["phase"] == "done"
    tasks._client.cache_clear()
