"""The planner's estimate of a run: made once from the run's stored spec (its model, plan and cluster, at the
planner's default options, or its cluster's calibrated ones: webapp.selectors.calibration) when the run is created,
and kept on the run: the spec never changes, so neither does the estimate. A run made before estimates were kept gets
its own on first read. What the run measured beside it is read by webapp.selectors.run_estimates.
"""
from __future__ import annotations

import logging

from trainer.contract import SpecError
from trainer.planner.estimate.api import estimate_json

from ..models import Cluster, Run
from ..selectors.calibration import calibrated_payload
from ..selectors.run_estimates import estimate_rows, estimate_summary

log = logging.getLogger(__name__)


def spec_estimate(spec: dict | None, cluster: Cluster | None = None) -> dict:
    """The planner's estimate for a run spec's model, plan and cluster, or ``{"error": why}``: at the cluster's
    calibrated options when it has a usable calibration (the answer's ``calibration`` says so), else the defaults.

    Never raises: an estimate is a help beside a run, so a spec the planner cannot estimate, or a planner bug, is
    kept as the reason there is none instead of stopping the run from being created or shown."""
    if not isinstance(spec, dict) or not all(key in spec for key in ("model", "plan", "cluster")):
        return {"error": "the run has no stored spec to estimate"}
    try:
        payload, calibration = calibrated_payload({key: spec[key] for key in ("model", "plan", "cluster")}, cluster)
        answer = estimate_json(payload)
        if calibration is not None:
            answer["calibration"] = calibration
        return answer
    except (SpecError, ValueError, ArithmeticError) as exc:
        return {"error": f"the planner cannot estimate this spec: {exc}"}
    except Exception as exc:  # noqa: BLE001 - see the docstring; the traceback goes to the log
        log.exception("the planner failed on a run's spec")
        return {"error": f"the planner failed on this spec: {type(exc).__name__}: {exc}"}


def run_estimate(run: Run) -> dict:
    """The run's stored estimate; made and saved on first read for a run created before estimates were kept."""
    if not run.estimate:
        run.estimate = spec_estimate(run.spec, run.cluster)
        # only this column: a read must not write back other fields the caller's copy may hold stale
        Run.objects.filter(pk=run.pk).update(estimate=run.estimate)
    return run.estimate


def run_estimate_report(run: Run) -> dict:
    """``{"estimate": the stored estimate's summary or its error, "figures": estimate_rows}``."""
    estimate = run_estimate(run)
    return {"estimate": estimate_summary(estimate), "figures": estimate_rows(run, estimate)}
