"""What happened to a run, for a person to read: its attempts (one per job submitted) and its events.

Both are written by workers only, in the same transaction as the status change they explain, so the history and the
status never disagree. The run folder's events.jsonl (the trainer's own) and the scheduler's view of the job (Slurm's
state and reason, a process's exit code) both end up here, each event saying where it came from.
"""
from django.db import models
from django.utils import timezone

from .runs import Run


class Attempt(models.Model):
    """One job submitted for a run: the first launch, a restart after a failure, a requeue after a time limit."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempt_records")
    number = models.PositiveIntegerField()
    backend = models.CharField(max_length=16)
    job_id = models.CharField(max_length=64)
    resume = models.BooleanField(default=False, help_text="Continued the run folder of an earlier attempt")
    why = models.CharField(max_length=200, blank=True, help_text="Why this attempt was started")
    script = models.TextField(blank=True, help_text="The batch script submitted (Slurm), as stored in the run folder")
    command = models.JSONField(default=list, blank=True, help_text="The command that submitted or started the job")
    submitted_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=32, blank=True, help_text="How the scheduler says the job ended")
    exit_code = models.IntegerField(null=True, blank=True)
    reason = models.TextField(blank=True, help_text="How it ended, in words")
    counts_as_restart = models.BooleanField(
        default=False, help_text="A failure that used up one of the run's restarts (a time limit or preemption does "
                                 "not)")

    class Meta:
        ordering = ["run", "number"]
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="unique_attempt_number_per_run")]

    def __str__(self):
        return f"{self.run_id} attempt {self.number} ({self.state or 'running'})"


class RunEvent(models.Model):
    class Source(models.TextChoices):
        TRAINER = "trainer"       # a line of events.jsonl
        SCHEDULER = "scheduler"   # what Slurm or the process table said about the job
        WORKBENCH = "workbench"   # a status change: queued, launched, retried, cancelled

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="history")
    time = models.DateTimeField(default=timezone.now)
    source = models.CharField(max_length=16, choices=Source.choices)
    kind = models.CharField(max_length=32)
    attempt = models.PositiveIntegerField(null=True, blank=True)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["run", "time", "id"]
        indexes = [models.Index(fields=["run", "time"])]

    def __str__(self):
        return f"{self.run_id} {self.source}/{self.kind}: {self.message[:60]}"
