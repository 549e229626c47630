"""The Deploy page: a checkpoint you may see deployed on a Triton server by an engine that can serve it (the
workbench's, or vLLM where its rules allow: an engine that cannot is offered disabled, with the reason), through
webapp.services.deployment_create, which a worker then exports, loads and smoke-checks; your deployments with their
status (polled while they move), engine, smoke check, where each came from (checkpoint → run → plan → model config)
and a way to undeploy them; and the Hugging Face layout both ways: a checkpoint exported as a folder transformers
loads, a model folder imported as a checkpoint (webapp.services.conversions, run by a worker as
``python -m deploy export-hf`` / ``import-hf``)."""
from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.utils.text import slugify
from django.views.decorators.http import require_GET, require_POST

from .. import services
from ..models import Checkpoint, Deployment, TritonServer
from ..selectors.checkpoints import checkpoints_visible_to
from ..selectors.deployments import deployments_with_lineage
from ..selectors.lineage import conversions_visible_to
from ..services.conversions import models_root
from ..services.deployments import MAX_TENSOR_PARALLEL, checkpoint_engines

IN_PROGRESS = (Deployment.Status.PENDING, Deployment.Status.EXPORTING, Deployment.Status.LOADING,
               Deployment.Status.RELOADING)
LISTED = 100
UNDEPLOY_POLLS = 60  # two minutes at one poll every 2 s


def default_model_name(checkpoint: Checkpoint) -> str:
    """A Triton model name from where the checkpoint came from: the run's name (or the import's) and its step."""
    base = checkpoint.run.name if checkpoint.run_id is not None else (checkpoint.name or "imported")
    name = slugify(f"{base}-step-{checkpoint.step}")[:100].strip("-_")
    return name or f"checkpoint-{checkpoint.pk}"


def checkpoint_label(checkpoint: Checkpoint) -> str:
    if checkpoint.run_id is None:
        return f"{checkpoint.name or checkpoint.path} (imported) · step {checkpoint.step}"
    return f"{checkpoint.run.name} #{checkpoint.run_id} · step {checkpoint.step}"


class CheckpointChoice(forms.ModelChoiceField):
    def label_from_instance(self, obj):
        return checkpoint_label(obj)


class ServerChoice(forms.ModelChoiceField):
    def label_from_instance(self, obj):
        return f"{obj.name} ({'ready' if obj.is_ready else 'not seen ready'}, {obj.instance_kind})"


class DeployForm(forms.Form):
    checkpoint = CheckpointChoice(queryset=Checkpoint.objects.none(), empty_label="— choose a checkpoint —")
    reduction = forms.ChoiceField(choices=Deployment.Reduction.choices, initial=Deployment.Reduction.NONE)
    server = ServerChoice(queryset=TritonServer.objects.all(), empty_label="— choose a server —",
                          label="Triton server")
    model_name = forms.CharField(max_length=100, required=False, strip=True)
    tensor_parallel = forms.IntegerField(min_value=1, max_value=MAX_TENSOR_PARALLEL, initial=1)
    # not required: an engine the page disabled for the checkpoint chosen is not sent, and the workbench serves all
    engine = forms.ChoiceField(choices=Deployment.Engine.choices, initial=Deployment.Engine.WORKBENCH, required=False)

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["checkpoint"].queryset = checkpoints_visible_to(user).order_by("-created_at", "-step", "-id")
        # a single choice is made for the user
        for name in ("checkpoint", "server"):
            only = list(self.fields[name].queryset[:2])
            if len(only) == 1:
                self.fields[name].initial = only[0].pk
                if name == "checkpoint":
                    self.fields["model_name"].initial = default_model_name(only[0])


def _chosen(form: DeployForm, name: str):
    """The checkpoint or server the form holds (bound or initial), or None."""
    value = form[name].value()
    value = getattr(value, "pk", value)
    if not str(value or "").isdigit():
        return None
    return form.fields[name].queryset.filter(pk=int(value)).first()


