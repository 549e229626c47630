"""The calibration loop in the product: a completed run becomes a measured record of its cluster and asks for a
refit by task name; a refit stores the fit with its held-out error; estimates on a calibrated cluster (the endpoint
with a stored plan, the run's stored estimate, the wizard's) use the fitted options and say so; the API shows a
cluster's calibration and lets staff ask for a refit; the admin shows it."""
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from tests.trainer.planner.cpu_runs import cpu_runs
from tests.webapp.live_runs import new_run, step_record
from trainer.contract import presets
from trainer.contract.records import Event, event
from trainer.contract.runfolder import EVENTS, METRICS, append_jsonl
from trainer.planner.estimate import calibrate
from trainer.planner.estimate.api import estimate_json
from webapp import models
from webapp.selectors.calibration import MIN_RUNS, calibrated_estimate
from webapp.services.calibration import REFIT_LOST_AFTER_S, cluster_calibration_refit, cluster_calibration_request
from webapp.services.ingest import run_ingest
from webapp.services.tasks import TaskName

pytestmark = pytest.mark.django_db


@pytest.fixture
def local2(db):
    return models.Cluster.objects.create(name="local-2", spec=presets.local_cpu_cluster(2).to_dict())


@pytest.fixture
def tiny_plan(alice, local2):
    config = models.ModelConfig.objects.create(owner=alice, name="tiny", spec=presets.MODELS["tiny"].to_dict())
    return models.ParallelismPlan.objects.create(owner=alice, name="dp2", model_config=config, cluster=local2,
                                                 spec={"dp": 2, "micro_batch": 4, "global_batch": 16})


def _records(cluster, runs) -> None:
    for r in runs:
        models.CalibrationRecord.objects.create(cluster=cluster, model=r.model.to_dict(), plan=r.plan.to_dict(),
                                                step_time_s=r.step_time_s, steps=20)


@pytest.fixture
def calibrated(local2):
    """local-2 refitted on the committed runs of two CPU processes."""
    _records(local2, cpu_runs(2))
    return cluster_calibration_refit(local2.pk)


def _complete(run, step_times) -> models.Run:
    run.transition("queued")
    run.transition("submitted")
    run.save()
    folder = Path(run.run_dir)
    append_jsonl(folder / EVENTS, event(Event.STARTED, 0))
    for step, seconds in enumerate(step_times, 1):
        append_jsonl(folder / METRICS, step_record(step, 3.0, step_time=seconds))
    append_jsonl(folder / EVENTS, event(Event.FINISHED, 0, step=len(step_times)))
    return run_ingest(run.pk)


def test_a_completed_run_becomes_a_record_of_its_cluster_and_asks_for_a_refit(
        alice, tiny_plan, corpus, sent, django_capture_on_commit_callbacks):
    # five warm-up steps (slow: compiling, allocating), then the plan's own pace
    with django_capture_on_commit_callbacks(execute=True):
        run = _complete(new_run(alice, tiny_plan, corpus), [2.0] * 5 + [0.06, 0.05, 0.07, 0.05, 0.06])
    assert run.status == "completed"
    record = run.calibration_record
    assert (record.cluster, record.step_time_s, record.steps) == (tiny_plan.cluster, 0.06, 5)
    assert record.plan == run.spec["plan"] and record.model == run.spec["model"]
    assert (TaskName.CALIBRATION_REFIT, tiny_plan.cluster.pk) in sent
    # ingesting the folder again adds nothing
    with django_capture_on_commit_callbacks(execute=True):
        run_ingest(run.pk)
    assert models.CalibrationRecord.objects.count() == 1
    assert sent.count((TaskName.CALIBRATION_REFIT, tiny_plan.cluster.pk)) == 1


def test_a_refit_stores_the_planners_fit_of_the_records_with_its_held_out_error(calibrated, local2):
    runs = cpu_runs(2)
    expected = next(iter(calibrate([r.__class__(r.model, r.plan, local2.cluster_spec(), r.step_time_s)
                                    for r in runs]).clusters.values()))
    calibrated.refresh_from_db()
    assert calibrated.runs == len(runs) and calibrated.error == ""
    assert calibrated.options == expected.options.to_dict()
    assert calibrated.time_error == pytest.approx(expected.time_error)
    assert calibrated.options["tp_call_s"] > 0 and calibrated.fitted_at is not None


def test_too_few_records_make_no_fit_and_estimates_keep_the_defaults(local2, tiny_plan):
    _records(local2, cpu_runs(2)[:MIN_RUNS - 1])
    calibration = cluster_calibration_refit(local2.pk)
    assert calibration.options == {} and f"needs at least {MIN_RUNS}" in calibration.error
    payload = {"model": "tiny", "plan": tiny_plan.spec, "cluster": local2.spec}
    assert calibrated_estimate(payload, local2) == estimate_json(payload)


