"""New run: a model (a preset or a stored config, its figures editable), a cluster, a dataset, a parallelism plan and
the run's own fields, estimated live as they change, auto-tuned on demand, and launched in one press.

The estimate and the tune are the REST API's (the same request checks, the planner's JSON answers), rendered as
partials for htmx; a contract error lands next to the field its path names. Launching makes the model config (when
no config of the user's has that spec already), the plan (likewise) and the run through the services.
"""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_POST

from trainer.contract import ModelSpec, ParallelPlan, SpecError
from trainer.planner.tune.api import tune_json

from .. import services
from ..api.errors import ClientInputError, computing_on, require_finite
from ..api.planner_requests import EstimateRequestSerializer, TuneRequestSerializer
from ..models import ModelConfig, ParallelismPlan, Run
from ..selectors.calibration import calibrated_estimate
from ..services.deployments import model_engines
from .wizard_figures import estimate_view, tune_view
from .wizard_forms import Parts, Wizard, default_data

TUNE_TOP = 10


def _planner_errors(wizard: Wizard, serializer) -> bool:
    """Put a planner request's refusals next to the fields; True when it was accepted."""
    if serializer.is_valid():
        return True
    wizard.add_errors(serializer.errors)
    return False


def _estimate(request, wizard: Wizard, parts: Parts) -> dict | None:
    payload = {"model": parts.model, "plan": parts.plan, "cluster": parts.cluster}
    if parts.token_budget is not None:
        payload["token_budget"] = parts.token_budget
    body = EstimateRequestSerializer(data=payload, context={"request": request})
    if not _planner_errors(wizard, body):
        return None
    try:
        with computing_on("the estimate"):
            # the chosen cluster's calibration, when it has one, as the run made from these fields will get
            cluster = wizard.run.cleaned_data.get("cluster")
            return require_finite(calibrated_estimate(dict(body.validated_data), cluster), "the estimate")
    except SpecError as exc:
        wizard.add_errors(exc.errors)
    except ClientInputError as exc:
        wizard.add_errors({"plan": [str(exc.detail)]})
    return None


def _run_fields(wizard: Wizard) -> dict:
    data = wizard.run.cleaned_data
    return {"name": data["name"], "steps": data["steps"], "checkpoint_every": data["checkpoint_every"],
            "eval_every": data["eval_every"], "profile": wizard.run.profile_dict(), "blend": wizard.run.blend(),
            "evaluation_sets": list(data.get("evaluate_on") or [])}


def _unsaved_run(user, wizard: Wizard, parts: Parts) -> Run:
    cluster, dataset = wizard.run.cleaned_data["cluster"], wizard.run.cleaned_data["dataset"]
    config = ModelConfig(owner=user, name="", spec=parts.model)
    plan = ParallelismPlan(owner=user, name="", model_config=config, cluster=cluster, spec=parts.plan)
    fields = _run_fields(wizard)
    fields.pop("evaluation_sets")  # a relation of saved rows: checked when the run is made
    return Run(owner=user, plan=plan, model_config=config, cluster=cluster, dataset=dataset, **fields)


def check(request, wizard: Wizard) -> dict | None:
    """Estimate what the fields describe and check the run they make, every problem next to its field; the
    planner's answer, or None when the model, plan or cluster cannot be estimated."""
    parts = wizard.parts()
    if None in (parts.model, parts.plan, parts.cluster):
        return None
    answer = _estimate(request, wizard, parts)
    if answer is not None and wizard.run.is_valid():
        try:
            services.run_check(_unsaved_run(request.user, wizard, parts))
        except ValidationError as exc:
            wizard.add_validation_error(exc)
    return answer


def _context(wizard: Wizard, answer: dict | None, **more) -> dict:
    for form in wizard.forms.values():
        form.mark_invalid()
    steps = wizard.run.cleaned_data.get("steps") if hasattr(wizard.run, "cleaned_data") else None
    return {"wizard": wizard, "model": wizard.model, "plan": wizard.plan, "run": wizard.run,
            "estimate": estimate_view(answer, steps), "serving": _serving(wizard) if answer else [],
            "error_lists": wizard.error_lists(), "summary": wizard.all_errors(), **more}


def _serving(wizard: Wizard) -> list[dict]:
    """The engines that will serve the model as typed, on each kind of server (the model is valid: it has an
    estimate)."""
    try:
        return model_engines(ModelSpec.from_dict(wizard.model.spec_dict()))
    except (SpecError, TypeError):
        return []


# -- launching ----------------------------------------------------------------------------------------------------

class _Refused(Exception):
    """A part was refused; its errors are on the wizard and the transaction is rolled back."""


def _unique_name(model, owner, base: str) -> str:
    base = base[:110]
    taken = set(model.objects.filter(owner=owner, name__startswith=base).values_list("name", flat=True))
    if base not in taken:
        return base
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


def _same(spec_class, stored: dict, wanted) -> bool:
    try:
        return spec_class.from_dict(stored, validate=False) == wanted
    except (SpecError, TypeError, ValueError):
        return False


