"""Preparing a dataset ahead of its runs (workers.preparing): the real ``python -m trainer.data prepare`` process
on JSONL with bad rows, run by the task in this process and, once, by the session's worker through the API; and as
a batch job of its own on the test Slurm cluster (tests/slurm_cluster.py), followed by the task."""
import json
import threading
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from tests.xdist_groups import data_roots
from trainer.contract import presets
from webapp import models
from webapp.services.preparations import dataset_prepare, preparation_claim
from workers import preparing
from workers.launchers import launcher_for

Status = models.DatasetPreparation.Status
pytestmark = pytest.mark.slow


@pytest.fixture
def owner(db):
    return User.objects.create_user("preparer")


@pytest.fixture
def data_root(settings, tmp_path_factory, tmp_path):
    """A folder of the test run's temporary folder, which the session's worker reads as a data root too."""
    settings.WORKBENCH = {**settings.WORKBENCH, "DATA_ROOTS": data_roots(tmp_path_factory)}
    return tmp_path


def _jsonl(path, rows: int, bad_at: set[int]):
    """``rows`` lines of JSON with a "body" field, the lines numbered in ``bad_at`` (from 1) not JSON."""
    lines = presets.demo_text(rows * 80).decode().split("\n")
    with open(path, "w") as f:
        for n in range(1, rows + 1):
            f.write("{not json\n" if n in bad_at else json.dumps({"body": lines[n % len(lines)] or "."}) + "\n")
    return path


def _settled(preparation_id: int, seconds: float = 120) -> models.DatasetPreparation:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        row = models.DatasetPreparation.objects.get(pk=preparation_id)
        if row.is_settled:
            return row
        time.sleep(0.3)
    pytest.fail(f"preparation {preparation_id} not settled after {seconds} s: {row.status} {row.message}")


def test_it_prepares_jsonl_and_reports_the_bad_row_it_skipped(owner, data_root):
    path = _jsonl(data_root / "rows.jsonl", 400, bad_at={7})
    dataset = models.Dataset.objects.create(owner=owner, name="rows", path=str(path), text_field="body")
    preparation = dataset_prepare(owner, dataset, vocab=300)
    assert preparing.preparation_run(preparation.pk).startswith("prepared")
    preparation.refresh_from_db()
    assert preparation.status == Status.DONE and preparation.finished_at
    assert preparation.bad_rows["bad"] == 1 and preparation.bad_rows["rows"] == 400
    assert preparation.bad_rows["first"][0].startswith("rows.jsonl:7: not JSON")
    assert "skipped 1 unreadable rows of 400" in preparation.message
    assert preparation.report["train_tokens"] > 0 and preparation.report["vocab_size"] <= 300
    assert preparing.preparation_run(preparation.pk) == "settled"  # a second delivery changes nothing


def test_a_source_with_too_many_bad_rows_fails_with_the_report(owner, data_root):
    path = _jsonl(data_root / "broken.jsonl", 100, bad_at={2, 3, 50})
    dataset = models.Dataset.objects.create(owner=owner, name="broken", path=str(path), text_field="body")
    preparation = dataset_prepare(owner, dataset, vocab=300)
    preparing.preparation_run(preparation.pk)
    preparation.refresh_from_db()
    assert preparation.status == Status.FAILED and "max_bad_fraction" in preparation.message
    assert preparation.bad_rows["bad"] == 3 and preparation.bad_rows["first"][0].startswith("broken.jsonl:2:")
    # the wrong field: every row is bad, and the message says which field was looked for
    dataset.text_field, dataset.max_bad_fraction = "text", 0.5
    dataset.save()
    preparing.preparation_run(dataset_prepare(owner, dataset, vocab=300).pk)
    assert "text" in dataset.preparations.first().message


