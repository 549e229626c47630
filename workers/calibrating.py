"""Refitting a cluster's calibration when one of its runs completes (the fit itself: webapp.services.calibration)."""
import logging

from webapp.selectors.calibration import calibration_summary
from webapp.services.calibration import cluster_calibration_refit

log = logging.getLogger(__name__)


def calibration_refit(cluster_id: int) -> dict:
    """Refit and report: the summary estimates carry, or why there is no fit yet."""
    calibration = cluster_calibration_refit(cluster_id)
    if calibration.error:
        log.info("cluster %s calibration: %s", cluster_id, calibration.error)
    return {**calibration_summary(calibration), "error": calibration.error}