def _model_config(user, wizard: Wizard, spec: ModelSpec) -> ModelConfig:
    """The chosen config when its figures were kept, else one of the user's with this very spec, else a new one."""
    name, _, stored = wizard.model.chosen()
    if stored is not None and _same(ModelSpec, stored.spec, spec):
        return stored
    for config in ModelConfig.objects.filter(owner=user).only("pk", "name", "spec"):
        if _same(ModelSpec, config.spec, spec):
            return config
    config = ModelConfig(owner=user, name=_unique_name(ModelConfig, user, name), spec=spec.to_dict(),
                         description="made by the New-run wizard")
    try:
        config.full_clean()
    except ValidationError as exc:
        wizard.add_validation_error(exc, prefix="model")
        raise _Refused from None
    config.save()
    return config


def _plan(user, wizard: Wizard, config: ModelConfig, spec: ParallelPlan) -> ParallelismPlan:
    cluster = wizard.run.cleaned_data["cluster"]
    for plan in ParallelismPlan.objects.filter(owner=user, model_config=config, cluster=cluster):
        if _same(ParallelPlan, plan.spec, spec):
            return plan
    base = f"{config.name} dp{spec.dp} tp{spec.tp} pp{spec.pp} on {cluster.name}"
    plan = ParallelismPlan(owner=user, name=_unique_name(ParallelismPlan, user, base), model_config=config,
                           cluster=cluster, spec=spec.to_dict())
    try:
        plan.full_clean()
    except ValidationError as exc:
        wizard.add_validation_error(exc, prefix="plan")
        raise _Refused from None
    plan.save()
    return plan


def _launch(request, wizard: Wizard, parts: Parts) -> Run | None:
    try:
        with transaction.atomic():
            config = _model_config(request.user, wizard, ModelSpec.from_dict(parts.model))
            plan = _plan(request.user, wizard, config, ParallelPlan.from_dict(parts.plan))
            try:
                return services.run_create(owner=request.user, plan=plan, dataset=wizard.run.cleaned_data["dataset"],
                                           launch=True, **_run_fields(wizard))
            except ValidationError as exc:
                wizard.add_validation_error(exc)
                raise _Refused from None
    except _Refused:
        return None
    except IntegrityError:  # a name taken between the look and the save, by a launch at the same moment
        wizard.add_errors({"": ["another launch took the same model config or plan name just now: launch again"]})
        return None


# -- views --------------------------------------------------------------------------------------------------------

@login_required
def page(request):
    """The wizard with the demo's defaults (GET), or a launch (POST): the run's page, or the fields with errors."""
    if request.method != "POST":
        wizard = Wizard(request.user, default_data(request.user))
        return render(request, "pages/wizard.html", _context(wizard, check(request, wizard)))
    wizard = Wizard(request.user, request.POST)
    answer = check(request, wizard)
    if answer is not None and not wizard.has_errors:
        run = _launch(request, wizard, wizard.parts())
        if run is not None:
            messages.success(request, f"Run {run.name!r} is queued for the {run.cluster.name} cluster.")
            return redirect("pages:run", run.pk)
    return render(request, "pages/wizard.html", _context(wizard, answer, refused=wizard.all_errors()), status=400)


@login_required
@require_POST
def estimate(request):
    """The estimate panel for the fields as they are, and every field's errors out of band."""
    wizard = Wizard(request.user, request.POST)
    answer = check(request, wizard)
    return render(request, "pages/wizard_estimate.html", {**_context(wizard, answer), "oob": True})


@login_required
@require_POST
def tune(request):
    """Every valid plan for the model, cluster and global batch as typed, ranked; what does not fit, and why."""
    wizard = Wizard(request.user, request.POST)
    parts = wizard.parts()
    result, problems = None, []
    batch = wizard.plan.cleaned_data.get("global_batch") if hasattr(wizard.plan, "cleaned_data") else None
    if parts.model is None or parts.cluster is None or batch is None:
        problems = ["the model's figures, the cluster and global_batch must be given first"]
    else:
        body = TuneRequestSerializer(data={"model": parts.model, "cluster": parts.cluster, "global_batch": batch,
                                           "top_k": TUNE_TOP, "explain_top": 0}, context={"request": request})
        if _planner_errors(wizard, body):
            try:
                with computing_on("the tune"):
                    result = require_finite(tune_json(body.tune_payload()), "the tune")
            except SpecError as exc:
                wizard.add_errors(exc.errors)
            except ClientInputError as exc:
                problems = [str(exc.detail)]
        if result is None:
            problems += [message for _, message in wizard.all_errors()]
    return render(request, "pages/wizard_tune.html", {"tune": tune_view(result) if result else None,
                                                      "problems": problems})


urlpatterns = [
    path("runs/new/", page, name="run-new"),
    path("runs/new/estimate/", estimate, name="run-new-estimate"),
    path("runs/new/tune/", tune, name="run-new-tune"),
]
