"""The planner's calibration per cluster: one measured record for each completed run, and the fit made from them."""
from django.db import models

from .configs import Cluster
from .runs import Run


class CalibrationRecord(models.Model):
    """What a completed run measured, with the specs it ran: one equation of its cluster's fit.

    The specs are copied from the run, so the record outlives it (a deleted run leaves its measurement)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="calibration_records")
    run = models.OneToOneField(Run, on_delete=models.SET_NULL, null=True, blank=True,
                               related_name="calibration_record")
    model = models.JSONField(help_text="trainer.contract.ModelSpec of the run")
    plan = models.JSONField(help_text="trainer.contract.ParallelPlan of the run")
    step_time_s = models.FloatField(help_text="Median step time of the run's steps after its warm-up")
    steps = models.PositiveIntegerField(help_text="How many steps that median is of")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["cluster_id", "id"]

    def __str__(self):
        return f"calibration record of run {self.run_id} on {self.cluster_id}: {self.step_time_s:.4g} s"


class ClusterCalibration(models.Model):
    """A cluster's fitted step-time terms (trainer.planner.estimate.calibrate) and their held-out error.

    ``options`` are EstimateOptions fields; estimates on the cluster use them once ``runs`` reaches the minimum
    the fit needs (webapp.selectors.calibration.MIN_RUNS)."""

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="calibration")
    runs = models.PositiveIntegerField(default=0, help_text="Measured records the fit is made of")
    options = models.JSONField(default=dict, blank=True, help_text="The fitted EstimateOptions fields")
    time_coefficients = models.JSONField(default=dict, blank=True)
    time_error = models.JSONField(default=dict, blank=True,
                                  help_text="Leave-one-out relative step-time error: median, mean, max, runs")
    error = models.TextField(blank=True, help_text="Why the latest refit made no fit")
    fitted_at = models.DateTimeField(null=True, blank=True)
    refit_requested_at = models.DateTimeField(null=True, blank=True, editable=False,
                                              help_text="When a refit was asked for that no worker has begun yet")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"calibration of {self.cluster_id} ({self.runs} runs)"
