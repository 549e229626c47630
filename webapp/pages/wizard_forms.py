"""The New-run wizard's fields, and what they become: a model, a plan and a cluster as the contract's JSON.

Three forms, each with its HTML prefix (``model-``, ``plan-``, ``run-``), so that a contract error's dotted path
(``plan.tp``, ``model.n_heads``, ``profile.steps``) lands next to the field it names. The forms only parse what was
typed; every rule and every message is the contract's or the planner's, asked through the same functions the REST
API asks.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin, get_type_hints

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError

from trainer.contract import ModelSpec, ParallelPlan, ProfileSpec
from trainer.contract.presets import MODELS

from ..models import Cluster, Dataset, EvaluationSet, ModelConfig
from ..selectors.owned import visible_with_owners
from ..services import default_source_name
from ..services.demo import demo_ready
from .wizard_figures import CURRENCY

DEFAULT_PRESET = "tiny"
# A first run on the local cluster's two CPU ranks: a two-block tiny GPT, data parallel over both, fp32 (the CPU's
# own precision), 30 steps with a checkpoint at the end and three profiled steps, done in well under a minute.
DEFAULT_MODEL = MODELS[DEFAULT_PRESET].replace(n_layers=2)
DEFAULT_PLAN = ParallelPlan(dp=2, tp=1, pp=1, micro_batch=2, global_batch=4, precision="fp32")
DEFAULT_PROFILE = ProfileSpec()
DEFAULT_RUN = {"name": "tiny demo", "steps": 30, "checkpoint_every": 30, "eval_every": 10, "profile": True,
               "profile_start": DEFAULT_PROFILE.start_step, "profile_steps": DEFAULT_PROFILE.steps,
               "token_budget": "1e8", "gpu_hour_cost": None}
MAX_CONFIGS_LISTED = 200

MODEL_HELP = {
    "n_layers": "transformer blocks",
    "d_model": "hidden width",
    "n_heads": "attention heads; they divide d_model",
    "n_kv_heads": "key/value heads; 0: as many as n_heads, fewer: grouped-query attention",
    "ffn_hidden": "MLP width; 0: 4 × d_model (GELU), 8/3 × d_model rounded up to 256 (SwiGLU)",
    "seq_len": "tokens per sequence",
    "vocab_size": "tokens in the vocabulary",
    "norm": "LayerNorm (GPT) or RMSNorm (Llama, Mixtral, Qwen) before each block",
    "activation": "the MLP: GELU (GPT) or SwiGLU, three matrices (Llama, Mixtral, Qwen)",
    "positions": "learned position embeddings, or rotary",
    "rope_base": "the rotary base θ (10,000; Llama 3: 500,000)",
    "tied_embeddings": "the output head is the token embedding",
    "n_experts": "experts per MoE block; 0: a dense model",
    "top_k": "experts each token is routed to",
    "moe_ffn_hidden": "each expert's MLP width; 0: ffn_hidden",
    "moe_every": "every n-th block has experts",
    "first_dense_layers": "leading blocks that keep a dense MLP",
    "shared_expert_ffn": "width of a shared expert every token also passes through; 0: none",
    "topk_norm": "the chosen experts' weights: renormalised to sum to 1, or the router's as they are",
    "capacity_factor": "tokens an expert may take, as a multiple of its share; 0: no token dropped",
}
PLAN_HELP = {
    "dp": "data-parallel replicas",
    "tp": "tensor-parallel degree: each layer's heads and MLP split over tp ranks of a node",
    "pp": "pipeline stages",
    "cp": "context-parallel degree: each sequence split over cp ranks, attention passed around a ring",
    "micro_batch": "sequences per micro-batch on one rank",
    "global_batch": "sequences per step, a multiple of micro_batch × dp",
    "sequence_parallel": "split LayerNorm and dropout activations over the tensor-parallel group (tp > 1)",
    "ep": "expert-parallel degree: experts spread over data-parallel ranks",
    "engine": "the native engine (DDP, FSDP2, DTensor) or DeepSpeed",
    "zero_stage": "native: 0 (DDP) or 3 (FSDP2); deepspeed: 0 to 3",
    "activation_checkpointing": "recompute activations in backward instead of keeping them",
    "precision": "the precision of compute",
    "pipeline_schedule": "how micro-batches flow through the stages (pp > 1)",
    "virtual_stages": "model chunks per pipeline rank: 2 or more for interleaved, any for zb-interleaved, "
                      "2 for zbv and dualpipev",
    "stage_layers": "layers of each stage, e.g. 7, 8, 8, 7; empty: equal stages",
    "first_stage_layers": "layers of the first stage, the rest spread evenly; 0: an equal share",
    "last_stage_layers": "layers of the last stage, the rest spread evenly; 0: an equal share",
    "offload_optimizer": "optimizer states in host memory (deepspeed, ZeRO ≥ 1)",
    "offload_params": "parameters in host memory (deepspeed, ZeRO 3)",
}
MODEL_FIELDS = tuple(MODEL_HELP)
PLAN_FIELDS = tuple(PLAN_HELP)
# Where a run spec's own fields and its profile land among the run form's fields.
PROFILE_FIELDS = {"start_step": "profile_start", "warmup": "profile_start", "steps": "profile_steps",
                  "name": "profile"}
RUN_SPEC_FIELDS = ("name", "steps", "checkpoint_every", "eval_every")


class OptionAttrsSelect(forms.Select):
    """A select whose options carry data attributes (a preset's spec, a cluster's size) for the page's script."""

    def __init__(self, *args, option_attrs: dict[str, dict[str, str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.option_attrs = option_attrs or {}

    def create_option(self, name, value, *args, **kwargs):
        option = super().create_option(name, value, *args, **kwargs)
        option["attrs"].update(self.option_attrs.get(str(value), {}))
        return option


def _spec_field(cls: type, name: str, help_text: str) -> forms.Field:
    """A form field of the type the spec's field has; its range is left to the contract, whose messages name it."""
    hint = get_type_hints(cls)[name]
    if get_origin(hint) is Literal:
        return forms.ChoiceField(choices=[(v, v) for v in get_args(hint)], help_text=help_text, label=name)
    if hint is bool:
        return forms.BooleanField(required=False, help_text=help_text, label=name)
    if hint is int:
        return forms.IntegerField(help_text=help_text, label=name)
    if hint is float:
        return forms.FloatField(help_text=help_text, label=name)
    if hint == tuple[int, ...]:
        return IntListField(required=False, help_text=help_text, label=name)
    raise TypeError(f"{cls.__name__}.{name}: no form field for {hint}")


class IntListField(forms.CharField):
    """Whole numbers separated by commas or spaces (a plan's stage_layers), as a tuple; empty is ()."""

    def to_python(self, value):
        text = super().to_python(value)
        try:
            return tuple(int(part) for part in text.replace(",", " ").split())
        except ValueError:
            raise ValidationError("give whole numbers separated by commas, e.g. 7, 8, 8, 7") from None

    def prepare_value(self, value):
        return ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else value


class _Described(forms.Form):
    """Every input names its hint and the list its errors appear in, so that a screen reader reads both."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name, field in self.fields.items():
            bound = self[name]
            described = [error_list_id(bound.html_name)]
            if field.help_text:
                described.append(f"{bound.auto_id}-hint")
            field.widget.attrs["aria-describedby"] = " ".join(described)

    def mark_invalid(self) -> None:
        """aria-invalid on each input with an error; called once every error is in, before rendering."""
        for name, field in self.fields.items():
            if self[name].errors:
                field.widget.attrs["aria-invalid"] = "true"


def error_list_id(html_name: str) -> str:
    return f"errors-{html_name}"


FAMILY_NAMES = {"gpt": "GPT", "llama": "Llama", "qwen2": "Qwen2", "mixtral": "Mixtral", "qwen2-moe": "Qwen2-MoE"}


def shape_text(spec: ModelSpec) -> str:
    """A preset's shape in a few words: layers × width, heads, and its experts."""
    heads = f"{spec.n_heads} heads" + (f", {spec.kv_heads} KV" if spec.kv_heads != spec.n_heads else "")
    experts = f", {spec.n_experts} experts top-{spec.top_k}" if spec.is_moe else ""
    return f"{spec.n_layers} × {spec.d_model}, {heads}{experts}"


def _source_choices(user) -> tuple[list, dict[str, dict[str, str]], dict[str, Any]]:
    """The model select's grouped choices, each option's spec for the page's script, and each value's source."""
    families: dict[str, list] = {}
    configs, attrs, sources = [], {}, {}
    for name, spec in MODELS.items():
        value = f"preset:{name}"
        families.setdefault(spec.family, []).append((value, f"{name} ({shape_text(spec)})"))
        attrs[value] = {"data-spec": json.dumps(spec.to_dict())}
        sources[value] = (name, spec.to_dict(), None)
    visible = visible_with_owners(ModelConfig.objects.all(), user).order_by("-created_at", "-id")
    for config in visible[:MAX_CONFIGS_LISTED]:
        value = f"config:{config.pk}"
        whose = "yours" if config.owner_id == user.pk else f"shared by {config.owner.username}"
        configs.append((value, f"{config.name} ({whose})"))
        attrs[value] = {"data-spec": json.dumps(config.spec)}
        sources[value] = (config.name, config.spec, config)
    choices = [(f"{FAMILY_NAMES[family]} presets", presets) for family, presets in families.items()]
    choices += [("Model configs", configs)] if configs else []
    return choices, attrs, sources


class ModelForm(_Described):
    source = forms.ChoiceField(label="Start from", help_text="a preset shape or a model config you may use; the "
                                                             "fields below are its figures, to change")

    def __init__(self, *args, user, **kwargs):
        choices, attrs, self.sources = _source_choices(user)
        self.base_fields = {"source": self.base_fields["source"],
                            **{n: _spec_field(ModelSpec, n, MODEL_HELP[n]) for n in MODEL_FIELDS}}
        super().__init__(*args, **kwargs)
        self.fields["source"].choices = choices
        self.fields["source"].widget = OptionAttrsSelect(choices=choices, option_attrs=attrs)
        self.fields["source"].widget.attrs["aria-describedby"] = f"{error_list_id(self['source'].html_name)} " \
                                                                 f"{self['source'].auto_id}-hint"

    def spec_dict(self) -> dict | None:
        """The chosen source's spec with the fields as typed (the contract checks it later), or None."""
        if not self.is_valid():
            return None
        _, base, _ = self.sources[self.cleaned_data["source"]]
        return {**base, **{n: self.cleaned_data[n] for n in MODEL_FIELDS}}

    def chosen(self) -> tuple[str, dict, ModelConfig | None]:
        """The chosen source: its name, its spec and, for a stored model config, the config."""
        return self.sources[self.cleaned_data["source"]]


class PlanForm(_Described):
    def __init__(self, *args, **kwargs):
        self.base_fields = {n: _spec_field(ParallelPlan, n, PLAN_HELP[n]) for n in PLAN_FIELDS}
        self.base_fields["zero_stage"] = forms.TypedChoiceField(
            choices=[(s, str(s)) for s in range(4)], coerce=int, label="zero_stage", help_text=PLAN_HELP["zero_stage"])
        super().__init__(*args, **kwargs)

    def spec_dict(self) -> dict | None:
        return {n: self.cleaned_data[n] for n in PLAN_FIELDS} if self.is_valid() else None


class RunForm(_Described):
    cluster = forms.ModelChoiceField(queryset=Cluster.objects.all(), empty_label=None, label="Cluster",
                                     help_text="where the run trains")
    dataset = forms.ModelChoiceField(queryset=Dataset.objects.none(), empty_label=None, label="Dataset",
                                     help_text="the text it trains on")
    blend_with = forms.ModelChoiceField(queryset=Dataset.objects.none(), required=False, label="Blend with",
                                        empty_label="nothing: the dataset alone",
                                        help_text="another dataset to train on beside it; each one's validation "
                                                  "loss is charted on its own")
    blend_weight = forms.FloatField(required=False, min_value=1e-9, max_value=1e9, label="Its weight",
                                    help_text="its share of the sequences against the dataset's weight of 1 "
                                              "(empty: 1, half each)")
    evaluate_on = forms.ModelMultipleChoiceField(queryset=EvaluationSet.objects.none(), required=False,
                                                 label="Evaluate checkpoints on",
                                                 help_text="evaluation sets each saved checkpoint is scored on; the "
                                                           "scores are charted beside the loss")
    name = forms.CharField(max_length=120, label="Run name")
    steps = forms.IntegerField(label="Steps", help_text="optimizer steps to train")
    checkpoint_every = forms.IntegerField(label="Checkpoint every", help_text="steps between checkpoints, and one "
                                                                              "at the end; 0: none")
    eval_every = forms.IntegerField(label="Evaluate every", help_text="steps between validation losses; 0: never")
    profile = forms.BooleanField(required=False, label="Profile", help_text="record a few steps with the profiler")
    profile_start = forms.IntegerField(required=False, label="Profile from step",
                                       help_text="the first profiled step")
    profile_steps = forms.IntegerField(required=False, label="Profiled steps")
    token_budget = forms.FloatField(required=False, label="Token budget",
                                    help_text="tokens to train on, for the time and cost to reach them")
    gpu_hour_cost = forms.FloatField(required=False, label=f"Cost per GPU-hour ({CURRENCY})",
                                     help_text="empty: the cluster's own figure")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["dataset"].queryset = visible_with_owners(Dataset.objects.all(), user)
        self.fields["blend_with"].queryset = self.fields["dataset"].queryset
        self.fields["evaluate_on"].queryset = EvaluationSet.objects.visible_to(user).order_by("name", "id")
        clusters = list(Cluster.objects.all())
        sizes = {}
        for cluster in clusters:
            try:
                sizes[str(cluster.pk)] = {"data-world": str(cluster.cluster_spec().world_size)}
            except ValueError:  # a stored spec the contract no longer accepts: chosen, it shows why
                pass
        field = self.fields["cluster"]
        field.widget = OptionAttrsSelect(choices=field.choices, option_attrs=sizes, attrs=field.widget.attrs)

    def blend(self) -> list[dict]:
        """The run's blend: the other dataset, if one was chosen, under its dataset's name."""
        other = self.cleaned_data.get("blend_with")
        if other is None:
            return []
        weight = self.cleaned_data.get("blend_weight")
        return [{"dataset": other.pk, "weight": 1.0 if weight is None else weight,
                 "name": default_source_name(other)}]

    def profile_dict(self) -> dict | None:
        data = self.cleaned_data
        if not data.get("profile"):
            return None
        start = data.get("profile_start")
        start = DEFAULT_PROFILE.start_step if start is None else start
        steps = data.get("profile_steps")
        # One unrecorded warm-up step before the window when there is room for it (the profiler's default).
        return ProfileSpec(start_step=start, steps=DEFAULT_PROFILE.steps if steps is None else steps,
                           warmup=min(DEFAULT_PROFILE.warmup, max(start, 0))).to_dict()


def _flat(values: dict[str, Any]) -> dict[str, str]:
    """Form data as a browser sends it: checked boxes as 'on', unchecked ones absent."""
    data = {}
    for key, value in values.items():
        if value is True:
            data[key] = "on"
        elif isinstance(value, tuple):
            data[key] = ", ".join(map(str, value))
        elif value is not None and value is not False:
            data[key] = str(value)
    return data


def default_data(user) -> dict[str, str]:
    """What the wizard shows first: the demo's model, plan, cluster and dataset."""
    cluster, dataset = demo_ready(user)
    plan = DEFAULT_PLAN
    try:  # data parallel over every rank of the local cluster, however many staff gave it
        world = cluster.cluster_spec().world_size
        plan = plan.replace(dp=world, global_batch=plan.micro_batch * world)
    except ValueError:  # a spec the contract refuses: the page says why next to the cluster
        pass
    model = {f"model-{n}": getattr(DEFAULT_MODEL, n) for n in MODEL_FIELDS}
    plan = {f"plan-{n}": getattr(plan, n) for n in PLAN_FIELDS}
    run = {f"run-{k}": v for k, v in DEFAULT_RUN.items()}
    return _flat({"model-source": f"preset:{DEFAULT_PRESET}", **model, **plan, **run,
                  "run-cluster": cluster.pk, "run-dataset": dataset.pk})


@dataclass
class Parts:
    """What the forms parsed, as the planner's request takes it; a part is None where its fields did not parse."""

    model: dict | None
    plan: dict | None
    cluster: dict | None
    token_budget: float | None


class Wizard:
    """The three forms together, and the one place errors from any layer are put next to their fields."""

    def __init__(self, user, data):
        self.user = user
        self.model = ModelForm(data, prefix="model", user=user)
        self.plan = PlanForm(data, prefix="plan")
        self.run = RunForm(data, prefix="run", user=user)
        self.forms = {"model": self.model, "plan": self.plan, "run": self.run}

    @property
    def has_errors(self) -> bool:
        return any(form.errors for form in self.forms.values())

    def parts(self) -> Parts:
        cluster = None
        self.run.is_valid()  # fills cleaned_data with every field that parsed
        if "cluster" in self.run.cleaned_data:
            cluster = dict(self.run.cleaned_data["cluster"].spec)
            cost = self.run.cleaned_data.get("gpu_hour_cost")
            if cost is not None:
                cluster["gpu_hour_cost"] = cost
        return Parts(self.model.spec_dict(), self.plan.spec_dict(), cluster, self.run.cleaned_data.get("token_budget"))

    # -- errors ---------------------------------------------------------------------------------------------------

    def place(self, path: str) -> tuple[forms.Form, str | None, str]:
        """The form and field a contract error's dotted path names (None: the form as a whole), and the rest of the
        path a message should keep when no field of its own shows it."""
        head, _, rest = path.partition(".")
        key = rest.split(".")[0]
        if head == "model":
            return self.model, key if key in MODEL_FIELDS else None, rest
        if head == "plan":
            return self.plan, key if key in PLAN_FIELDS else None, rest
        if head == "cluster":
            return self.run, "gpu_hour_cost" if key == "gpu_hour_cost" else "cluster", ""
        if head == "dataset":
            return self.run, "dataset", ""
        if head == "profile":
            return self.run, PROFILE_FIELDS.get(key, "profile"), ""
        if head in RUN_SPEC_FIELDS or head in ("token_budget", "gpu_hour_cost"):
            return self.run, head, ""
        return self.run, None, path

    def add_errors(self, errors: dict[str, list]) -> None:
        """Contract errors (``{dotted path: [message]}``) next to the fields they name."""
        for path, messages in errors.items():
            if isinstance(messages, dict):  # a nested serializer's errors
                self.add_errors({f"{path}.{k}": v for k, v in messages.items()})
                continue
            form, field, rest = self.place(path)
            for message in messages if isinstance(messages, list) else [messages]:
                text = str(message)
                if field is None and rest and not text.startswith(rest):
                    text = f"{rest}: {text}"
                self._add(form, field, text)

    def add_validation_error(self, exc: ValidationError, prefix: str = "") -> None:
        """A Django ValidationError of the services or models. Their messages keep the contract's path in front
        ("plan.tp: …", or "tp: …" on a model's spec field, under ``prefix``); that path places them."""
        if not hasattr(exc, "error_dict"):
            for message in exc.messages:
                self._add(self.run, None, message)
            return
        for key, messages in exc.message_dict.items():
            for message in messages:
                path, sep, text = message.partition(": ")
                if sep and " " not in path and (path.split(".")[0] == key or key == "spec"):
                    self.add_errors({f"{prefix}.{path}" if prefix else path: [text]})
                elif key == "spec" and prefix:
                    self.add_errors({prefix: [message]})
                else:
                    self.add_errors({"" if key == NON_FIELD_ERRORS else key: [message]})

    @staticmethod
    def _add(form: forms.Form, field: str | None, message: str) -> None:
        form.errors  # parse first: add_error on an unparsed form would be overwritten by its own cleaning
        if field is not None and field not in form.fields:
            field = None
        if message in list(form.errors.get(field or NON_FIELD_ERRORS) or []):
            return
        form.add_error(field, message)

    def error_lists(self) -> list[tuple[str, str | None, list[str]]]:
        """Every error list of the page, empty or not, as (element id, the input it is for, messages): what an
        estimate sends back so that the lists of fields now right empty out."""
        lists = []
        for prefix, form in self.forms.items():
            lists.append((error_list_id(prefix), None, list(form.non_field_errors())))
            for name in form.fields:
                bound = form[name]
                lists.append((error_list_id(bound.html_name), bound.auto_id, list(bound.errors)))
        return lists

    def all_errors(self) -> list[tuple[str, str]]:
        """(the input's id or '', message) for every error, for a summary at the top of a refused launch."""
        found = []
        for prefix, form in self.forms.items():
            found += [("", m) for m in form.non_field_errors()]
            for name in form.fields:
                found += [(form[name].auto_id, f"{form[name].label}: {m}") for m in form[name].errors]
        return found
