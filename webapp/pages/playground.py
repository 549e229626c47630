"""The prompt playground: a ready deployment (or two side by side) answering a prompt written from a template, streamed
into the page by playground.js through the deployments' generate endpoint, with what the page measured of it;
templates saved as versions, zero-/one-/few-shot presets, the history of what was asked (replayable), and a prompt
set answered as a table.

The page checks what was typed here (``prepare``: the prompt written out and the sampling, or the fields to fix),
then the browser streams from /api/deployments/<id>/generate/ and posts what came back to ``record``. A prompt set
is answered here, whole, by webapp.services.playground through the same inference service.
"""
import json

from django import forms
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import JsonResponse
from django.shortcuts import render
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_POST

from ..api.serving_serializers import (MAX_EXAMPLES, MAX_PROMPT_CHARS, MAX_SEED, MAX_STOP_CHARS, MAX_STOPS,
                                       MAX_TOKENS, MAX_TOP_K, top_p_problem)
from ..models import Deployment, PlaygroundRecord
from ..selectors.deployments import ready_deployments
from ..selectors.playground import playground_history, template_versions
from ..services import playground as service
from ..services.context_window import PromptRefused, fit_prompt
from ..services.triton import ServingUnavailable

MAX_TEMPLATE_CHARS = 10_000
MAX_EXAMPLE_CHARS = 10_000
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def parse_stops(text: str) -> list[str]:
    """Stop strings typed one a line, where \\n, \\t and \\\\ stand for a line break, a tab and a backslash."""
    stops = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if not line:
            continue
        out, chars = [], iter(line)
        for char in chars:
            if char == "\\":
                following = next(chars, "")
                out.append(_ESCAPES.get(following, "\\" + following))
            else:
                out.append(char)
        stops.append("".join(out))
    return stops


