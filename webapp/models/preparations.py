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
from .jobs import BackgroundJob


class DatasetPreparation(BackgroundJob):
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="preparations")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+",
                              help_text="Who asked for it")
    vocab = models.PositiveIntegerField(help_text="The model's vocabulary size it prepares for (a new tokenizer's "
                                                  "size too)")
    cluster = models.ForeignKey(Cluster, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                help_text="The Slurm cluster it runs on as a job of its own; none: a worker's process")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"preparation of {self.dataset} ({self.status})"

    @property
    def bad_rows(self) -> dict | None:
        """The bad-row report (rows read, bad ones, the first few with their places), when there is one."""
        bad = (self.report or {}).get("bad_rows")
        return bad if isinstance(bad, dict) else None
