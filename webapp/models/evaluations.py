"""Evaluation sets and the evaluations of checkpoints on them.

An evaluation set is a file under its owner's data roots: multiple-choice items, prompts with reference answers, or
text for perplexity (trainer.evaluate says the formats). An evaluation is one checkpoint scored on one set by
EleutherAI's lm-evaluation-harness, directly or through a deployment of it behind the web app's /v1: a process a
worker runs (``python -m trainer.evaluate``, workers.evaluating). The row is what the user sees of it: pending →
running (the process's latest line) → done (the scores) or failed (why). It keeps its checkpoint, and through it the
run, plan and model config the scores belong to.
"""
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from .dataroots import data_roots_for
from .jobs import BackgroundJob
from .ownership import Owned
from .runs import Checkpoint
from .serving import Deployment


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


EVAL_SERIES_PREFIX = "eval:"  # a run's series of one set's headline score at each checkpoint: eval:<set id>
# the figure a table shows, the first the evaluation has: a deployment's choice set has only acc_generated
HEADLINE = {"choice": ("acc", "acc_generated"), "reference": ("exact_match",), "text": ("byte_perplexity",)}


class Evaluation(BackgroundJob):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+",
                              help_text="Who asked for it")
    eval_set = models.ForeignKey(EvaluationSet, on_delete=models.CASCADE, related_name="evaluations")
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="evaluations",
                                   help_text="What was scored, or what the deployment serves")
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, null=True, blank=True,
                                   related_name="evaluations",
                                   help_text="Scored through the web app's /v1 when set; the checkpoint directly when "
                                             "empty")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"evaluation of {self.target} on {self.eval_set} ({self.status})"

    @property
    def target(self) -> str:
        """What was scored, in words: the checkpoint, or a deployment by its name and weights."""
        if self.deployment_id is None:
            return f"checkpoint {self.checkpoint_id}"
        return f"deployment {self.deployment.model_name} ({self.deployment.get_reduction_display()})"

    @property
    def scores(self) -> dict:
        """Done: {"kind", "items", "metrics": {name: value, name_stderr: …}} (the job's report)."""
        return self.report

    @property
    def headline(self) -> tuple[str, float] | None:
        """The set's main figure, as a table shows it: (its name, its value), once done."""
        return headline_of(self.eval_set.kind, self.scores)


def headline_of(kind: str, scores: dict | None) -> tuple[str, float] | None:
    """The first figure of HEADLINE[kind] that ``scores`` holds: (its name, its value)."""
    metrics = (scores or {}).get("metrics") or {}
    for name in HEADLINE.get(kind, ()):
        if isinstance(metrics.get(name), (int, float)):
            return name, metrics[name]
    return None
