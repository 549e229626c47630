"""The calibration loop: completed runs become measured records, a worker refits their cluster, estimates use the fit.

1. When ingestion sees a run complete, ``calibration_record_add`` stores what it measured (the median step time of
   its steps after the warm-up, and its model and plan) and asks a worker, by task name, to refit the cluster.
2. ``cluster_calibration_refit`` fits the cluster's step-time terms to all its records
   (trainer.planner.estimate.calibrate: efficiency and GEMM shape, per-call latency by kind, host overhead per
   layer and micro-batch, fixed overhead) and stores the options with the leave-one-out error.
3. ``calibrated_estimate`` answers an estimate on a cluster with a usable fit under the fitted options, and says so
   in the answer's ``calibration``: how many runs, the held-out median error. An explicit ``options`` in the request
   wins: the caller asked for those.
"""
from __future__ import annotations

import logging
import math
import statistics

from django.db import transaction
from django.utils import timezone

from trainer.contract import ModelSpec, ParallelPlan, SpecError
from trainer.planner.estimate.api import estimate_json
from trainer.planner.estimate.calibrate import MeasuredRun, calibrate
from trainer.planner.estimate.options import EstimateOptions

from ..models import CalibrationRecord, Cluster, ClusterCalibration, Run, RunStatus, SeriesStep
from .tasks import TaskName, enqueue

log = logging.getLogger(__name__)

# Below this many records a fit of ten terms says little; estimates keep the planner's defaults until then.
MIN_RUNS = 3
# The first steps of a run compile, allocate and fill caches: their times are not the plan's.
WARMUP_STEPS = 5
# The step times a record's median is of (the latest ones; a long run needs no more)
MEASURED_STEPS = 500


def measured_step_time(run: Run) -> tuple[float, int] | None:
    """The median step time of the run's steps after the warm-up (all of them when it has no more), and how many."""
    rows = SeriesStep.objects.filter(run=run, step_time_s__isnull=False).order_by("-step")
    times = [(step, t) for step, t in rows.values_list("step", "step_time_s")[:MEASURED_STEPS]
             if math.isfinite(t) and t > 0]
    after = [t for step, t in times if step > WARMUP_STEPS] or [t for _, t in times]
    return (statistics.median(after), len(after)) if after else None


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
    enqueue(TaskName.CALIBRATION_REFIT, run.cluster_id)
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
    calibration.save()
    return calibration


def usable(calibration: ClusterCalibration | None) -> bool:
    return bool(calibration is not None and calibration.runs >= MIN_RUNS and calibration.options
                and calibration.time_error)


def calibration_summary(calibration: ClusterCalibration) -> dict:
    """What an estimate on a calibrated cluster carries: runs, held-out errors, and a sentence saying so."""
    error = calibration.time_error or {}
    median = error.get("median")
    return {"cluster": calibration.cluster_id, "runs": calibration.runs,
            "held_out_median_error": median, "held_out_mean_error": error.get("mean"),
            "held_out_max_error": error.get("max"),
            "fitted_at": calibration.fitted_at.isoformat() if calibration.fitted_at else None,
            "note": (f"calibrated on {calibration.runs} runs, held-out median error "
                     f"{median * 100:.1f} %" if isinstance(median, (int, float)) else
                     f"calibrated on {calibration.runs} runs")}


def cluster_calibration(cluster: Cluster | None) -> ClusterCalibration | None:
    """The cluster's usable calibration, or None (none yet, too few runs, or no cluster row)."""
    if cluster is None or cluster.pk is None:
        return None
    calibration = ClusterCalibration.objects.filter(cluster=cluster).first()
    return calibration if usable(calibration) else None


def calibrated_payload(payload: dict, cluster: Cluster | None) -> tuple[dict, dict | None]:
    """``payload`` with the cluster's fitted options when it has a usable fit and asks for no options of its own,
    and the calibration summary the answer should carry (None: the planner's defaults or the caller's options)."""
    calibration = cluster_calibration(cluster)
    if calibration is None or payload.get("options") is not None:
        return payload, None
    try:
        options = EstimateOptions.from_dict(calibration.options).to_dict()
    except (SpecError, TypeError) as exc:  # stored by an older planner with other fields: refit to use it again
        log.warning("cluster %s: stored calibration no longer reads: %s", calibration.cluster_id, exc)
        return payload, None
    return {**payload, "options": options}, calibration_summary(calibration)


def calibrated_estimate(payload: dict, cluster: Cluster | None) -> dict:
    """``estimate_json`` under the cluster's calibration when it has one, the answer saying so."""
    payload, summary = calibrated_payload(payload, cluster)
    answer = estimate_json(payload)
    if summary is not None:
        answer["calibration"] = summary
    return answer


def calibration_report(cluster: Cluster) -> dict:
    """A cluster's calibration as the API and the admin show it (an empty one before any refit)."""
    calibration = ClusterCalibration.objects.filter(cluster=cluster).first() \
        or ClusterCalibration(cluster=cluster)
    return {"cluster": cluster.pk, "records": CalibrationRecord.objects.filter(cluster=cluster).count(),
            "runs": calibration.runs, "min_runs": MIN_RUNS, "usable": usable(calibration),
            "note": calibration_summary(calibration)["note"] if usable(calibration) else
            (calibration.error or "not calibrated: no refit yet"),
            "options": calibration.options, "time_coefficients": calibration.time_coefficients,
            "time_error": calibration.time_error, "error": calibration.error, "fitted_at": calibration.fitted_at}


def cluster_calibration_request(cluster: Cluster) -> None:
    """Ask a worker to refit the cluster (after the surrounding transaction commits)."""
    enqueue(TaskName.CALIBRATION_REFIT, cluster.pk)
