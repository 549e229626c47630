"""Admin pages for every stored object. Clusters and Triton servers are changed by staff with that permission;
owned objects are listed for their owner (superusers see everything)."""
import json

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import options as admin_options
from django.contrib.admin import widgets as admin_widgets
from django.contrib.auth import admin as auth_admin
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.db import models as db_models
from django.utils.html import format_html

from trainer.contract import presets

from . import models, services
from .pages.wizard_figures import CURRENCY
from .selectors.calibration import calibration_report


class LabelledSplitDateTime(admin_widgets.AdminSplitDateTime):
    """The admin's date and time boxes, each with a name a screen reader can say: Django's own have none beside
    the one label of the pair (axe-core rates that critical)."""

    def get_context(self, name, value, attrs):
        context = super().get_context(name, value, attrs)
        words = name.replace("_", " ")
        for part, subwidget in zip(("date", "time"), context["widget"]["subwidgets"]):
            subwidget["attrs"]["aria-label"] = f"{words} {part}"
        return context


# Every admin form's date-and-time fields, the auth admin's too (users' last login and date joined).
admin_options.FORMFIELD_FOR_DBFIELD_DEFAULTS[db_models.DateTimeField] = {
    **admin_options.FORMFIELD_FOR_DBFIELD_DEFAULTS[db_models.DateTimeField], "widget": LabelledSplitDateTime}


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


