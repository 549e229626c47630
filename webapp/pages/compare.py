"""Runs compared: pick runs you may see, overlay a series of theirs (webapp/static/workbench/compare.js reads
/api/runs/compare/, which bins every run over one range so the curves share their bin edges), and the fields of
their plans and models that differ."""
from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.urls import path

from ..api.live_serializers import MAX_COMPARED
from ..models.series import SERIES_BY_NAME
from ..selectors.compare import spec_differences
from ..selectors.runs import runs_with_parts

CHOICES_SHOWN = 100  # the newest visible runs offered as checkboxes (runs in the URL are offered too)
SERIES_LABELS = {"loss": "loss", "val_loss": "validation loss", "lr": "learning rate", "grad_norm": "gradient norm",
                 "tokens_per_s": "tokens/s", "step_time_s": "step time (s)", "mfu": "MFU",
                 "memory": "peak memory, rank 0"}
Y_UNITS = {"mfu": "fraction", "memory": "bytes", "tokens_per_s": "tokens/s"}
X_CHOICES = [("step", "step"), ("tokens", "tokens seen"), ("time", "wall time")]


def _ids(request) -> tuple[list[int], list[str]]:
    """The run ids asked for, in order, once each: ``?ids=1,2`` and ``?ids=1&ids=2`` alike; and what was not one."""
    ids, bad = [], []
    for value in request.GET.getlist("ids"):
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if part.isdigit() and 0 < int(part) < 2**63:
                if int(part) not in ids:
                    ids.append(int(part))
            else:
                bad.append(part)
    return ids, bad


def _shown(value) -> str:
    if value is None:
        return "(not set)"
    return value if isinstance(value, str) else json.dumps(value)


@login_required
def compare_page(request):
    ids, bad = _ids(request)
    visible = runs_with_parts(request.user)
    found = {run.pk: run for run in visible.filter(pk__in=ids)}
    missing = [str(pk) for pk in ids if pk not in found]
    if bad:
        messages.error(request, f"Not a run id: {', '.join(bad[:10])}.")
    if missing:
        messages.error(request, f"No run {', '.join(missing)} that you can see.")
    runs = [found[pk] for pk in ids if pk in found]
    if len(runs) > MAX_COMPARED:
        messages.warning(request, f"At most {MAX_COMPARED} runs are compared at once: the first {MAX_COMPARED} are.")
        runs = runs[:MAX_COMPARED]
    chosen = {run.pk for run in runs}
    choices = list(visible.order_by("-created_at", "-pk")[:CHOICES_SHOWN])
    choices += [run for run in runs if run not in choices]
    series = request.GET.get("series", "loss")
    series = series if series in SERIES_BY_NAME else "loss"
    x = request.GET.get("x", "step")
    x = x if x in dict(X_CHOICES) else "step"
    differences = [{"field": d["field"], "values": [_shown(v) for v in d["values"]]}
                   for d in spec_differences(runs)] if len(runs) > 1 else []
    return render(request, "pages/compare.html", {
        "runs": runs, "choices": choices, "chosen": chosen, "ids": ",".join(str(run.pk) for run in runs),
        "differences": differences, "series": series, "series_choices": list(SERIES_LABELS.items()),
        "y_unit": Y_UNITS.get(series, ""), "x": x, "x_choices": X_CHOICES, "max_compared": MAX_COMPARED})


urlpatterns = [path("compare/", compare_page, name="compare")]
