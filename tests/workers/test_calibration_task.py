"""The refit task, called as the worker calls it, refits a cluster from the records stored in the database."""
import pytest

from tests.trainer.planner.cpu_runs import cpu_runs
from trainer.contract import presets
from webapp import models
from workers.tasks import calibration_refit

pytestmark = pytest.mark.django_db


def test_the_refit_task_fits_the_clusters_stored_records_and_reports_the_held_out_error():
    cluster = models.Cluster.objects.create(name="local-4", spec=presets.local_cpu_cluster(4).to_dict())
    runs = cpu_runs(4)
    for r in runs:
        models.CalibrationRecord.objects.create(cluster=cluster, model=r.model.to_dict(), plan=r.plan.to_dict(),
                                                step_time_s=r.step_time_s, steps=20)
    report = calibration_refit(cluster.pk)
    stored = models.ClusterCalibration.objects.get(cluster=cluster)
    assert report["runs"] == stored.runs == len(runs) and report["error"] == ""
    assert report["held_out_median_error"] == stored.time_error["median"] <= 0.15
    assert report["note"] == f"calibrated on {len(runs)} runs, held-out median error " \
                             f"{stored.time_error['median'] * 100:.1f} %"
    # run twice, the same records give the same fit
    again = calibration_refit(cluster.pk)
    assert {k: v for k, v in again.items() if k != "fitted_at"} == {k: v for k, v in report.items() if k != "fitted_at"}
    assert models.ClusterCalibration.objects.filter(cluster=cluster).count() == 1
