"""A run's page: its header and actions, live charts (webapp/static/workbench/run.js reads the REST API's series and
long-polls its updates), log tail, history, checkpoints, profile digest, and the planner's estimate beside what the
run measured (webapp.services.run_estimates). The parts that change while a run trains are partials that the page
reloads with htmx."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import FileResponse, Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from trainer.contract import MAIN_SOURCE

from ..models import Evaluation, EvaluationSet, Run, RunStatus, SeriesStep
from ..models.evaluations import EVAL_SERIES_PREFIX, HEADLINE
from ..models.series import SOURCE_SERIES_PREFIX
from ..selectors.goodput import goodput_of
from ..selectors.jobs import checkpoints_with_scores, run_evaluation_sets, run_is_evaluating
from ..selectors.run_logs import log_files
from ..selectors.runs import runs_with_parts
from ..selectors.timeline import timeline_missing
from ..services import run_cancel, run_queue
from ..services.evaluations import evaluation_create
from ..services.run_estimates import run_estimate_report
from .wizard_figures import duration

EVENTS_SHOWN = 50
RANK_OPTIONS = 256  # ranks offered in the log selector before any log file exists
CHARTS = [  # (id, title, series, y unit)
    ("loss", "Loss", ["loss", "val_loss"], ""),
    ("lr", "Learning rate", ["lr"], ""),
    ("tokens_per_s", "Throughput (tokens/s)", ["tokens_per_s"], "tokens/s"),
    ("mfu", "MFU", ["mfu"], "fraction"),
    ("memory", "Peak memory, rank 0", ["memory"], "bytes"),
]
# What the memory chart says for good on a cluster of CPUs, where the trainer records no peak memory
# (trainer.profiling.memory.max_allocated_bytes): instead of waiting for data that will never come.
NO_CPU_MEMORY = "This run's cluster is of CPUs, and a CPU does not report peak memory: nothing will be drawn here."
TRACE_NAME = re.compile(r"rank-(\d{1,7})\.trace\.json(\.gz)?")
SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")  # a profile's name comes from the run folder: keep it out of headers


def _visible_run(request, pk: int) -> Run:
    return get_object_or_404(runs_with_parts(request.user), pk=pk)


# -- formatting ---------------------------------------------------------------------------------------------------

def _bytes(n) -> str:
    if n is None:
        return "–"
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"


def _number(value) -> float | None:
    """A finite float from JSON a run folder wrote, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _short(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _percent(value) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


# -- header -------------------------------------------------------------------------------------------------------

def _world(run: Run) -> int:
    plan = (run.spec or {}).get("plan", run.plan.spec) or {}
    world = 1
    for degree in ("dp", "tp", "pp"):
        value = plan.get(degree, 1)
        world *= value if isinstance(value, int) and value > 0 else 1
    return world


def _queue_refused(run: Run, restarts_left: bool) -> str:
    """Why the run's queue button is off, as run_queue would refuse it; "" when it is on."""
    if run.status == RunStatus.FAILED and not restarts_left:
        return f"all {run.max_restarts} restarts are used: raise max_restarts to try again"
    if run.status == RunStatus.CANCELLED and run.job_id and not run.ingest_state.get("job_ended"):
        return "its job is still stopping: resume it once it has ended"
    return ""


def _header(request, run: Run) -> dict:
    latest = (SeriesStep.objects.filter(run=run, step=run.last_step)
              .values("step", "tokens_seen", "loss", "lr", "tokens_per_s", "mfu", "memory").first())
    restarts_left = run.restarts < run.max_restarts
    can_edit = run.is_editable_by(request.user)
    if run.status == RunStatus.DRAFT:
        queue_label = "Launch"
    elif run.status == RunStatus.FAILED:
        queue_label = "Retry from the newest checkpoint"
    elif run.status == RunStatus.CANCELLED:
        queue_label = "Resume from the newest checkpoint"
    else:
        queue_label = ""
    return {
        "run": run, "can_edit": can_edit, "percent": min(100, round(100 * run.last_step / run.steps)) if run.steps else 0,
        "can_cancel": can_edit and not run.is_finished,
        "queue_label": queue_label if can_edit else "",
        "queue_refused": _queue_refused(run, restarts_left),
        "latest": latest and {"loss": _short(latest["loss"], ".4f"), "lr": _short(latest["lr"], ".3g"),
                              "tokens_per_s": _short(latest["tokens_per_s"], ",.0f"),
                              "mfu": _percent(latest["mfu"]), "memory": _bytes(latest["memory"]),
                              "tokens_seen": _short(latest["tokens_seen"], ",")},
    }


# -- history ------------------------------------------------------------------------------------------------------

def _scores_line(evaluation) -> str:
    """One evaluation in the checkpoints table: its set, what was scored unless the checkpoint itself, and each
    figure (a checkpoint's choice set has acc_generated, which its deployments are compared by)."""
    served = evaluation.deployment
    target = f" via {served.model_name} ({served.get_reduction_display()})" if served else ""
    if evaluation.status == Evaluation.Status.FAILED:
        return f"{evaluation.eval_set.name}{target}: failed, {evaluation.message[:200]}"
    if evaluation.status != Evaluation.Status.DONE:
        return f"{evaluation.eval_set.name}{target}: {evaluation.status}"
    metrics = (evaluation.scores or {}).get("metrics") or {}
    figures = ", ".join(f"{name} {value:.3f}" for name, value in metrics.items()
                        if not name.endswith("_stderr") and isinstance(value, (int, float)))
    return f"{evaluation.eval_set.name}{target}: {figures or 'no figures'}"


def _goodput(run: Run) -> dict:
    found = goodput_of(run)
    parts = [{**part, "duration": duration(part["seconds"]), "percent": _percent(part["share"]),
              "width": round(100 * max(part["share"] or 0, 0), 2)} for part in found.to_dict()["parts"]]
    return {"allocated_s": found.allocated_s, "allocated": duration(found.allocated_s), "gpus": found.gpus,
            "gpu_hours": f"{found.allocated_s * found.gpus / 3600:.3g}", "queue": duration(found.queue_s),
            "percent": _percent(found.share), "parts": parts}


def _history(request, run: Run) -> dict:
    # newest first by when each happened: the trainer's events are read in from the run folder a reconcile pass
    # after they happened, so their ids say when they were read, behind the workbench's own events of the meantime
    events = list(run.history.order_by("-time", "-id")[:EVENTS_SHOWN + 1])
    checkpoints = [{"checkpoint": c, "size": _bytes(c.size_bytes), "tokens": f"{c.tokens_seen:,}",
                    "scores": [_scores_line(e) for e in c.evaluations_shown]}
                   for c in checkpoints_with_scores(run)]
    return {"run": run, "events": events[:EVENTS_SHOWN], "more_events": len(events) > EVENTS_SHOWN,
            "attempts": list(run.attempt_records.order_by("-number")), "checkpoints": checkpoints,
            "eval_sets": list(EvaluationSet.objects.visible_to(request.user).order_by("name", "id")),
            "evaluating": run_is_evaluating(run), "goodput": _goodput(run)}


# -- profile digest -----------------------------------------------------------------------------------------------

def _rank_rows(summary: dict) -> list[dict]:
    rows = []
    for item in summary.get("ranks") or []:
        if not isinstance(item, dict) or not isinstance(item.get("rank"), int):
            continue
        shares = item.get("shares") if isinstance(item.get("shares"), dict) else {}
        parts = {key: _number(shares.get(key)) for key in ("compute", "comm_exposed", "idle", "comm_overlapped")}
        trace = item.get("trace")
        rows.append({
            "rank": item["rank"], "wall_ms": _number(item.get("wall_ms")), "steps": item.get("steps"),
            "bubble": _percent(_number(item.get("bubble"))),
            "shares": {key: _percent(value) for key, value in parts.items()},
            # compute + exposed communication + idle make the whole profiled wall time (trainer.profiling.digest)
            "bar": [(key, 100 * (parts[key] or 0.0)) for key in ("compute", "comm_exposed", "idle")],
            "trace": isinstance(trace, str) and TRACE_NAME.fullmatch(trace) is not None,
        })
    return sorted(rows, key=lambda row: row["rank"])


def _profiles(run: Run) -> list[dict]:
    out = []
    for profile in run.profiles.order_by("-created_at", "-id"):
        summary = profile.summary if isinstance(profile.summary, dict) else {}
        shares = summary.get("shares") if isinstance(summary.get("shares"), dict) else {}
        top = [op for op in summary.get("top_ops") or [] if isinstance(op, dict) and isinstance(op.get("name"), str)]
        out.append({"profile": profile, "world": summary.get("world"), "steps": summary.get("steps"),
                    "wall_ms": _number(summary.get("wall_ms")), "bubble": _percent(_number(summary.get("bubble"))),
                    "bubble_max": _percent(_number(summary.get("bubble_max"))),
                    "shares": {key: _percent(_number(shares.get(key)))
                               for key in ("compute", "comm_exposed", "idle", "comm_overlapped")},
                    "ranks": _rank_rows(summary), "top_ops": top,
                    # the picture is the API's; the page only says why it is missing, if it is
                    "timeline_missing": timeline_missing(run, profile),
                    "timeline_url": reverse("run-profile-timeline", kwargs={"pk": run.pk, "name": profile.name})})
    return out


# -- estimate beside measured -------------------------------------------------------------------------------------

SHOWN = {"bytes": _bytes, "s": lambda v: f"{v * 1000:.1f} ms", "tokens/s": lambda v: f"{v:,.0f} tokens/s",
         "fraction": _percent}


def _shown(row: dict) -> dict:
    show = SHOWN[row["unit"]]
    return {"name": row["figure"],
            "estimated": "not estimated" if row["estimated"] is None else show(row["estimated"]),
            "measured": None if row["measured"] is None else show(row["measured"]), "source": row["measured_from"],
            "missing": row["missing"], "error": None if row["error"] is None else f"{100 * row['error']:+.1f}%"}


def _measure(request, run: Run) -> dict:
    report = run_estimate_report(run)
    estimate = report["estimate"]
    return {"run": run, "estimate_missing": estimate.get("error", ""), "rows": [_shown(r) for r in report["figures"]],
            "warnings": estimate.get("warnings", []), "profiles": _profiles(run)}


# -- views --------------------------------------------------------------------------------------------------------

PARTS = {"header": ("pages/run_header.html", _header), "history": ("pages/run_history.html", _history),
         "measure": ("pages/run_measure.html", _measure)}


def _on_cpus(run: Run) -> bool:
    gpu = ((run.spec or {}).get("cluster") or {}).get("gpu")
    return isinstance(gpu, dict) and gpu.get("name") == "cpu"


def _charts(run: Run) -> list[tuple]:
    """CHARTS, each with what it says while it has nothing to draw ("": that nothing is drawn yet) and its series'
    labels where they are not the series' names; beside the loss, each evaluation set's score on the run's
    checkpoints, and a blended run's validation loss on each of its sources."""
    charts = [(*chart, NO_CPU_MEMORY if chart[0] == "memory" and _on_cpus(run) else "", "") for chart in CHARTS]
    sources = [source.get("name") for source in (run.spec or {}).get("blend", []) if isinstance(source, dict)]
    if sources:
        names = [f"{SOURCE_SERIES_PREFIX}{name}" for name in [MAIN_SOURCE, *sources]]
        empty = "" if run.eval_every else "This run does not evaluate (eval_every is 0): nothing will be drawn here."
        charts.insert(1, ("val_by_source", "Validation loss by source", names, "", empty, ""))
    sets = list(run_evaluation_sets(run))
    if sets:
        labels = {f"{EVAL_SERIES_PREFIX}{s.pk}": f"{s.name} ({HEADLINE[s.kind][0]})" for s in sets}
        charts.insert(1, ("scores", "Evaluation scores by checkpoint", list(labels), "", "", json.dumps(labels)))
    return charts


def _log_choices(run: Run) -> list[str]:
    names = [f["name"] for f in log_files(run)]
    ranks = [f"rank-{r}.log" for r in range(min(_world(run), RANK_OPTIONS))]
    return names + [name for name in ranks if name not in names]


@login_required
def run_page(request, pk: int):
    run = _visible_run(request, pk)
    last_event = run.history.order_by("-id").values_list("id", flat=True).first() or 0
    context = {**_header(request, run), **_history(request, run), **_measure(request, run),
               "charts": _charts(run), "last_event": last_event, "logs": _log_choices(run)}
    return render(request, "pages/run.html", context)


@login_required
def run_part(request, pk: int, part: str):
    if part not in PARTS:
        raise Http404("no such part of a run's page")
    run = _visible_run(request, pk)
    template, context = PARTS[part]
    return render(request, template, context(request, run))


def _editable_run(request, pk: int) -> Run:
    run = _visible_run(request, pk)
    if not run.is_editable_by(request.user):
        raise PermissionDenied("only the run's owner or staff may change it")
    return run


def _refused(request, exc: ValidationError) -> None:
    for message in exc.messages:
        messages.error(request, message)


@login_required
@require_POST
def run_cancel_view(request, pk: int):
    run = _editable_run(request, pk)
    try:
        run_cancel(run)
    except ValidationError as exc:
        _refused(request, exc)
    else:
        messages.success(request, f"Run {run.name} is cancelled.")
    return redirect("pages:run", pk=pk)


@login_required
@require_POST
def run_queue_view(request, pk: int):
    run = _editable_run(request, pk)
    was = run.status
    try:
        run_queue(run)
    except ValidationError as exc:
        _refused(request, exc)
    else:
        messages.success(request, f"Run {run.name} is queued" +
                         (" to resume from its newest checkpoint." if was == RunStatus.FAILED else " for launch."))
    return redirect("pages:run", pk=pk)


@login_required
@require_POST
def run_evaluate_view(request, pk: int):
    """Score one of the run's checkpoints on an evaluation set (any user who may see the run may)."""
    run = _visible_run(request, pk)
    eval_set = EvaluationSet.objects.visible_to(request.user).filter(pk=_posted_id(request, "eval_set")).first()
    checkpoint = run.checkpoints.filter(pk=_posted_id(request, "checkpoint")).first()
    if eval_set is None or checkpoint is None:
        messages.error(request, "Choose an evaluation set and one of this run's checkpoints to evaluate.")
        return redirect("pages:run", pk=pk)
    try:
        evaluation_create(request.user, eval_set, checkpoint=checkpoint)
    except ValidationError as exc:
        _refused(request, exc)
    else:
        messages.success(request, f"Step {checkpoint.step} is queued for evaluation on {eval_set.name}; its scores "
                                  f"appear in the checkpoints table and beside the loss.")
    return redirect("pages:run", pk=pk)


def _posted_id(request, name: str) -> int:
    value = request.POST.get(name, "")
    return int(value) if value.isdigit() and len(value) < 19 else 0


@login_required
def profile_trace(request, pk: int, profile: int, rank: int):
    """One rank's trace of a profile, as a download for Perfetto (ui.perfetto.dev opens it as it is, gzipped).
    The profile's folder and the file must both resolve inside the run's folder: a path recorded from the run
    folder's events, or a link placed in it, reaches nothing else."""
    run = _visible_run(request, pk)
    found = get_object_or_404(run.profiles, pk=profile)
    if not run.run_dir or not found.path:
        raise Http404("this profile has no folder")
    root = Path(run.run_dir).resolve()
    folder = Path(found.path).resolve()
    if not folder.is_relative_to(root):
        raise Http404("this profile's folder is not inside the run's folder")
    for name in (f"rank-{rank}.trace.json.gz", f"rank-{rank}.trace.json"):
        candidate = folder / name
        if not candidate.is_file():
            continue
        if not candidate.resolve().is_relative_to(root):
            raise Http404("this trace is not inside the run's folder")
        return FileResponse(open(candidate.resolve(), "rb"), as_attachment=True,
                            filename=f"run-{run.pk}-{SAFE_NAME.sub('_', found.name)}-{name}",
                            content_type="application/gzip" if name.endswith(".gz") else "application/json")
    raise Http404(f"profile {found.name} has no trace of rank {rank}")


urlpatterns = [
    path("runs/<int:pk>/", run_page, name="run"),
    path("runs/<int:pk>/part/<str:part>/", run_part, name="run-part"),
    path("runs/<int:pk>/cancel/", run_cancel_view, name="run-cancel"),
    path("runs/<int:pk>/queue/", run_queue_view, name="run-queue"),
    path("runs/<int:pk>/evaluate/", run_evaluate_view, name="run-evaluate"),
    path("runs/<int:pk>/profiles/<int:profile>/trace/<int:rank>/", profile_trace, name="run-trace"),
]
