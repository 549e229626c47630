"""Auto-tuning with measured trials: a job that runs short real trainings and reports its progress.

Its report, once done, is the tune's result (the ranking and the trials); a failure's reason is its message."""
from django.db import models

from .configs import Dataset
from .jobs import BackgroundJob
from .ownership import Owned


class TuneJob(Owned, BackgroundJob):
    request = models.JSONField(help_text="The tuning request (model, cluster, global batch, space, …)")
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="tune_jobs",
                                help_text="The text the trials train on")
    trial_steps = models.PositiveIntegerField(default=8)
    progress = models.JSONField(default=dict, blank=True, help_text="The latest progress event and counts")

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"tune job {self.pk} ({self.status})"