def test_an_estimate_on_a_calibrated_cluster_uses_the_fit_and_says_so(calibrated, alice, api, tiny_plan, corpus):
    answer = api(alice).post("/api/estimate/", {"plan_id": tiny_plan.pk}, format="json").json()
    median = calibrated.time_error["median"]
    assert answer["calibration"]["runs"] == calibrated.runs
    assert answer["calibration"]["held_out_median_error"] == pytest.approx(median)
    assert answer["calibration"]["note"] == f"calibrated on {calibrated.runs} runs, held-out median error " \
                                            f"{median * 100:.1f} %"
    assert answer["options"] == calibrated.options
    default = estimate_json({"model": "tiny", "plan": tiny_plan.spec, "cluster": tiny_plan.cluster.spec})
    assert answer["time"]["step"]["value"] != default["time"]["step"]["value"]
    # the committed dp2 run measured 57 ms; the defaults say several times that, the fit within its error
    assert answer["time"]["step"]["value"] == pytest.approx(0.057, rel=0.3)

    # options of the caller's own win, and then no calibration is claimed
    own = api(alice).post("/api/estimate/", {"plan_id": tiny_plan.pk, "options": {}}, format="json").json()
    assert "calibration" not in own and own["time"]["step"]["value"] == default["time"]["step"]["value"]

    # the run's stored estimate, made at creation, is the calibrated one and carries the error
    run = new_run(alice, tiny_plan, corpus)
    run.refresh_from_db()
    assert run.estimate["calibration"]["held_out_median_error"] == pytest.approx(median)
    assert run.estimate["time"]["step"]["value"] == answer["time"]["step"]["value"]
    report = api(alice).get(f"/api/runs/{run.pk}/estimate/").json()
    assert report["estimate"]["calibration"]["note"] == answer["calibration"]["note"]


def test_the_api_shows_a_clusters_calibration_and_staff_ask_for_a_refit(
        local2, alice, staff, api, sent, django_capture_on_commit_callbacks):
    answer = api(alice).get(f"/api/clusters/{local2.pk}/calibration/").json()
    assert answer["usable"] is False and answer["records"] == 0 and answer["note"] == "not calibrated: no refit yet"
    assert api(alice).post(f"/api/clusters/{local2.pk}/calibrate/").status_code == 403
    assert sent == []
    with django_capture_on_commit_callbacks(execute=True):
        response = api(staff).post(f"/api/clusters/{local2.pk}/calibrate/")
    assert response.status_code == 202 and sent == [(TaskName.CALIBRATION_REFIT, local2.pk)]

    _records(local2, cpu_runs(2))
    cluster_calibration_refit(local2.pk)
    answer = api(alice).get(f"/api/clusters/{local2.pk}/calibration/").json()
    assert answer["usable"] is True and answer["records"] == answer["runs"] == len(cpu_runs(2))
    assert answer["note"].startswith(f"calibrated on {answer['runs']} runs, held-out median error")
    assert set(answer["time_error"]) >= {"median", "mean", "max"}


def test_the_admin_shows_the_calibration_on_the_cluster_page(calibrated, local2, staff, client):
    staff.is_superuser = True
    staff.save()
    client.force_login(staff)
    page = client.get(f"/admin/workbench/cluster/{local2.pk}/change/").content.decode()
    assert f"calibrated on {calibrated.runs} runs, held-out median error" in page


def test_a_refit_asked_for_and_not_begun_is_not_asked_for_again_until_it_begins_or_is_long_lost(
        local2, sent, django_capture_on_commit_callbacks):
    """Hundreds of runs completing one after another ask for one refit at a time, not hundreds."""
    refit = (TaskName.CALIBRATION_REFIT, local2.pk)
    with django_capture_on_commit_callbacks(execute=True):
        assert cluster_calibration_request(local2.pk) is True
        assert cluster_calibration_request(local2.pk) is False  # the one asked for has not begun
    assert sent == [refit]
    cluster_calibration_refit(local2.pk)  # begun: a record added now asks for another
    with django_capture_on_commit_callbacks(execute=True):
        assert cluster_calibration_request(local2.pk) is True
    long_ago = timezone.now() - timedelta(seconds=REFIT_LOST_AFTER_S + 60)
    models.ClusterCalibration.objects.filter(cluster=local2).update(refit_requested_at=long_ago)
    with django_capture_on_commit_callbacks(execute=True):
        assert cluster_calibration_request(local2.pk) is True  # never begun: lost (a broker restart)
    assert sent == [refit] * 3
