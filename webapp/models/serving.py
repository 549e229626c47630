"""Deployment: Triton servers, models deployed from checkpoints, and prompt templates for the playground."""
from django.db import models

from .ownership import Owned
from .runs import Checkpoint


class TritonServer(models.Model):
    """A Triton Inference Server reachable over HTTP (and gRPC). Managed by staff."""

    class Kind(models.TextChoices):
        MANAGED = "managed", "Started and stopped by the workbench"
        EXTERNAL = "external", "Run elsewhere; only connected to"

    class InstanceKind(models.TextChoices):
        CPU = "cpu", "CPU (KIND_CPU)"
        GPU = "gpu", "GPU (KIND_GPU): each instance takes tensor_parallel GPUs"

    name = models.CharField(max_length=120, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.MANAGED)
    http_url = models.URLField(help_text="e.g. http://127.0.0.1:8000")
    grpc_url = models.CharField(max_length=200, blank=True, help_text="host:port, e.g. 127.0.0.1:8001")
    metrics_url = models.CharField(max_length=200, blank=True,
                                   help_text="Where /metrics is read, e.g. http://127.0.0.1:8002")
    model_repository = models.CharField(max_length=500, help_text="Folder of the server's model repository")
    instance_kind = models.CharField(max_length=8, choices=InstanceKind.choices, default=InstanceKind.CPU,
                                     help_text="Where the server runs the model instances it is given")
    is_ready = models.BooleanField(default=False)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Deployment(Owned):
    class Status(models.TextChoices):
        PENDING = "pending"
        EXPORTING = "exporting"
        LOADING = "loading"
        READY = "ready"
        # ready, but its server has lost the model (a restart): a worker loads it again from its entry
        RELOADING = "reloading"
        FAILED = "failed"
        UNLOADED = "unloaded"

    # A model name is held by its deployment until it is unloaded or has failed; then it may be deployed again.
    HOLDING = (Status.PENDING, Status.EXPORTING, Status.LOADING, Status.READY, Status.RELOADING)
    # What should be serving: the reconcile pass loads these again where their server has lost them.
    SERVING = (Status.READY, Status.RELOADING)

    class Reduction(models.TextChoices):
        NONE = "none", "Full precision"
        BF16 = "bf16", "bfloat16 cast"
        FP16 = "fp16", "float16 cast"
        INT8 = "int8", "int8 weight-only"

    class Engine(models.TextChoices):
        WORKBENCH = "workbench", "Workbench engine"
        VLLM = "vllm", "vLLM"

    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.PROTECT, related_name="deployments")
    server = models.ForeignKey(TritonServer, on_delete=models.PROTECT, related_name="deployments")
    engine = models.CharField(max_length=16, choices=Engine.choices, default=Engine.WORKBENCH,
                              help_text="What serves it in Triton: the workbench engine, or vLLM from the "
                                        "checkpoint's Hugging Face layout")
    model_name = models.SlugField(max_length=100, help_text="The name Triton serves it under")
    reduction = models.CharField(max_length=8, choices=Reduction.choices, default=Reduction.NONE)
    tensor_parallel = models.PositiveIntegerField(default=1, help_text="Shards of the serving layout")
    instances = models.PositiveIntegerField(default=1, help_text="Model instances Triton runs")
    streaming = models.BooleanField(default=True, help_text="Exported decoupled: one response per token")
    prompt_template = models.ForeignKey("PromptTemplate", on_delete=models.SET_NULL, null=True, blank=True,
                                        related_name="deployments",
                                        help_text="Turns chat messages into the model's prompt")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    status_message = models.TextField(blank=True)
    repository_path = models.CharField(max_length=500, blank=True)
    report = models.JSONField(default=dict, blank=True, help_text="The exporter's report")
    smoke_ok = models.BooleanField(null=True, blank=True,
                                   help_text="Whether the served model's greedy tokens equal the checkpoint's own")
    ready_at = models.DateTimeField(null=True, blank=True)
    # Each delivery of the deploy task stamps the deployment as it takes it up and writes only while the stamp is
    # its own: a redelivered task starts over, and the delivery it replaced (or an undeploy) stops the older one.
    claimed_at = models.DateTimeField(null=True, blank=True, editable=False)
    unloaded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["server", "model_name"],
                                               condition=models.Q(status__in=["pending", "exporting", "loading",
                                                                              "ready", "reloading"]),
                                               name="unique_held_model_name_per_server")]

    def __str__(self):
        return f"{self.model_name} on {self.server}"


DEFAULT_CHAT_TEMPLATE = "{role}: {content}\n"


class PromptTemplate(Owned):
    """A few-shot template: ``template`` with {examples} and {input}; each example is {"input", "output"}.

    ``chat_template`` is how one chat turn is written, with {role} and {content}; webapp.services.chat renders a
    conversation with it (the examples become earlier user and assistant turns).
    """

    name = models.CharField(max_length=120)
    template = models.TextField(default="{examples}{input}")
    chat_template = models.TextField(default=DEFAULT_CHAT_TEMPLATE,
                                     help_text="One chat turn, with {role} and {content}")
    examples = models.JSONField(default=list, blank=True)
    sampling = models.JSONField(default=dict, blank=True,
                                help_text="Default sampling: temperature, top_k, top_p, max_tokens, seed")

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="unique_template_name_per_owner")]

    def __str__(self):
        return self.name
