"""A run's page: its header and actions, live charts (webapp/static/workbench/run.js reads the REST API's series and
long-polls its updates), log tail, history, checkpoints, profile digest, and the planner's estimate beside what the
run measured. The parts that change while a run trains are partials that the page reloads with htmx."""
from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Max
from django.http import FileResponse, Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.views.decorators.http import require_POST

from trainer.contract import SpecError
from trainer.planner.estimate.api import estimate_json

from ..models import Run, RunStatus, SeriesBucket, SeriesStep
from ..models.series import Series
from ..services import run_cancel, run_queue
from ..services.rank_figures import rank_summary
from ..services.run_logs import log_files

# Steps whose median is "the" measured step time, throughput and MFU: the latest ones, so that warm-up, compilation
# and a resumed attempt's first steps weigh nothing once the run is under way.
RECENT_STEPS = 200
EVENTS_SHOWN = 50
RANK_OPTIONS = 256  # ranks offered in the log selector before any log file exists
CHARTS = [  # (id, title, series, y unit)
    ("loss", "Loss", ["loss", "val_loss"], ""),
    ("lr", "Learning rate", ["lr"], ""),
    ("tokens_per_s", "Throughput (tokens/s)", ["tokens_per_s"], "tokens/s"),
    ("mfu", "MFU", ["mfu"], "fraction"),
    ("memory", "Peak memory, rank 0", ["memory"], "bytes"),
]
TRACE_NAME = re.compile(r"rank-(\d{1,7})\.trace\.json(\.gz)?")
SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")  # a profile's name comes from the run folder: keep it out of headers


def _visible_run(request, pk: int) -> Run:
    return get_object_or_404(Run.objects.visible_to(request.user)
                             .select_related("owner", "model_config", "plan", "cluster", "dataset"), pk=pk)


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

def _history(request, run: Run) -> dict:
    events = list(run.history.order_by("-id")[:EVENTS_SHOWN + 1])
    checkpoints = [{"checkpoint": c, "size": _bytes(c.size_bytes), "tokens": f"{c.tokens_seen:,}"}
                   for c in run.checkpoints.order_by("-step")]
    return {"run": run, "events": events[:EVENTS_SHOWN], "more_events": len(events) > EVENTS_SHOWN,
            "attempts": list(run.attempt_records.order_by("-number")), "checkpoints": checkpoints}


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
                    "ranks": _rank_rows(summary), "top_ops": top})
    return out


# -- estimate beside measured -------------------------------------------------------------------------------------

def _figure(estimate: dict, *keys) -> float | None:
    value = estimate
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return _number(value.get("value") if isinstance(value, dict) else value)


def _estimate(run: Run) -> tuple[dict | None, str]:
    """The planner's estimate for the run's spec at default options, or None and why there is none."""
    spec = run.spec or {}
    if not all(key in spec for key in ("model", "plan", "cluster")):
        return None, "the run has no stored spec to estimate"
    try:
        return estimate_json({"model": spec["model"], "plan": spec["plan"], "cluster": spec["cluster"]}), ""
    except (SpecError, ValueError, ArithmeticError) as exc:
        return None, f"the planner cannot estimate this spec: {exc}"


def _recent_median(run: Run, column: str) -> tuple[float | None, int]:
    values = [v for v in SeriesStep.objects.filter(run=run, **{f"{column}__isnull": False}).order_by("-step")
              .values_list(column, flat=True)[:RECENT_STEPS] if math.isfinite(v)]
    return (statistics.median(values) if values else None), len(values)


def _peak_memory(run: Run) -> float | None:
    """Rank 0's highest max_allocated_bytes over the run: the coarsest rollups cover every step, so this reads a
    row per 65,536 steps rather than the steps themselves."""
    coarsest = (SeriesBucket.objects.filter(run=run, series=Series.MEMORY).values("level")
                .order_by("-level").first())
    if coarsest is not None:
        return SeriesBucket.objects.filter(run=run, series=Series.MEMORY, level=coarsest["level"]) \
            .aggregate(peak=Max("max_value"))["peak"]
    return SeriesStep.objects.filter(run=run).aggregate(peak=Max("memory"))["peak"]