def engine_context(form: DeployForm, oob: bool = False) -> dict:
    """The engine field: each engine, and why it cannot serve the checkpoint chosen on the server chosen ('' when
    it can); an engine that cannot is disabled with its reason, and the one that can is chosen instead."""
    checkpoint, server = _chosen(form, "checkpoint"), _chosen(form, "server")
    refused = checkpoint_engines(checkpoint, server) if checkpoint is not None else {}
    value = form["engine"].value() or Deployment.Engine.WORKBENCH
    if refused.get(value):
        value = Deployment.Engine.WORKBENCH
    engines = [{"value": v, "label": label, "refused": refused.get(v, "")} for v, label in Deployment.Engine.choices]
    return {"engines": engines, "engine": value, "engines_checked": checkpoint is not None,
            "engines_serving": [e["value"] for e in engines if not e["refused"]],
            "engine_errors": form.errors.get("engine", []) if form.is_bound else [], "oob": oob}


def _deployments(user):
    return list(deployments_with_lineage(user)[:LISTED])


def _rows_context(user, watching=(), polls: int = 0):
    deployments = _deployments(user)
    watching = {int(pk) for pk in watching if str(pk).isdigit()}
    # Undeploying changes nothing here until a worker has unloaded the model: that is watched too, for a while
    # (a worker that never comes must not keep the page polling for ever).
    watching = {d.pk for d in deployments if d.pk in watching and d.status == Deployment.Status.READY}
    if polls >= UNDEPLOY_POLLS:
        watching = set()
    return {"deployments": deployments, "watching": ",".join(map(str, sorted(watching))), "polls": polls + 1,
            "polling": bool(watching) or any(d.status in IN_PROGRESS for d in deployments)}


def _watch(query) -> tuple[list[str], int]:
    polls = query.get("polls", "")
    return query.get("watch", "").split(","), int(polls) if polls.isdigit() else 0


def _note(rows: dict, query) -> str:
    """What was just done, said on the page the redirect after it lands on."""
    by_pk = {str(d.pk): d for d in rows["deployments"]}
    if query.get("deployed") in by_pk:
        d = by_pk[query["deployed"]]
        return (f"Deployment {d.pk} ({d.model_name}) is queued: a worker exports, loads and checks it; its status "
                f"follows below.")
    if query.get("watch") in by_pk:
        return _undeploying(by_pk[query["watch"]])
    return ""


def _undeploying(deployment) -> str:
    return f"Undeploying {deployment.model_name}: a worker unloads it from {deployment.server.name}."


def _conversions_context(user) -> dict:
    conversions = list(conversions_visible_to(user)[:LISTED])
    return {"conversions": conversions, "conversions_polling": any(not c.is_settled for c in conversions)}


def _render_page(request, form):
    rows = _rows_context(request.user, *_watch(request.GET))
    return render(request, "pages/deploy.html", {"form": form, **rows, **_conversions_context(request.user),
                                                 **engine_context(form), "models_root": models_root(),
                                                 "page_note": _note(rows, request.GET)})


@login_required
def page(request):
    if request.method == "POST":
        form = DeployForm(request.POST, user=request.user)
        if form.is_valid():
            data = form.cleaned_data
            try:
                deployment = services.deployment_create(
                    owner=request.user, checkpoint=data["checkpoint"], server=data["server"],
                    model_name=data["model_name"] or default_model_name(data["checkpoint"]),
                    reduction=data["reduction"], tensor_parallel=data["tensor_parallel"],
                    engine=data["engine"] or Deployment.Engine.WORKBENCH)
            except ValidationError as exc:
                for name, problems in exc.message_dict.items():
                    form.add_error(name if name in form.fields else None, problems)
            else:
                return redirect(f"{reverse('pages:deploy')}?deployed={deployment.pk}")
        # 200, as a form page is answered: the browser shows it as the page it is, not as a failed load
        return _render_page(request, form)
    initial = {}
    chosen = request.GET.get("checkpoint", "")
    form = DeployForm(user=request.user)
    if chosen.isdigit():
        checkpoint = form.fields["checkpoint"].queryset.filter(pk=int(chosen)).first()
        if checkpoint is not None:
            initial = {"checkpoint": checkpoint.pk, "model_name": default_model_name(checkpoint)}
            form = DeployForm(user=request.user, initial=initial)
    return _render_page(request, form)


