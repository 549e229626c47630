"""Auto-tuning with measured trials: a job that runs short real trainings and reports its progress."""
from django.db import models

from .configs import Dataset
from .ownership import Owned


class TuneJob(Owned):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"

    request = models.JSONField(help_text="The tuning request (model, cluster, global batch, space, …)")
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="tune_jobs",
                                help_text="The text the trials train on")
    trial_steps = models.PositiveIntegerField(default=8)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    progress = models.JSONField(default=dict, blank=True, help_text="The latest progress event and counts")
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"tune job {self.pk} ({self.status})"
