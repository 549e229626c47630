"""Admin pages for every stored object. Clusters and Triton servers are changed by staff with that permission;
owned objects are listed for their owner (superusers see everything)."""
import json

from django import forms
from django.contrib import admin

from . import models


class PrettyJSONWidget(forms.Textarea):
    def format_value(self, value):
        try:
            return json.dumps(json.loads(value), indent=2) if value else value
        except (TypeError, ValueError):
            return value


class OwnedAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "shared", "created_at")
    list_filter = ("shared",)
    search_fields = ("name", "owner__username")
    readonly_fields = ("created_at", "updated_at")
    formfield_overrides = {models.ModelConfig._meta.get_field("spec").__class__: {"widget": PrettyJSONWidget}}

    def get_queryset(self, request):
        return super().get_queryset(request).visible_to(request.user)

    def get_changeform_initial_data(self, request):
        return {"owner": request.user.pk, **super().get_changeform_initial_data(request)}


@admin.register(models.ModelConfig)
class ModelConfigAdmin(OwnedAdmin):
    pass


@admin.register(models.ParallelismPlan)
class ParallelismPlanAdmin(OwnedAdmin):
    list_display = ("name", "model_config", "cluster", "owner", "shared", "created_at")
    list_filter = ("shared", "cluster")


@admin.register(models.Dataset)
class DatasetAdmin(OwnedAdmin):
    list_display = ("name", "path", "owner", "shared", "created_at")


@admin.register(models.Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "partition", "account", "created_at")
    list_filter = ("kind",)
    search_fields = ("name", "partition", "account")
    formfield_overrides = OwnedAdmin.formfield_overrides


class MetricInline(admin.TabularInline):
    model = models.Metric
    extra = 0
    fields = ("kind", "step", "loss", "recorded_at")
    readonly_fields = fields
    can_delete = False
    max_num = 0


@admin.register(models.Run)
class RunAdmin(OwnedAdmin):
    list_display = ("name", "status", "model_config", "cluster", "attempts", "last_step", "owner", "created_at")
    list_filter = ("status", "cluster", "shared")
    readonly_fields = ("created_at", "updated_at", "queued_at", "started_at", "finished_at", "run_dir", "job_id",
                       "attempts", "last_step")
    inlines = [MetricInline]


@admin.register(models.Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "tokens_seen", "size_bytes", "created_at")
    search_fields = ("run__name",)


@admin.register(models.Profile)
class ProfileAdmin(admin.ModelAdmin):
    list_display = ("run", "name", "created_at")


@admin.register(models.Metric)
class MetricAdmin(admin.ModelAdmin):
    list_display = ("run", "kind", "step", "loss", "recorded_at")
    list_filter = ("kind",)


@admin.register(models.TritonServer)
class TritonServerAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "http_url", "is_ready", "last_seen_at")


@admin.register(models.Deployment)
class DeploymentAdmin(OwnedAdmin):
    list_display = ("model_name", "server", "checkpoint", "reduction", "status", "owner", "created_at")
    list_filter = ("status", "reduction", "server")
    search_fields = ("model_name",)


@admin.register(models.PromptTemplate)
class PromptTemplateAdmin(OwnedAdmin):
    pass


@admin.register(models.TuneJob)
class TuneJobAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "status", "dataset", "trial_steps", "created_at", "finished_at")
    list_filter = ("status",)
    readonly_fields = ("progress", "result", "error", "started_at", "finished_at")
