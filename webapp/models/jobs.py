"""The row every background job a worker runs is followed by (an evaluation, a dataset's preparation, a checkpoint's
conversion, a tuning job): pending → running (claimed by one delivery of its task, saying how far it is) → done
(with its report) or failed (with the reason). The lifecycle that writes it is webapp.services.job_rows."""
from django.db import models


class JobStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


SETTLED = (JobStatus.DONE, JobStatus.FAILED)
UNDER_WAY = (JobStatus.PENDING, JobStatus.RUNNING)


class BackgroundJob(models.Model):
    Status = JobStatus

    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING, db_index=True)
    message = models.TextField(blank=True, help_text="Where it stands; a failure's reason")
    report = models.JSONField(default=dict, blank=True, help_text="What the job reported when it ended")
    job_id = models.CharField(max_length=64, blank=True, help_text="Its scheduler's job, once submitted")
    claimed_at = models.DateTimeField(null=True, blank=True, editable=False,
                                      help_text="When the delivery of the task now working on it started")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    @property
    def is_settled(self) -> bool:
        return self.status in SETTLED
