"""Preparing a dataset ahead of its runs (workers.preparing): the real ``python -m trainer.data prepare`` process
on JSONL with bad rows, run by the task in this process and, once, by the session's worker through the API."""
import json
import time

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from tests.xdist_groups import run_temp_root
from trainer.contract import presets
from webapp import models
from webapp.services.preparations import dataset_prepare
from workers import preparing

Status = models.DatasetPreparation.Status
pytestmark = pytest.mark.slow


@pytest.fixture
def owner(db):
    return User.objects.create_user("preparer")


@pytest.fixture
def data_root(settings, tmp_path_factory, tmp_path):
    """A folder of the test run's temporary folder, which the session's worker reads as a data root too."""
    settings.WORKBENCH = {**settings.WORKBENCH, "DATA_ROOTS": [run_temp_root(tmp_path_factory)]}
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