@pytest.mark.django_db(transaction=True)
def test_the_api_starts_a_preparation_that_the_worker_runs(owner, data_root, broker):
    path = _jsonl(data_root / "api.jsonl", 200, bad_at=set())
    dataset = models.Dataset.objects.create(owner=owner, name="api", path=str(path), text_field="body")
    api = APIClient()
    api.force_authenticate(owner)
    started = api.post(f"/api/datasets/{dataset.pk}/prepare/", {"vocab": 300}, format="json")
    assert started.status_code == 202, started.json()
    again = api.post(f"/api/datasets/{dataset.pk}/prepare/", {"vocab": 300}, format="json")
    assert again.status_code == 400 and "being prepared already" in json.dumps(again.json())
    preparation = _settled(started.json()["id"])
    assert preparation.status == Status.DONE, preparation.message
    listed = api.get(f"/api/datasets/{dataset.pk}/preparations/").json()["results"]
    assert [p["status"] for p in listed] == ["done"] and listed[0]["bad_rows"]["bad"] == 0


@pytest.fixture
def slurm_row(any_slurm, settings):
    """A Slurm cluster row for a test cluster (each release in turn); preparations there ask for 2 CPUs."""
    settings.WORKBENCH = {**settings.WORKBENCH, "PREPARE_CPUS": 2}
    return models.Cluster.objects.create(name="slurm-prep", kind="slurm", partition=any_slurm.partition,
                                         spec=presets.cluster("cpu", nodes=1, gpus_per_node=1).to_dict())


def _run_watching(preparation_id: int) -> tuple[str, list[str]]:
    """The task's answer, run in a thread, and each message the row said meanwhile."""
    answer, said = [], []
    task = threading.Thread(target=lambda: answer.append(preparing.preparation_run(preparation_id)))
    task.start()
    while task.is_alive():
        message = models.DatasetPreparation.objects.get(pk=preparation_id).message
        if not said or said[-1] != message:
            said.append(message)
        time.sleep(0.2)
    task.join()
    return answer[0], said


@pytest.mark.once
@pytest.mark.django_db(transaction=True)
def test_on_slurm_a_redelivered_task_follows_the_job_a_dead_delivery_submitted(owner, data_root, slurm_row,
                                                                                any_slurm):
    path = _jsonl(data_root / "slurm.jsonl", 400, bad_at={7})
    dataset = models.Dataset.objects.create(owner=owner, name="on-slurm", path=str(path), text_field="body")
    preparation = dataset_prepare(owner, dataset, vocab=300, cluster=slurm_row)
    # The first delivery claimed the row, submitted the job and died before it recorded anything more.
    request = preparing.preparation_request(preparation_claim(preparation.pk))
    submitted = launcher_for(request.settings).submit(request).job_id

    answer, said = _run_watching(preparation.pk)  # the redelivered task

    assert answer.startswith("prepared"), answer
    preparation.refresh_from_db()
    assert preparation.status == Status.DONE and preparation.job_id == submitted
    assert preparation.bad_rows["bad"] == 1 and preparation.report["train_tokens"] > 0
    named = any_slurm.run(["squeue", "--noheader", "--states=all", f"--name={request.job_name}",
                           "--format=%i"]).stdout.split()
    assert named == [submitted]  # found by its name, not submitted again
    job = any_slurm.job(int(submitted))
    assert (job["JobState"], job["NumCPUs"]) == ("COMPLETED", "2")
    assert "--workers 2" in Path(job["Command"]).read_text()
    # its progress, as the dataset's page shows it: the job and its state (and the last line it said, if any)
    assert any(m.startswith((f"Slurm job {submitted} pending", f"Slurm job {submitted} running")) for m in said), said


@pytest.mark.once
@pytest.mark.django_db(transaction=True)
def test_on_slurm_a_refused_source_fails_with_its_report(owner, data_root, slurm_row):
    path = _jsonl(data_root / "bad.jsonl", 100, bad_at={2, 3, 50})
    dataset = models.Dataset.objects.create(owner=owner, name="bad-on-slurm", path=str(path), text_field="body")
    preparation = dataset_prepare(owner, dataset, vocab=300, cluster=slurm_row)
    preparing.preparation_run(preparation.pk)
    preparation.refresh_from_db()
    assert preparation.status == Status.FAILED and "max_bad_fraction" in preparation.message, preparation.message
    assert preparation.bad_rows["bad"] == 3 and preparation.job_id