def _form_of_query(request) -> DeployForm:
    """The deploy form holding the checkpoint, server and engine of the query (what htmx sends on a change)."""
    return DeployForm(user=request.user, initial={name: request.GET.get(name, "")
                                                  for name in ("checkpoint", "server", "engine")})


@login_required
@require_GET
def model_name(request):
    """The model-name field, filled with the default for the checkpoint chosen (htmx, on change), and the engine
    field for it (swapped out of band): which engines can serve that checkpoint."""
    form = _form_of_query(request)
    checkpoint = _chosen(form, "checkpoint")
    value = default_model_name(checkpoint) if checkpoint is not None else ""
    return HttpResponse(render_to_string("pages/deploy_model_name.html", {"value": value}, request)
                        + render_to_string("pages/deploy_engine.html", engine_context(form, oob=True), request))


@login_required
@require_GET
def engine(request):
    """The engine field for the checkpoint and server chosen (htmx, when the server changes)."""
    return render(request, "pages/deploy_engine.html", engine_context(_form_of_query(request)))


@login_required
@require_GET
def rows(request):
    return render(request, "pages/deploy_rows.html", _rows_context(request.user, *_watch(request.GET)))


@login_required
@require_POST
def undeploy(request, pk):
    deployment = get_object_or_404(Deployment.objects.editable_by(request.user), pk=pk)
    services.deployment_undeploy(deployment)
    if request.headers.get("HX-Request"):
        context = _rows_context(request.user, [*request.POST.get("watch", "").split(","), str(pk)])
        return render(request, "pages/deploy_rows.html", {**context, "note": _undeploying(deployment)})
    return redirect(f"{reverse('pages:deploy')}?watch={pk}")


@login_required
@require_GET
def conversions(request):
    return render(request, "pages/deploy_conversions.html", _conversions_context(request.user))


def _refused(request, exc: ValidationError) -> None:
    for problems in exc.message_dict.values():
        for problem in problems:
            messages.error(request, problem)


@login_required
@require_POST
def export_hf(request):
    """Queue the export of a checkpoint you may see to the Hugging Face layout; its row follows on the page."""
    chosen = request.POST.get("checkpoint", "")
    checkpoint = checkpoints_visible_to(request.user).filter(pk=int(chosen)).first() if chosen.isdigit() else None
    if checkpoint is None:
        messages.error(request, "Choose a checkpoint to export.")
        return redirect("pages:deploy")
    try:
        conversion = services.checkpoint_export_hf(request.user, checkpoint)
    except ValidationError as exc:
        _refused(request, exc)
    else:
        messages.success(request, f"Export {conversion.pk} of checkpoint {checkpoint.pk} is queued: a worker writes "
                                  f"it to {conversion.target}.")
    return redirect("pages:deploy")


@login_required
@require_POST
def import_hf(request):
    """Queue the import of a model folder under the server's models directory as a checkpoint of yours."""
    path_given = request.POST.get("path", "").strip()[:500]
    name = request.POST.get("name", "").strip()[:120]
    try:
        conversion = services.checkpoint_import_hf(request.user, path_given, name)
    except ValidationError as exc:
        _refused(request, exc)
    else:
        messages.success(request, f"Import {conversion.pk} of {conversion.source} is queued.")
    return redirect("pages:deploy")


urlpatterns = [
    path("deploy/", page, name="deploy"),
    path("deploy/model-name/", model_name, name="deploy-model-name"),
    path("deploy/engine/", engine, name="deploy-engine"),
    path("deploy/deployments/", rows, name="deploy-rows"),
    path("deploy/<int:pk>/undeploy/", undeploy, name="deploy-undeploy"),
    path("deploy/conversions/", conversions, name="deploy-conversions"),
    path("deploy/export-hf/", export_hf, name="deploy-export-hf"),
    path("deploy/import-hf/", import_hf, name="deploy-import-hf"),
]
