"""Evaluation sets and the evaluations of checkpoints on them.

An evaluation set is a file under its owner's data roots: multiple-choice items, prompts with reference answers, or
text for perplexity (trainer.evaluate says the formats). An evaluation is one checkpoint scored on one set by
EleutherAI's lm-evaluation-harness, a process a worker runs (``python -m trainer.evaluate``, workers.evaluating);
the row is what the user sees of it: pending → running (the process's latest line) → done (the scores) or failed
(why). It keeps its checkpoint, and through it the run, plan and model config the scores belong to.
"""
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from .dataroots import data_roots_for
from .ownership import Owned
from .runs import Checkpoint


class EvaluationSet(Owned):
    class Kind(models.TextChoices):
        CHOICE = "choice", "Multiple choice: question, choices, the index of the right answer (JSONL)"
        REFERENCE = "reference", "Prompts with reference answers (JSONL)"
        TEXT = "text", "Text for perplexity (JSONL with text, or plain text)"

    name = models.CharField(max_length=120)
    description = models.TextField(blank=True)
    path = models.CharField(max_length=500, help_text="The set's file, under one of your data roots")
    kind = models.CharField(max_length=16, choices=Kind.choices)

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="unique_evaluation_set_per_owner")]

    def __str__(self):
        return self.name

    def clean(self):
        if self.owner_id:
            problem = data_roots_for(self.owner).problem(self.path)
            if problem:
                raise ValidationError({"path": [problem]})


HEADLINE = {"choice": "acc", "reference": "exact_match", "text": "byte_perplexity"}  # the figure a table shows


class Evaluation(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+",
                              help_text="Who asked for it")
    eval_set = models.ForeignKey(EvaluationSet, on_delete=models.CASCADE, related_name="evaluations")
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="evaluations")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    message = models.TextField(blank=True, help_text="Where it stands; a failure's reason")
    scores = models.JSONField(default=dict, blank=True,
                              help_text='Done: {"kind", "items", "metrics": {name: value, name_stderr: …}}')
    claimed_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"evaluation of checkpoint {self.checkpoint_id} on {self.eval_set} ({self.status})"

    @property
    def is_settled(self) -> bool:
        return self.status in (self.Status.DONE, self.Status.FAILED)

    @property
    def headline(self) -> tuple[str, float] | None:
        """The set's main figure, as a table shows it: (its name, its value), once done."""
        name = HEADLINE.get(self.eval_set.kind)
        value = (self.scores or {}).get("metrics", {}).get(name)
        return (name, value) if isinstance(value, (int, float)) else None