class ClusterForm(forms.ModelForm):
    """The cluster's machines as fields of their own (nodes, GPUs a node, the GPU model and its figures), written
    into its spec, which Cluster.clean checks as ClusterSpec; a GPU model picked from the presets brings its
    figures, which the fields beside it may then correct."""

    GPU_FIELDS = ("memory_gb", "peak_tflops", "memory_bandwidth_gbs")
    MACHINE_FIELDS = ("nodes", "gpus_per_node", "intra_node_bandwidth_gbs", "inter_node_bandwidth_gbs",
                      "gpu_hour_cost")

    gpu_preset = forms.ChoiceField(label="GPU model", required=False,
                                   choices=[("", "as below")] + [(name, name) for name in presets.GPUS],
                                   help_text="Fills the GPU's name and figures from the presets")
    gpu_name = forms.CharField(label="GPU name", max_length=64, required=False)
    memory_gb = forms.FloatField(label="GPU memory (GB)", min_value=0.001)
    peak_tflops = forms.FloatField(label="Peak TFLOP/s (dense, the plan's precision)", min_value=0.001)
    memory_bandwidth_gbs = forms.FloatField(label="Memory bandwidth (GB/s)", min_value=0.001)
    nodes = forms.IntegerField(min_value=1)
    gpus_per_node = forms.IntegerField(label="GPUs per node", min_value=1)
    intra_node_bandwidth_gbs = forms.FloatField(label="Within a node (GB/s per GPU)", min_value=0.001)
    inter_node_bandwidth_gbs = forms.FloatField(label="Between nodes (GB/s per GPU)", min_value=0.001)
    gpu_hour_cost = forms.FloatField(label=f"Cost of a GPU-hour ({CURRENCY})", min_value=0, required=False)

    class Meta:
        model = models.Cluster
        exclude = ["spec"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spec = self.instance.spec or presets.local_cpu_cluster(1).to_dict()
        gpu = spec.get("gpu", {})
        self.initial.setdefault("gpu_name", gpu.get("name", ""))
        for name in self.GPU_FIELDS:
            self.initial.setdefault(name, gpu.get(name))
        for name in self.MACHINE_FIELDS:
            self.initial.setdefault(name, spec.get(name))

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("gpu_preset"):
            preset = presets.GPUS[cleaned["gpu_preset"]].to_dict()
            cleaned["gpu_name"] = preset["name"]
            cleaned.update({name: preset[name] for name in self.GPU_FIELDS})
        elif not cleaned.get("gpu_name"):
            self.add_error("gpu_name", "name the GPU, or pick a GPU model from the presets")
        # Without its figures the spec stays as it was: the form shows the fields' own errors, not the spec's.
        self.instance.spec = self.instance.spec or presets.local_cpu_cluster(1).to_dict()
        if not self.errors:
            spec = dict(self.instance.spec)
            spec["gpu"] = {**spec.get("gpu", {}), "name": cleaned["gpu_name"],
                           **{name: cleaned[name] for name in self.GPU_FIELDS}}
            spec.update({name: cleaned[name] for name in self.MACHINE_FIELDS if cleaned.get(name) is not None})
            self.instance.spec = spec
        return cleaned


@admin.register(models.Cluster)
class ClusterAdmin(admin.ModelAdmin):
    form = ClusterForm
    list_display = ("name", "kind", "machines", "partition", "account", "created_at")
    fieldsets = [
        (None, {"fields": ("name", "kind", "runs_root")}),
        ("Machines", {"fields": ("gpu_preset", "gpu_name", "memory_gb", "peak_tflops", "memory_bandwidth_gbs",
                                 "nodes", "gpus_per_node", "intra_node_bandwidth_gbs", "inter_node_bandwidth_gbs",
                                 "gpu_hour_cost")}),
        ("Slurm", {"fields": ("partition", "account", "qos", "time_limit", "stop_before_limit_s", "env_setup",
                              "container_image", "rest_url")}),
        ("Calibration", {"fields": ("calibration_state",)}),
    ]
    readonly_fields = ("calibration_state",)
    list_filter = ("kind",)
    search_fields = ("name", "partition", "account")
    # slurmrestd usually answers plain HTTP on a login node: an address given without a scheme means http://
    formfield_overrides = {**OwnedAdmin.formfield_overrides,
                           models.Cluster._meta.get_field("rest_url").__class__: {"assume_scheme": "http"}}

    @admin.display(description="calibration")
    def calibration_state(self, cluster):
        """What estimates on the cluster use: the fit's note and fitted options (refit: POST
        /api/clusters/<id>/calibrate/)."""
        if cluster.pk is None:
            return "-"
        report = calibration_report(cluster)
        fitted = ", ".join(f"{k}={v:.4g}" for k, v in sorted(report["options"].items())
                           if isinstance(v, float) and k.endswith(("_s", "efficiency", "half_work")))
        return f"{report['note']} ({report['records']} record(s))" + (f"; {fitted}" if fitted else "")

    @admin.display(description="machines")
    def machines(self, cluster):
        spec = cluster.spec or {}
        return f"{spec.get('nodes', '?')} × {spec.get('gpus_per_node', '?')} {spec.get('gpu', {}).get('name', '')}"


@admin.register(models.DataRoot)
class DataRootAdmin(admin.ModelAdmin):
    """Folders staff open to some users or groups for their datasets (the global data roots are settings)."""

    list_display = ("path", "description", "created_at")
    search_fields = ("path", "description")
    formfield_overrides = OwnedAdmin.formfield_overrides


class MetricInline(admin.TabularInline):
    model = models.Metric
    extra = 0
    fields = ("kind", "step", "loss", "recorded_at")
    readonly_fields = fields
    can_delete = False
    max_num = 0


class RunAddForm(forms.ModelForm):
    """A new run is checked as run_create checks it, so the form refuses what the API would refuse."""

    def clean(self):
        cleaned = super().clean()
        plan, dataset = cleaned.get("plan"), cleaned.get("dataset")
        if plan and dataset and not self.errors:
            try:
                services.run_check(models.Run(**cleaned, model_config=plan.model_config, cluster=plan.cluster))
            except ValidationError as exc:
                for field, problems in exc.message_dict.items():
                    self.add_error(field if field in self.fields else None, problems)
        return cleaned


@admin.register(models.Run)
class RunAdmin(OwnedAdmin):
    """Runs are created by run_create and change state only through the services (the actions here), never
    by editing a field: the status follows Run.transition, and the rest is the stored spec or a worker's record."""

    list_display = ("name", "status", "model_config", "cluster", "attempts", "last_step", "owner", "created_at")
    list_filter = ("status", "cluster", "shared")
    actions = ["cancel", "queue"]
    inlines = [MetricInline]
    add_fields = ("name", "owner", "shared", "plan", "dataset", "steps", "seed", "checkpoint_every", "eval_every",
                  "optimizer", "profile", "max_restarts")
    state_fields = ("status", "status_message", "attempts", "restarts", "job_id", "run_dir", "last_step", "queued_at",
                    "launching_since", "started_at", "finished_at", "created_at", "updated_at")
    # What the stored spec was made of: changing these now would not change what the run launches with.
    definition_fields = ("model_config", "plan", "cluster", "dataset", "steps", "seed", "checkpoint_every",
                         "eval_every", "optimizer", "profile", "spec_json")

    def get_form(self, request, obj=None, **kwargs):
        if obj is None:
            kwargs["form"] = RunAddForm
        return super().get_form(request, obj, **kwargs)

    def get_fields(self, request, obj=None):
        if obj is None:
            return self.add_fields
        return ("name", "owner", "shared", "max_restarts", *self.state_fields, *self.definition_fields)

    def get_readonly_fields(self, request, obj=None):
        return () if obj is None else self.state_fields + self.definition_fields

    @admin.display(description="spec")
    def spec_json(self, run):
        return format_html("<pre>{}</pre>", json.dumps(run.spec, indent=2)) if run.spec else "-"

    def save_form(self, request, form, change):
        if change:
            return super().save_form(request, form, change)
        fields = dict(form.cleaned_data)
        return services.run_create(owner=fields.pop("owner"), plan=fields.pop("plan"), dataset=fields.pop("dataset"),
                                   **fields)

    def save_model(self, request, obj, form, change):
        # A new run was saved by run_create. A changed one writes only what the form changed: a worker may have
        # moved the run's state since this request read it, and a whole-row save would put the old state back.
        if change:
            obj.save(update_fields=[*form.changed_data, "updated_at"])

    def save_related(self, request, form, formsets, change):
        for formset in formsets:  # runs have no many-to-many fields to save from the form
            self.save_formset(request, form, formset, change=change)

    @admin.action(description="Cancel the selected runs (a running job is stopped)", permissions=["change"])
    def cancel(self, request, queryset):
        self._each(request, queryset, "cancelled",
                   lambda run: services.run_cancel(run, f"cancelled by {request.user.get_username()} in the admin"))

    @admin.action(description="Queue the selected runs again (resuming from their newest checkpoint)",
                  permissions=["change"])
    def queue(self, request, queryset):
        self._each(request, queryset, "queued", services.run_queue)

    def _each(self, request, queryset, done: str, service) -> None:
        count = 0
        for run in queryset:
            try:
                service(run)
                count += 1
            except ValidationError as exc:
                self.message_user(request, f"run {run.pk} ({run.name}): {' '.join(exc.messages)}", messages.WARNING)
        if count:
            self.message_user(request, f"{count} run(s) {done}", messages.SUCCESS)


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
    # what the last status check saw (webapp.services.triton), not a setting
    readonly_fields = ("is_ready", "last_seen_at", "created_at")


@admin.register(models.Deployment)
class DeploymentAdmin(OwnedAdmin):
    list_display = ("model_name", "server", "checkpoint", "reduction", "status", "owner", "created_at")
    list_filter = ("status", "reduction", "server")
    search_fields = ("model_name",)
    # A deployment's state is the deploy task's record; it changes through the services (the pages, the API).
    readonly_fields = ("status", "status_message", "repository_path", "report", "smoke_ok", "ready_at", "claimed_at",
                       "unloaded_at", "created_at", "updated_at")


class PromptTemplateVersionInline(admin.TabularInline):
    """Earlier versions, as the playground saved them: a record, not something to edit."""

    model = models.PromptTemplateVersion
    extra = 0
    fields = ("number", "template", "examples", "sampling", "created_at")
    readonly_fields = fields
    can_delete = False
    max_num = 0


@admin.register(models.PromptTemplate)
class PromptTemplateAdmin(OwnedAdmin):
    inlines = [PromptTemplateVersionInline]


@admin.register(models.PlaygroundRecord)
class PlaygroundRecordAdmin(admin.ModelAdmin):
    """What users asked in the playground and what came back; written by the playground only."""

    list_display = ("created_at", "owner", "model_name", "source", "finish_reason", "completion_tokens")
    list_filter = ("source", "finish_reason")
    search_fields = ("input", "model_name", "owner__username")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(models.TuneJob)
class TuneJobAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "status", "dataset", "trial_steps", "created_at", "finished_at")
    list_filter = ("status",)
    readonly_fields = ("progress", "report", "message", "claimed_at", "finished_at")


# Django's two-pane chooser (filter_horizontal) puts ARIA attributes on elements that may not carry them, which
# screen readers misread (axe-core rates it serious): users, groups and their permissions use plain multiple
# selects instead.
class UserAdmin(auth_admin.UserAdmin):
    filter_horizontal = ()


class GroupAdmin(auth_admin.GroupAdmin):
    filter_horizontal = ()


admin.site.unregister(User)
admin.site.register(User, UserAdmin)
admin.site.unregister(Group)
admin.site.register(Group, GroupAdmin)
