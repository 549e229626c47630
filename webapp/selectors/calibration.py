"""What the calibration loop (webapp.services.calibration) measured and fitted, as estimates and pages use it.

``calibrated_estimate`` answers an estimate on a cluster with a usable fit under the fitted options, and says so in
the answer's ``calibration``: how many runs, the held-out median error. An explicit ``options`` in the request wins:
the caller asked for those. ``measured_step_time`` is what a completed run adds to its cluster's records.
"""
from __future__ import annotations

import logging
import math
import statistics

from trainer.contract import SpecError
from trainer.planner.estimate.api import estimate_json
from trainer.planner.estimate.options import EstimateOptions

from ..models import CalibrationRecord, Cluster, ClusterCalibration, Run, SeriesStep

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
