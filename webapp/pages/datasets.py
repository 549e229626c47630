"""The Datasets page: the datasets you may use, one registered by its path (a text, JSONL, Parquet or Megatron file or
folder under your data roots, with the field its text is in and the tokenizer to keep), and each dataset's page, where
it is prepared ahead of its runs (webapp.services.preparations, run by a worker as ``python -m trainer.data
prepare``): its progress while it runs, then its size or why it was refused, with the rows it could not read."""
from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from ..models import Cluster, Dataset, DatasetPreparation
from ..selectors.jobs import dataset_preparations
from ..selectors.owned import visible_with_owners
from ..services.preparations import MAX_VOCAB, dataset_prepare

LISTED = 200
DEFAULT_VOCAB = 8192
UNDER_WAY = (DatasetPreparation.Status.PENDING, DatasetPreparation.Status.RUNNING)


class DatasetForm(forms.ModelForm):
    class Meta:
        model = Dataset
        fields = ["name", "path", "text_field", "tokenizer", "max_bad_fraction", "val_fraction"]
        help_texts = {
            "path": "a text, JSONL (.gz, .zst), Parquet or Megatron .bin file, or a folder of them, under your data "
                    "roots",
            "text_field": "the JSONL key or Parquet column that holds the text",
            "tokenizer": "an existing tokenizer to keep: a tokenizer.json, or a folder with one or with GPT-2's "
                         "vocab.json and merges.txt (empty: train one on the data)",
            "max_bad_fraction": "share of unreadable rows skipped before the source is refused",
        }


class PrepareForm(forms.Form):
    vocab = forms.IntegerField(min_value=1, max_value=MAX_VOCAB, initial=DEFAULT_VOCAB, label="Model vocabulary",
                               help_text="the vocab_size of the model that will train on it: its runs reuse what "
                                         "this prepares")
    cluster = forms.ModelChoiceField(queryset=Cluster.objects.exclude(kind=Cluster.Kind.LOCAL).order_by("name"),
                                     required=False, label="Run on", empty_label="a worker of this web app",
                                     help_text="a Slurm cluster runs it as a batch job of its own",
                                     widget=forms.Select(attrs={"aria-describedby": "cluster-hint"}))


def _visible(user):
    return visible_with_owners(Dataset.objects.all(), user)


@login_required
def page(request):
    form = DatasetForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        dataset = form.save(commit=False)
        dataset.owner = request.user
        try:
            dataset.full_clean()
        except ValidationError as exc:
            for field, problems in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, problems)
        else:
            dataset.save()
            messages.success(request, f"Dataset {dataset.name} is registered: prepare it to see its rows and size.")
            return redirect("pages:dataset", pk=dataset.pk)
    datasets = list(_visible(request.user).order_by("name")[:LISTED])
    return render(request, "pages/datasets.html", {"form": form, "datasets": datasets})


def _dataset_context(request, dataset: Dataset) -> dict:
    preparations = list(dataset_preparations(dataset)[:10])
    return {"dataset": dataset, "preparations": preparations,
            "polling": any(p.status in UNDER_WAY for p in preparations),
            "may_prepare": dataset.owner_id == request.user.pk or request.user.is_staff}


@login_required
def dataset_page(request, pk: int):
    dataset = get_object_or_404(_visible(request.user), pk=pk)
    initial = {"vocab": dataset.tokenizer_vocab or DEFAULT_VOCAB}
    form = PrepareForm(initial=initial)
    return render(request, "pages/dataset.html", {**_dataset_context(request, dataset), "prepare_form": form,
                                                  "slurm_clusters": form.fields["cluster"].queryset.exists()})


@login_required
@require_GET
def preparations(request, pk: int):
    """The preparations' part of the dataset's page, polled while one is under way."""
    dataset = get_object_or_404(_visible(request.user), pk=pk)
    return render(request, "pages/dataset_preparations.html", _dataset_context(request, dataset))


@login_required
@require_POST
def prepare(request, pk: int):
    dataset = get_object_or_404(_visible(request.user), pk=pk)
    form = PrepareForm(request.POST)
    if not (dataset.owner_id == request.user.pk or request.user.is_staff):
        messages.error(request, f"Only {dataset.owner} (or staff) may prepare dataset {dataset.name}.")
    elif not form.is_valid():
        messages.error(request, " ".join(m for ms in form.errors.values() for m in ms))
    else:
        try:
            preparation = dataset_prepare(request.user, dataset, form.cleaned_data["vocab"],
                                          form.cleaned_data["cluster"])
        except ValidationError as exc:
            messages.error(request, " ".join(exc.messages))
        else:
            messages.success(request, f"Preparation {preparation.pk} of {dataset.name} is queued.")
    return redirect("pages:dataset", pk=dataset.pk)


urlpatterns = [
    path("datasets/", page, name="datasets"),
    path("datasets/<int:pk>/", dataset_page, name="dataset"),
    path("datasets/<int:pk>/preparations/", preparations, name="dataset-preparations"),
    path("datasets/<int:pk>/prepare/", prepare, name="dataset-prepare"),
]
