"""Preparations of datasets: a dataset's text tokenized into the trainer's files as a job of its own, ahead of any
run, so that its owner sees its bad rows and its size before training, and the runs that come later reuse it.

A worker runs ``python -m trainer.data prepare`` as a process of its own (workers.preparing), or submits it as a
batch job to the Slurm cluster the preparation names and follows that job; the row is what the user sees of it: pending → running (with the process's latest progress line) → done (the prepared data's meta.json) or failed
(why, with the bad-row report when too many rows could not be read).
"""
from django.conf import settings
from django.db import models
from django.utils import timezone

from .configs import Cluster, Dataset


class DatasetPreparation(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="preparations")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+",
                              help_text="Who asked for it")
    vocab = models.PositiveIntegerField(help_text="The model's vocabulary size it prepares for (a new tokenizer's "
                                                  "size too)")
    cluster = models.ForeignKey(Cluster, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                help_text="The Slurm cluster it runs on as a job of its own; none: a worker's process")
    job_id = models.CharField(max_length=64, blank=True, help_text="Its Slurm job, once submitted")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    message = models.TextField(blank=True, help_text="Where it stands; a failure's reason")
    report = models.JSONField(default=dict, blank=True,
                              help_text="Done: the prepared data's meta.json; refused: the reason and the bad rows")
    claimed_at = models.DateTimeField(null=True, blank=True, editable=False,
                                      help_text="When the delivery of the task now working on it started")
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"preparation of {self.dataset} ({self.status})"

    @property
    def is_settled(self) -> bool:
        return self.status in (self.Status.DONE, self.Status.FAILED)

    @property
    def bad_rows(self) -> dict | None:
        """The bad-row report (rows read, bad ones, the first few with their places), when there is one."""
        bad = (self.report or {}).get("bad_rows")
        return bad if isinstance(bad, dict) else None