def stops_text(stops: list[str]) -> str:
    return "\n".join(s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t") for s in stops)


class DeploymentChoice(forms.ModelChoiceField):
    def label_from_instance(self, obj):
        return f"{obj.model_name} #{obj.pk} on {obj.server.name}"


class TemplateForm(forms.Form):
    """A template, its examples and the sampling: what a saved version holds."""

    template = forms.CharField(max_length=MAX_TEMPLATE_CHARS, strip=False, initial="{examples}{input}")
    examples = forms.CharField(required=False, strip=False, initial="[]")
    temperature = forms.FloatField(min_value=0, max_value=100, initial=0.0)
    top_k = forms.IntegerField(min_value=0, max_value=MAX_TOP_K, initial=0, label="Top-k")
    top_p = forms.FloatField(initial=1.0, label="Top-p")
    max_tokens = forms.IntegerField(min_value=1, max_value=MAX_TOKENS, initial=64)
    seed = forms.IntegerField(min_value=0, max_value=MAX_SEED, required=False)
    stop = forms.CharField(required=False, strip=False, max_length=MAX_STOPS * (2 * MAX_STOP_CHARS + 1))

    def clean_template(self):
        template = self.cleaned_data["template"]
        problem = service.template_problem(template)
        if problem:
            raise forms.ValidationError(problem)
        return template

    def clean_examples(self):
        text = self.cleaned_data["examples"].strip() or "[]"
        try:
            examples = json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(f"not JSON ({exc}): give a list like "
                                        f'[{{"input": "2+2", "output": " 4"}}]') from None
        if not isinstance(examples, list) or len(examples) > MAX_EXAMPLES:
            raise forms.ValidationError(f"give a list of at most {MAX_EXAMPLES} examples, each "
                                        f'{{"input": "…", "output": "…"}}')
        for n, example in enumerate(examples, 1):
            if (not isinstance(example, dict) or set(example) != {"input", "output"}
                    or not all(isinstance(v, str) and len(v) <= MAX_EXAMPLE_CHARS for v in example.values())):
                raise forms.ValidationError(f"example {n}: give exactly an \"input\" and an \"output\", each text of "
                                            f"at most {MAX_EXAMPLE_CHARS:,} characters")
        return examples

    def clean_top_p(self):
        value = self.cleaned_data["top_p"]
        if top_p_problem(value):
            raise forms.ValidationError(top_p_problem(value))
        return value

    def clean_stop(self):
        stops = parse_stops(self.cleaned_data["stop"])
        if len(stops) > MAX_STOPS or not all(1 <= len(s) <= MAX_STOP_CHARS for s in stops):
            raise forms.ValidationError(f"give at most {MAX_STOPS} stop strings, one a line, of 1 to "
                                        f"{MAX_STOP_CHARS} characters each")
        return stops

    def sampling(self) -> dict:
        data = self.cleaned_data
        return {"temperature": data["temperature"], "top_k": data["top_k"], "top_p": data["top_p"],
                "max_tokens": data["max_tokens"], "seed": data["seed"], "stop": data["stop"]}


class SaveForm(TemplateForm):
    template_name = forms.CharField(max_length=120, label="Template name")


class _AnsweredForm(TemplateForm):
    deployment = DeploymentChoice(queryset=Deployment.objects.none(), empty_label=None)
    compare = DeploymentChoice(queryset=Deployment.objects.none(), required=False, empty_label="— none —",
                               label="Compare with")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["deployment"].queryset = self.fields["compare"].queryset = ready_deployments(user)

    def clean(self):
        data = super().clean()
        if data.get("compare") is not None and data.get("compare") == data.get("deployment"):
            self.add_error("compare", "choose another deployment to compare with, or none")
        return data

    def deployments(self) -> list[Deployment]:
        return [d for d in (self.cleaned_data["deployment"], self.cleaned_data.get("compare")) if d is not None]

    def _prompt_problem(self, text: str) -> str:
        prompt = service.render_prompt(self.cleaned_data["template"], self.cleaned_data["examples"], text)
        if not prompt:
            return "the prompt is empty: type something"
        if len(prompt) > MAX_PROMPT_CHARS:
            return f"the prompt written out has {len(prompt):,} characters; at most {MAX_PROMPT_CHARS:,}"
        return self._beyond_context(prompt)

    def _beyond_context(self, prompt: str) -> str:
        """Where the prompt and the answer asked for do not fit a chosen model's context: refused as /v1 refuses
        it, with its message (the engines would slide their window along instead, and answer from a cut prompt)."""
        max_tokens = self.cleaned_data.get("max_tokens")
        if max_tokens is None or "deployment" not in self.cleaned_data:
            return ""
        for deployment in self.deployments():
            try:
                fit_prompt(deployment, prompt, max_tokens=max_tokens, default_max_tokens=max_tokens)
            except PromptRefused as refused:
                return f"{deployment.model_name}: {refused}"
            except ServingUnavailable:
                pass  # its tokenizer cannot be read: the answer's stream says so
        return ""


class PromptForm(_AnsweredForm):
    input = forms.CharField(required=False, strip=False, max_length=MAX_PROMPT_CHARS)

    def clean(self):
        data = super().clean()
        if {"template", "examples"} <= set(data):
            problem = self._prompt_problem(data.get("input", ""))
            if problem:
                self.add_error("input", problem)
        return data


class SetForm(_AnsweredForm):
    prompts = forms.CharField(strip=False, max_length=MAX_PROMPT_CHARS,
                              error_messages={"required": "give the prompts, one a line"})

    def clean_prompts(self):
        inputs = [line for line in self.cleaned_data["prompts"].replace("\r\n", "\n").split("\n") if line.strip()]
        if not inputs:
            raise forms.ValidationError("give the prompts, one a line")
        if len(inputs) > service.MAX_SET_PROMPTS:
            raise forms.ValidationError(f"{len(inputs)} prompts: at most {service.MAX_SET_PROMPTS} a set")
        return inputs

    def clean(self):
        data = super().clean()
        if {"template", "examples", "prompts"} <= set(data):
            for n, text in enumerate(data["prompts"], 1):
                problem = self._prompt_problem(text)
                if problem:
                    self.add_error("prompts", f"prompt {n}: {problem}")
                    break
        return data


class GeneratedText(forms.CharField):
    """Text a model generated, or its server said: kept whatever it holds (a plain CharField refuses a NUL)."""

    def to_python(self, value):
        return service.keepable(super().to_python(value))


class RecordForm(forms.Form):
    """What the page posts when a streamed generation ends: the request, the answer, what it measured."""

    deployment = forms.ModelChoiceField(queryset=Deployment.objects.none())
    input = forms.CharField(required=False, strip=False, max_length=MAX_PROMPT_CHARS)
    template = forms.CharField(required=False, strip=False, max_length=MAX_TEMPLATE_CHARS)
    examples = forms.JSONField(required=False)
    prompt = forms.CharField(strip=False, max_length=MAX_PROMPT_CHARS)
    sampling = forms.JSONField(required=False)
    output = GeneratedText(required=False, strip=False, max_length=4 * MAX_PROMPT_CHARS)
    error = GeneratedText(required=False, max_length=10_000)
    finish_reason = forms.CharField(required=False, max_length=16)
    prompt_tokens = forms.IntegerField(required=False, min_value=0)
    completion_tokens = forms.IntegerField(required=False, min_value=0)
    ttft_ms = forms.FloatField(required=False, min_value=0)
    tokens_per_s = forms.FloatField(required=False, min_value=0)
    total_ms = forms.FloatField(required=False, min_value=0)

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        # any status: it may have been undeployed while it answered
        self.fields["deployment"].queryset = Deployment.objects.visible_to(user)

    def clean_examples(self):
        value = self.cleaned_data["examples"] or []
        if not isinstance(value, list):
            raise forms.ValidationError("give a list")
        return value

    def clean_sampling(self):
        value = self.cleaned_data["sampling"] or {}
        if not isinstance(value, dict):
            raise forms.ValidationError("give an object")
        return value


def _errors(form) -> dict:
    return {name or "__all__": [str(e) for e in errors] for name, errors in form.errors.items()}


def _versions(user) -> list[dict]:
    versions = []
    for v in template_versions(user):
        template = v.prompt_template
        owner = "" if template.owner_id == user.pk else f" ({template.owner.username}'s)"
        versions.append({"id": v.pk, "name": template.name, "group": f"{template.name}{owner}",
                         "label": f"{template.name} v{v.number}{owner} · {v.created_at:%Y-%m-%d %H:%M}",
                         "template": v.template, "examples": v.examples,
                         "sampling": {k: v.sampling.get(k) for k in service.TEMPLATE_SAMPLING},
                         "stop": stops_text(v.sampling.get("stop") or [])})
    return versions


def _templates_context(user, **extra) -> dict:
    versions = _versions(user)
    groups: dict[str, list[dict]] = {}
    for v in versions:
        groups.setdefault(v["group"], []).append(v)
    return {"versions": versions, "version_groups": groups, **extra}


def _history_context(user) -> dict:
    records = list(playground_history(user))
    for r in records:
        r.replay = json.dumps({"deployment": r.deployment_id, "input": r.input, "template": r.template,
                               "examples": r.examples, "sampling": {k: r.sampling.get(k)
                                                                    for k in service.TEMPLATE_SAMPLING},
                               "stop": stops_text(r.sampling.get("stop") or [])})
    return {"records": records}


@login_required
@require_GET
def page(request):
    form = PromptForm(user=request.user)
    ready = list(form.fields["deployment"].queryset)
    chosen = request.GET.get("deployment", "")
    selected = next((d for d in ready if str(d.pk) == chosen), ready[0] if ready else None)
    presets = {name: {"label": p["label"], "template": p["template"], "examples": p["examples"]}
               for name, p in service.PRESETS.items()}
    context = {"form": form, "ready": ready, "selected": selected, "presets": presets,
               "min_rate": {"tokens": service.MIN_RATE_TOKENS, "ms": service.MIN_RATE_MS},
               **_templates_context(request.user), **_history_context(request.user)}
    return render(request, "pages/playground.html", context)


@login_required
@require_POST
def prepare(request):
    """The prompt written out and the sampling for the generate endpoint, or {"errors": the fields to fix}."""
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        return JsonResponse({"errors": {"__all__": ["send the form as a JSON object"]}}, status=400)
    if not isinstance(body, dict):
        return JsonResponse({"errors": {"__all__": ["send the form as a JSON object"]}}, status=400)
    form = PromptForm({k: ("" if v is None else v) for k, v in body.items()}, user=request.user)
    if not form.is_valid():
        # answered 200: fields to fix are the page's own answer, shown beside them, not a failed request
        return JsonResponse({"errors": _errors(form)})
    data = form.cleaned_data
    prompt = service.render_prompt(data["template"], data["examples"], data["input"])
    sampling = form.sampling()
    return JsonResponse({
        "prompt": prompt, "input": data["input"], "template": data["template"], "examples": data["examples"],
        "params": {k: v for k, v in sampling.items() if v is not None}, "sampling": sampling,
        "deployments": [{"id": d.pk, "model_name": d.model_name, "server": d.server.name,
                         "url": reverse("deployment-generate", args=[d.pk])} for d in form.deployments()]})


@login_required
@require_POST
def record(request):
    """Keep a streamed generation in the user's history."""
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return JsonResponse({"errors": {"__all__": ["send a JSON object"]}}, status=400)
    form = RecordForm({k: v for k, v in body.items() if v is not None}, user=request.user)
    if not form.is_valid():
        return JsonResponse({"errors": _errors(form)}, status=400)
    data = {k: v for k, v in form.cleaned_data.items() if k != "deployment"}
    kept = service.playground_record(owner=request.user, deployment=form.cleaned_data["deployment"],
                                     source=PlaygroundRecord.Source.STREAM, **data)
    return JsonResponse({"id": kept.pk}, status=201)


@login_required
@require_GET
def history(request):
    return render(request, "pages/playground_history.html", _history_context(request.user))


@login_required
@require_POST
def save_template(request):
    """Save the form's template under a name as a new version (htmx: the saved-templates part again)."""
    form = SaveForm(request.POST)
    if not form.is_valid():
        # 200: htmx swaps in only a successful answer, and this one says what to fix
        return render(request, "pages/playground_templates.html",
                      _templates_context(request.user, save_errors=form.errors))
    data = form.cleaned_data
    version = service.prompt_template_save(owner=request.user, name=data["template_name"], template=data["template"],
                                           examples=data["examples"], sampling=form.sampling())
    note = f"Saved {version.prompt_template.name} as version {version.number}."
    return render(request, "pages/playground_templates.html",
                  _templates_context(request.user, note=note, chosen=version.pk))


@login_required
@require_POST
@transaction.non_atomic_requests  # generation waits on the model server: no transaction held meanwhile
def run_set(request):
    """Each prompt of the set answered whole by the chosen deployment (and the one compared), as a table."""
    form = SetForm(request.POST, user=request.user)
    if not form.is_valid():
        return render(request, "pages/playground_set.html", {"errors": form.errors})
    data = form.cleaned_data
    deployments = form.deployments()
    rows = service.prompt_set_run(owner=request.user, deployments=deployments, inputs=data["prompts"],
                                  template=data["template"], examples=data["examples"], sampling=form.sampling())
    response = render(request, "pages/playground_set.html", {"rows": rows, "deployments": deployments})
    response["HX-Trigger"] = "history-changed"
    return response


urlpatterns = [
    path("playground/", page, name="playground"),
    path("playground/prepare/", prepare, name="playground-prepare"),
    path("playground/history/", history, name="playground-history"),
    path("playground/history/record/", record, name="playground-record"),
    path("playground/templates/", save_template, name="playground-save-template"),
    path("playground/set/", run_set, name="playground-set"),
]
