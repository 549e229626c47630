"""Runs as the API, the pages and the workers ask for them, each with the rows it is shown or handled with; and the
dashboard's run list: each run's progress, time to go and a loss sparkline, for one page of runs in three queries
(the runs, their short runs' steps, their long runs' coarse rollups)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from ..models import Attempt, Cluster, Run, RunStatus, Series, SeriesBucket, SeriesStep

SPARK_POINTS = 48       # points a sparkline draws at most
SPARK_WIDTH, SPARK_HEIGHT = 120, 28
FIRST_LEVEL, LAST_LEVEL = 2, 8  # the rollup levels SeriesBucket keeps (blocks of 4**level steps)


@dataclass
class RunRow:
    run: Run
    progress: float      # 0..1: steps done of steps asked
    eta: timedelta | None
    spark: str           # the sparkline's SVG points, "" without loss values

    @property
    def percent(self) -> int:
        return round(100 * self.progress)


def _eta(run: Run, now) -> timedelta | None:
    """Time to go at the pace so far: the time since the run started, per step done, times the steps left."""
    if run.status != RunStatus.RUNNING or not run.started_at or not run.last_step:
        return None
    per_step = (now - run.started_at) / run.last_step
    return per_step * max(run.steps - run.last_step, 0)


def _level(steps: int) -> int | None:
    """The coarsest rollup level with at most SPARK_POINTS blocks over ``steps`` steps; None: read the steps."""
    if steps <= SPARK_POINTS:
        return None
    for level in range(FIRST_LEVEL, LAST_LEVEL + 1):
        if steps / 4 ** level <= SPARK_POINTS:
            return level
    return LAST_LEVEL


def _polyline(values: list[float]) -> str:
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = SPARK_WIDTH / max(len(values) - 1, 1)
    return " ".join(f"{i * step:.1f},{SPARK_HEIGHT - 2 - (v - low) / span * (SPARK_HEIGHT - 4):.1f}"
                    for i, v in enumerate(values))


def loss_sparklines(runs: list[Run]) -> dict[int, str]:
    """Each run's loss as sparkline points: a short run's every step, a long run's rollup blocks at one level
    (each block's midpoint of its lowest and highest loss, so one spike does not hide the trend)."""
    levels = {run.pk: _level(run.last_step) for run in runs if run.last_step}
    values: dict[int, list[float]] = {pk: [] for pk in levels}
    short = [pk for pk, level in levels.items() if level is None]
    if short:
        for run_id, loss in (SeriesStep.objects.filter(run_id__in=short, loss__isnull=False)
                             .order_by("run_id", "step").values_list("run_id", "loss")):
            values[run_id].append(loss)
    long = Q()
    for pk, level in levels.items():
        if level is not None:
            long |= Q(run_id=pk, level=level)
    if long:
        for run_id, low, high in (SeriesBucket.objects.filter(long, series=Series.LOSS)
                                  .order_by("run_id", "bucket").values_list("run_id", "min_value", "max_value")):
            values[run_id].append((low + high) / 2)
    return {pk: _polyline(points) for pk, points in values.items()}


def dashboard_rows(runs: list[Run]) -> list[RunRow]:
    now = timezone.now()
    sparks = loss_sparklines(runs)
    return [RunRow(run=run, progress=min(run.last_step / run.steps, 1.0) if run.steps else 0.0, eta=_eta(run, now),
                   spark=sparks.get(run.pk, "")) for run in runs]


# -- runs found -----------------------------------------------------------------------------------------------------

def runs_listed(user) -> QuerySet:
    """The runs ``user`` may see as the API lists them, each with its owner and its latest attempt's batch script
    (``latest_script``) in the same query, not one query a run of a listed page. The stored estimate (tens of
    kilobytes) is left out: the estimate action alone reads it, and loads it then."""
    latest_script = Attempt.objects.filter(run=OuterRef("pk")).order_by("-number").values("script")[:1]
    return (Run.objects.visible_to(user).select_related("owner", "init_from__run").defer("estimate")
            .annotate(latest_script=Subquery(latest_script)))


def runs_with_parts(user) -> QuerySet:
    """The runs ``user`` may see, each with its owner, model config, plan, cluster and dataset: what a run's page,
    runs compared and the dashboard show beside a run."""
    return Run.objects.visible_to(user).select_related("owner", "model_config", "plan", "cluster", "dataset",
                                                       "init_from__run")


def dashboard_runs(user, *, status: str = "", owner: str = "", search: str = "", order: str = "-created_at"):
    """The runs of the dashboard: ``status`` one of RunStatus or any, ``owner`` "me", a user name or anyone,
    ``search`` in the names of the run, its model config and its plan; ordered by ``order``, then newest id."""
    runs = runs_with_parts(user).defer("estimate")  # tens of kilobytes of JSON a run that the list never shows
    if status in RunStatus.values:
        runs = runs.filter(status=status)
    if owner == "me":
        runs = runs.filter(owner=user)
    elif owner:
        runs = runs.filter(owner__username=owner)
    if search:
        runs = runs.filter(Q(name__icontains=search) | Q(model_config__name__icontains=search)
                           | Q(plan__name__icontains=search))
    return runs.order_by(order, "-pk")


def records_of_visible_runs(queryset: QuerySet, user) -> QuerySet:
    """The rows of ``queryset`` (metrics, profiles: a model with a ``run``) of the runs ``user`` may see."""
    return queryset.filter(run__in=Run.objects.visible_to(user))


# -- runs the workers handle ----------------------------------------------------------------------------------------

def run_with_cluster(run_id: int) -> Run:
    return Run.objects.select_related("cluster").get(pk=run_id)


def active_runs() -> QuerySet:
    """Runs whose job may still be going: submitted or running, or finished with a job not yet seen to end (its
    last metrics still come in, and a failed one is retried once its job is gone); each with its cluster."""
    watched = Q(status__in=[RunStatus.SUBMITTED, RunStatus.RUNNING]) | (
        Q(status__in=[RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.COMPLETED], ingest_state__job_ended=False)
        & ~Q(job_id=""))
    return Run.objects.filter(watched).select_related("cluster")


def runs_holding_local_slots(other_than: Run) -> QuerySet:
    """The runs on local clusters, but ``other_than``, that hold CPU slots of this machine: launching, or with a
    job not yet seen to end; their specs alone (what their world size is read from)."""
    local = Run.objects.filter(cluster__kind=Cluster.Kind.LOCAL).exclude(pk=other_than.pk)
    busy = local.filter(launching_since__isnull=False) | local.exclude(job_id="").filter(ingest_state__job_ended=False)
    return busy.only("spec")
