"""The calibration loop: completed runs become measured records, a worker refits their cluster, estimates use the fit.

1. When ingestion sees a run complete, ``calibration_record_add`` stores what it measured (the median step time of
   its steps after the warm-up, and its model and plan) and asks a worker, by task name, to refit the cluster,
   unless a refit already asked for has not begun: one refit covers every record added before it begins.
2. ``cluster_calibration_refit`` fits the cluster's step-time terms to all its records
   (trainer.planner.estimate.calibrate: efficiency and GEMM shape, per-call latency by kind, host overhead per
   layer and micro-batch, fixed overhead) and stores the options with the leave-one-out error.
3. ``calibrated_estimate`` (webapp.selectors.calibration) answers an estimate on a cluster with a usable fit under
   the fitted options, and says so.
"""
from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from trainer.contract import ModelSpec, ParallelPlan, SpecError
from trainer.planner.estimate.calibrate import MeasuredRun, calibrate

from ..models import CalibrationRecord, Cluster, ClusterCalibration, Run, RunStatus
from ..selectors.calibration import MIN_RUNS, measured_step_time
from .tasks import TaskName, enqueue


def calibration_record_add(run: Run) -> CalibrationRecord | None:
    """Store a completed run's measurement for its cluster and queue the refit; None when it measured no step."""
    if run.status != RunStatus.COMPLETED or not isinstance(run.spec, dict):
        return None
    measured = measured_step_time(run)
    if measured is None or not all(isinstance(run.spec.get(k), dict) for k in ("model", "plan")):
        return None
    seconds, steps = measured
    record, _ = CalibrationRecord.objects.update_or_create(
        run=run, defaults=dict(cluster_id=run.cluster_id, model=run.spec["model"], plan=run.spec["plan"],
                               step_time_s=seconds, steps=steps))
    cluster_calibration_request(run.cluster_id)
    return record


def _measured_runs(cluster: Cluster) -> tuple[list[MeasuredRun], list[str]]:
    """The cluster's records as the planner's MeasuredRuns, and why any record was left out."""
    spec = cluster.cluster_spec()
    runs, skipped = [], []
    for record in CalibrationRecord.objects.filter(cluster=cluster):
        try:
            runs.append(MeasuredRun(ModelSpec.from_dict(record.model), ParallelPlan.from_dict(record.plan), spec,
                                    record.step_time_s))
        except (SpecError, TypeError, ValueError) as exc:
            skipped.append(f"record {record.pk}: {exc}")
    return runs, skipped


@transaction.atomic
def cluster_calibration_refit(cluster_id: int) -> ClusterCalibration:
    """Fit the cluster's terms to its records and store them (safe to run twice: the same records, the same fit)."""
    cluster = Cluster.objects.select_for_update().get(pk=cluster_id)
    calibration, _ = ClusterCalibration.objects.get_or_create(cluster=cluster)
    # begun: a record added from now on asks for another refit (the request is left out of the save below)
    ClusterCalibration.objects.filter(pk=calibration.pk).update(refit_requested_at=None)
    runs, skipped = _measured_runs(cluster)
    calibration.runs = len(runs)
    if len(runs) < MIN_RUNS:
        calibration.options, calibration.time_coefficients, calibration.time_error = {}, {}, {}
        calibration.error = (f"{len(runs)} measured run(s); a fit needs at least {MIN_RUNS}"
                             + (f" ({len(skipped)} record(s) left out: {skipped[0]})" if skipped else ""))
    else:
        try:
            fitted = next(iter(calibrate(runs).clusters.values()))
        except SpecError as exc:  # a record the planner refuses (a spec that no longer fits the cluster)
            calibration.error = f"the planner refused a record: {exc}"
        else:
            calibration.options = fitted.options.to_dict()
            calibration.time_coefficients = fitted.time_coefficients
            calibration.time_error = fitted.time_error
            calibration.error = f"{len(skipped)} record(s) left out: {skipped[0]}" if skipped else ""
            calibration.fitted_at = timezone.now()
    calibration.save(update_fields=["runs", "options", "time_coefficients", "time_error", "error", "fitted_at",
                                    "updated_at"])
    return calibration


REFIT_LOST_AFTER_S = 600  # a refit asked for this long ago and not begun is taken for lost (a broker restart)


def cluster_calibration_request(cluster_id: int) -> bool:
    """Ask a worker to refit the cluster (after the surrounding transaction commits), unless a refit asked for
    already has not begun: runs that complete one after another would otherwise queue a whole refit each, hundreds
    of them ahead of the reconcile passes. Whether one was sent."""
    now = timezone.now()
    calibration, _ = ClusterCalibration.objects.get_or_create(cluster_id=cluster_id)
    mine = ClusterCalibration.objects.filter(pk=calibration.pk)
    none_waiting = Q(refit_requested_at__isnull=True) | \
        Q(refit_requested_at__lt=now - timedelta(seconds=REFIT_LOST_AFTER_S))
    if not mine.filter(none_waiting).update(refit_requested_at=now):
        return False
    enqueue(TaskName.CALIBRATION_REFIT, cluster_id,
            unsent=lambda: mine.filter(refit_requested_at=now).update(refit_requested_at=None))
    return True