def _row(name: str, estimated: float | None, measured: float | None, show, source: str, missing: str) -> dict:
    error = None
    if estimated is not None and measured is not None and estimated != 0:
        error = (measured - estimated) / abs(estimated)
    return {"name": name, "estimated": show(estimated) if estimated is not None else "not estimated",
            "measured": show(measured) if measured is not None else None, "source": source,
            "missing": missing if measured is None else "",
            "error": None if error is None else f"{100 * error:+.1f}%",
            "error_size": None if error is None else abs(error)}


def _measure(request, run: Run) -> dict:
    estimate, why_not = _estimate(run)
    est = estimate or {}
    stages = (est.get("memory") or {}).get("stages") or []
    rank0 = next((s for s in stages if isinstance(s, dict) and s.get("rank") == 0), None)
    step_est, compute_est = _figure(est, "time", "step"), _figure(est, "time", "step", "terms", "compute")
    steps_median, steps_counted = _recent_median(run, "step_time_s")
    tokens_median, _ = _recent_median(run, "tokens_per_s")
    mfu_median, _ = _recent_median(run, "mfu")
    recent = f"median of the latest {steps_counted} steps" if steps_counted else ""
    no_steps = "no training step recorded yet"
    ranks = rank_summary(run) if run.last_step else {"figures": {}}
    # a record without each rank's figures (a world of one) says nothing of the other ranks
    fullest = ranks["figures"].get("max_allocated_bytes") if (ranks.get("world_size") or 0) > 1 else None
    profile = run.profiles.order_by("-created_at", "-id").first()
    bubble = _number(profile.summary.get("bubble")) if profile and isinstance(profile.summary, dict) else None
    rows = [
        _row("Peak memory, rank 0", _figure(rank0 or {}, "total"), _peak_memory(run), _bytes,
             "highest max_allocated_bytes of rank 0 over the run",
             no_steps if not run.last_step else "the device reports no memory (a CPU does not)"),
        _row("Peak memory, fullest rank", _figure(est, "memory", "peak"), fullest and fullest["max"], _bytes,
             f"rank {fullest['worst_rank']}, median over the latest steps" if fullest else "",
             no_steps if not run.last_step else "no per-rank memory recorded"),
        _row("Step time", step_est, steps_median, lambda v: f"{v * 1000:.1f} ms", recent, no_steps),
        _row("Throughput", _figure(est, "time", "tokens_per_s"), tokens_median, lambda v: f"{v:,.0f} tokens/s",
             recent, no_steps),
        _row("MFU", _figure(est, "time", "mfu"), mfu_median, _percent, recent, no_steps),
        # The profile's bubble is the share of a step a rank does not compute (exposed communication and idle);
        # the estimate's counterpart is everything in its step time but compute, not the pipeline bubble alone.
        _row("Bubble (share of a step not computing)",
             1 - compute_est / step_est if step_est and compute_est is not None else None, bubble, _percent,
             f"profile {profile.name}, mean over ranks" if profile else "",
             "no profile taken (give the run a profile to measure it)"),
    ]
    return {"run": run, "estimate_missing": why_not, "rows": rows,
            "warnings": [w for w in est.get("warnings") or [] if isinstance(w, str)],
            "profiles": _profiles(run)}


# -- views --------------------------------------------------------------------------------------------------------

PARTS = {"header": ("pages/run_header.html", _header), "history": ("pages/run_history.html", _history),
         "measure": ("pages/run_measure.html", _measure)}


def _log_choices(run: Run) -> list[str]:
    names = [f["name"] for f in log_files(run)]
    ranks = [f"rank-{r}.log" for r in range(min(_world(run), RANK_OPTIONS))]
    return names + [name for name in ranks if name not in names]


@login_required
def run_page(request, pk: int):
    run = _visible_run(request, pk)
    last_event = run.history.order_by("-id").values_list("id", flat=True).first() or 0
    context = {**_header(request, run), **_history(request, run), **_measure(request, run),
               "charts": CHARTS, "last_event": last_event, "logs": _log_choices(run)}
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
    path("runs/<int:pk>/profiles/<int:profile>/trace/<int:rank>/", profile_trace, name="run-trace"),
]
