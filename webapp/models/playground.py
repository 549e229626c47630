"""The playground's memory: every saved version of a prompt template, and what each user asked and was answered."""
from django.conf import settings
from django.db import models

from .serving import Deployment, PromptTemplate


class PromptTemplateVersion(models.Model):
    """One saved state of a prompt template. Saving a template again adds a version rather than overwriting, so an
    earlier prompt can be picked again; the template row itself holds the newest version."""

    prompt_template = models.ForeignKey(PromptTemplate, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    template = models.TextField()
    examples = models.JSONField(default=list, blank=True)
    sampling = models.JSONField(default=dict, blank=True,
                                help_text="temperature, top_k, top_p, max_tokens, seed and stop strings")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["prompt_template", "-number"]
        constraints = [models.UniqueConstraint(fields=["prompt_template", "number"],
                                               name="unique_version_per_prompt_template")]

    def __str__(self):
        return f"{self.prompt_template.name} v{self.number}"


class PlaygroundRecord(models.Model):
    """One generation asked in the playground, with its answer and what the page measured of it."""

    class Source(models.TextChoices):
        STREAM = "stream", "Streamed in the page"
        SET = "set", "A prompt set's row"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    # Kept when the deployment row goes, so the history still says what answered.
    deployment = models.ForeignKey(Deployment, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="playground_records")
    model_name = models.CharField(max_length=100)
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.STREAM)
    input = models.TextField(help_text="What was typed: the template's {input}")
    template = models.TextField(blank=True)
    examples = models.JSONField(default=list, blank=True)
    prompt = models.TextField(help_text="The prompt sent: the template written out")
    sampling = models.JSONField(default=dict, blank=True)
    output = models.TextField(blank=True)
    error = models.TextField(blank=True)
    finish_reason = models.CharField(max_length=16, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True, help_text="Time to the first token, in milliseconds")
    tokens_per_s = models.FloatField(null=True, blank=True, help_text="Completion tokens a second after the first")
    total_ms = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["owner", "-created_at"])]

    def __str__(self):
        return f"{self.model_name}: {self.input[:40]}"
