"""Imports of Hugging Face models as checkpoints, and exports of checkpoints to the Hugging Face layout.

Each is a process a worker runs (``python -m deploy import-hf`` or ``export-hf``: they need torch, which the web
app and the workers never import); the row is what the user sees of it: pending → running → done or failed, with
the process's last error line. A finished import points at the checkpoint it made, an export at the one it read.
"""
from django.conf import settings
from django.db import models
from django.utils import timezone

from .jobs import BackgroundJob
from .runs import Checkpoint


class ConversionQuerySet(models.QuerySet):
    def visible_to(self, user):
        return self if user.is_staff else self.filter(owner=user)


class CheckpointConversion(BackgroundJob):
    class Kind(models.TextChoices):
        IMPORT_HF = "import-hf", "A Hugging Face model folder imported as a checkpoint"
        EXPORT_HF = "export-hf", "A checkpoint exported to the Hugging Face layout"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=120, blank=True, help_text="An import's checkpoint name")
    source = models.CharField(max_length=500, help_text="What is read: the model folder, or the checkpoint folder")
    target = models.CharField(max_length=500, help_text="What is written: the checkpoint folder, or the model folder")
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="conversions",
                                   help_text="An export's checkpoint; the checkpoint an import made, once done")
    created_at = models.DateTimeField(default=timezone.now)

    objects = ConversionQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.kind} {self.source} ({self.status})"
