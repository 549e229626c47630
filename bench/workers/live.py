"""Benchmark: live run data on PostgreSQL, each figure beside its target.

    python -m bench.workers.live                     # the local server's postgres database
    DATABASE_URL=postgres://me@db:5432/postgres python -m bench.workers.live

It creates a throwaway database next to the one DATABASE_URL names (its user needs CREATEDB), migrates it, and
drops it at the end, whatever happens. Figures:

(a) ingestion: a synthetic metrics.jsonl (the contract's own records, a resumed attempt redoing steps among them)
    read in by the real ingestion (webapp.services.ingest.run_ingest), in points a second: a point is one value
    of one series at one step;
(b) the chart query of a 1,000,000-step run, through the REST endpoint, downsampled to ~2,000 points a series:
    the median of 20 ranges from the whole run down to a zoom of 2,000 steps, beside the raw query of the same
    ranges (every step row of the range), and their ratio;
(c) one reconcile pass over 500 active runs (workers.runs.reconcile_pass, as the beat task runs it): their jobs
    polled at once (local jobs: the process table and each folder's exit record), every folder looked at, and the
    new lines of each read in; the median of passes where every run wrote one step since the last, and of passes
    where none wrote anything.

It sits with the workers' benchmarks because (c) is theirs; (a) and (b) measure the web app's ingestion and chart.
"""
from __future__ import annotations

import json
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

INGEST_TARGET_POINTS_S = 50_000
CHART_TARGET_S = 0.200
RECONCILE_TARGET_S, RECONCILE_RUNS, RECONCILE_PASSES = 1.0, 500, 7
INGEST_STEPS, INGEST_READ_STEPS, REDO_STEPS = 60_000, 5_000, 2_000
CHART_STEPS, CHART_POINTS, CHART_QUERIES = 1_000_000, 2_000, 20
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/postgres"
BENCH_REDIS_URL = "redis://127.0.0.1:6379/11"


@dataclass
class Figure:
    name: str
    value: float | None  # None: not measured
    unit: str
    target: float | None = None
    higher_is_better: bool = True
    note: str = ""

    def line(self) -> str:
        if self.value is None:
            return f"{self.name:52s} {'not measured':>14s}  {self.note}"
        shown = f"{self.value * 1000:,.1f} ms" if self.unit == "s" else f"{self.value:,.0f} {self.unit}"
        if self.target is None:
            return f"{self.name:52s} {shown:>14s}  {self.note}"
        target = f"{self.target * 1000:,.0f} ms" if self.unit == "s" else f"{self.target:,.0f} {self.unit}"
        ratio = self.value / self.target if self.higher_is_better else self.target / self.value
        verdict = "meets" if ratio >= 1 else "MISSES"
        return f"{self.name:52s} {shown:>14s}  target {target:>12s}  ratio {ratio:6.2f} ({verdict})  {self.note}"


# ------------------------------------------------------------------------------------------- a throwaway database

def _throwaway_database() -> tuple[str, str]:
    """A new empty database beside DATABASE_URL's: (its URL, the URL to drop it from)."""
    import psycopg

    base = os.environ.get("DATABASE_URL", DEFAULT_URL)
    parts = urlsplit(base)
    if not parts.scheme.startswith("postgres"):
        raise SystemExit(f"DATABASE_URL={base!r}: this benchmark measures PostgreSQL; give a postgres:// URL")
    name = f"wb_bench_live_{os.getpid()}"
    with psycopg.connect(_conninfo(base), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(parts._replace(path=f"/{name}")), base


def _conninfo(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(scheme="postgresql"))


def _drop(url: str, base: str) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(_conninfo(base), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _django(url: str, var: Path) -> None:
    # the reconcile passes send ingest tasks: to a Redis database of the benchmark's own, emptied at the end
    os.environ.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="webapp.settings", WORKBENCH_VAR=str(var),
                      REDIS_URL=os.environ.get("BENCH_REDIS_URL", BENCH_REDIS_URL))
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))  # signs nothing that outlives the run
    os.environ.setdefault("DJANGO_SECURE", "0")  # the requests are the test client's, in process, plain HTTP
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


# ------------------------------------------------------------------------------------------------------- the runs

def _run(folder: Path, name: str):
    from django.contrib.auth.models import User

    from trainer.contract import ParallelPlan, presets
    from webapp import models

    owner, _ = User.objects.get_or_create(username="bench", defaults={"is_staff": True})
    cluster, _ = models.Cluster.objects.get_or_create(
        name="bench", defaults={"spec": presets.cluster("A100-SXM-80GB", 1, 8).to_dict()})
    config, _ = models.ModelConfig.objects.get_or_create(owner=owner, name="gpt2-small",
                                                         defaults={"spec": presets.MODELS["gpt2-small"].to_dict()})
    plan, _ = models.ParallelismPlan.objects.get_or_create(
        owner=owner, name="dp8", model_config=config, cluster=cluster,
        defaults={"spec": ParallelPlan(dp=8, micro_batch=4, global_batch=64).to_dict()})
    dataset, _ = models.Dataset.objects.get_or_create(owner=owner, name="corpus", defaults={"path": str(folder)})
    run = models.Run.objects.create(owner=owner, name=name, model_config=config, plan=plan, cluster=cluster,
                                    dataset=dataset, run_dir=str(folder / name))
    (folder / name).mkdir(parents=True)
    return owner, run


def _step_line(step: int, rng: random.Random, attempt: int) -> str:
    from trainer.contract.records import StepMetrics

    step_time = 0.25 + rng.random() * 0.05
    return json.dumps(StepMetrics(
        step=step, loss=4.0 * (1 + step) ** -0.1 + rng.gauss(0, 0.05) + 0.01 * attempt, lr=3e-4, grad_norm=rng.random(),
        tokens_per_s=65536 / step_time, step_time_s=step_time, tokens_seen=65536 * step, flops_per_step=10**15,
        loss_scale=1.0, skipped=False, mfu=0.4 + rng.random() * 0.01,
        memory={"max_allocated_bytes": 40 * 2**30 + rng.randrange(2**20)},
        time=1.7e9 + 0.27 * step + 3600 * attempt).to_dict()) + "\n"


def _eval_line(step: int, rng: random.Random) -> str:
    from trainer.contract.records import EvalMetrics

    return json.dumps(EvalMetrics(step=step, val_loss=4.0 * (1 + step) ** -0.1 + rng.gauss(0, 0.02)).to_dict()) + "\n"


# ------------------------------------------------------------------------------------------------------ (a) ingest

def ingestion(folder: Path) -> Figure:
    """Points a second through run_ingest: reads of INGEST_READ_STEPS steps each, one of them a resumed attempt
    that redoes REDO_STEPS steps, as a worker's reads of a fast run's folder would come."""
    from trainer.contract.runfolder import METRICS
    from webapp.services.ingest import run_ingest
    from webapp.services.series import Batch

    _, run = _run(folder, "ingest")
    path, rng, spent, points = Path(run.run_dir) / METRICS, random.Random(1), 0.0, 0
    reads = [(at, at + INGEST_READ_STEPS, 0) for at in range(0, INGEST_STEPS, INGEST_READ_STEPS)]
    reads.insert(len(reads) // 2, (reads[len(reads) // 2][0] - REDO_STEPS, reads[len(reads) // 2][0], 1))
    for first, last, attempt in reads:
        lines = []
        for step in range(first + 1, last + 1):
            lines.append(_step_line(step, rng, attempt))
            if step % 100 == 0:
                lines.append(_eval_line(step, rng))
        with open(path, "a") as f:
            f.write("".join(lines))
        points += Batch(json.loads(line) for line in lines).points_count()
        started = time.perf_counter()
        run_ingest(run.pk)
        spent += time.perf_counter() - started
    return Figure(f"(a) ingestion into PostgreSQL, {len(reads)} reads", points / spent, "points/s",
                  INGEST_TARGET_POINTS_S, note=f"{points:,} points in {spent:.1f} s, through run_ingest")


# ------------------------------------------------------------------------------------------------------- (b) chart

def _chart_record(step: int, rng: random.Random) -> dict:
    """The figures _step_line writes, as the dict ingestion reads from it, made without a JSON round trip."""
    step_time = 0.25 + rng.random() * 0.05
    return {"step": step, "loss": 4.0 * (1 + step) ** -0.1 + rng.gauss(0, 0.05), "lr": 3e-4,
            "grad_norm": rng.random(), "tokens_per_s": 65536 / step_time, "step_time_s": step_time,
            "tokens_seen": 65536 * step, "mfu": 0.4 + rng.random() * 0.01,
            "memory": {"max_allocated_bytes": 40 * 2**30 + rng.randrange(2**20)}, "time": 1.7e9 + 0.27 * step}


def _chart_run(folder: Path):
    """A 1,000,000-step run written through the series store (the metrics.jsonl of a run this long is a
    gigabyte; reading it in is what (a) measures)."""
    from django.db import connection, transaction

    from webapp.services.series import series_write

    owner, run = _run(folder, "chart")
    rng, at = random.Random(2), 0
    while at < CHART_STEPS:
        records = []
        for step in range(at + 1, min(at + 50_000, CHART_STEPS) + 1):
            records.append(_chart_record(step, rng))
            if step % 100 == 0:
                records.append({"step": step, "val_loss": 4.0 * (1 + step) ** -0.1 + rng.gauss(0, 0.02)})
        with transaction.atomic():
            series_write(run, records)
        at += 50_000
    with connection.cursor() as cursor:  # what autovacuum does for a table this size soon after it grows
        cursor.execute("VACUUM ANALYZE workbench_seriesstep")
        cursor.execute("VACUUM ANALYZE workbench_seriesbucket")
    return owner, run


def _ranges() -> list[tuple[int, int]]:
    rng = random.Random(3)
    out = [(1, CHART_STEPS)]
    widths = [CHART_STEPS // 2, 250_000, 100_000, 50_000, 20_000, 10_000, 5_000, 2_000]
    while len(out) < CHART_QUERIES:
        width = widths[len(out) % len(widths)]
        start = rng.randrange(1, CHART_STEPS - width)
        out.append((start, start + width - 1))
    return out


def chart_queries(folder: Path) -> list[Figure]:
    from django.db import connection
    from rest_framework.test import APIClient

    started = time.perf_counter()
    owner, run = _chart_run(folder)
    loaded = time.perf_counter() - started
    client = APIClient()
    client.force_authenticate(owner)
    figures = []
    for names in (["loss"], ["loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "mfu",
                             "memory"]):
        chart, raw, served = [], [], []
        for start, end in _ranges():
            t0 = time.perf_counter()
            answer = client.get(f"/api/runs/{run.pk}/series/", {"names": ",".join(names), "x": "step",
                                                                "start": start, "end": end, "points": CHART_POINTS})
            chart.append(time.perf_counter() - t0)
            assert answer.status_code == 200, answer.content[:500]
            served.append(max(len(s["points"]) for s in answer.json()["series"].values()))
            t0 = time.perf_counter()
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT step, {', '.join(names)} FROM workbench_seriesstep "
                               "WHERE run_id = %s AND step BETWEEN %s AND %s ORDER BY step", [run.pk, start, end])
                cursor.fetchall()
            raw.append(time.perf_counter() - t0)
        label = "loss" if len(names) == 1 else f"{len(names)} series"
        chart_s, raw_s = statistics.median(chart), statistics.median(raw)
        figures.append(Figure(f"(b) chart query, {CHART_STEPS:,} steps, {label}, median", chart_s, "s",
                              CHART_TARGET_S, higher_is_better=False,
                              note=f"{len(chart)} ranges, ≤ {max(served):,} points a series; the whole run: "
                                   f"{chart[0] * 1000:,.0f} ms"))
        figures.append(Figure(f"    raw query of the same ranges, {label}, median", raw_s, "s",
                              note=f"{raw_s / chart_s:,.1f}× the chart query's time; the whole run: "
                                   f"{raw[0] * 1000:,.0f} ms ({raw[0] / chart[0]:,.0f}×)"))
    figures[0].note += f"; run loaded in {loaded:.0f} s"
    return figures


# ---------------------------------------------------------------------------------------------- (c) reconcile

def _active_runs(folder: Path, count: int) -> list:
    """``count`` running runs on a local cluster, each with a folder and a live job (this process: it is alive
    for the whole benchmark, as a trainer would be)."""
    from trainer.contract import ParallelPlan, presets
    from webapp import models
    from workers.supervise import JOB_FILE, job_id_of

    owner, first = _run(folder, "reconcile-0")
    cluster = models.Cluster.objects.create(name="bench-local", spec=presets.local_cpu_cluster(1).to_dict())
    plan = models.ParallelismPlan.objects.create(owner=owner, name="one", model_config=first.model_config,
                                                 cluster=cluster, spec=ParallelPlan(micro_batch=1,
                                                                                    global_batch=1).to_dict())
    job_id = job_id_of(os.getpid())
    runs = []
    for i in range(count):
        run_dir = folder / f"reconcile-{i}"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / JOB_FILE).write_text(json.dumps({"name": f"bench-{i}", "job_id": job_id}))
        runs.append(models.Run(owner=owner, name=f"reconcile-{i}", model_config=first.model_config, plan=plan,
                               cluster=cluster, dataset=first.dataset, run_dir=str(run_dir), status="running",
                               job_id=job_id, attempts=1, ingest_state={"job_ended": False}))
    first.delete()
    return models.Run.objects.bulk_create(runs)


def _one_step_each(runs: list, step: int, rng: random.Random) -> None:
    for run in runs:
        with open(Path(run.run_dir) / "metrics.jsonl", "a") as f:
            f.write(_step_line(step, rng, 1))


def reconcile_pass(folder: Path, active_runs: int = RECONCILE_RUNS) -> list[Figure]:
    """Passes as the beat task runs them, their ingest tasks sent to a Redis database of the benchmark's own (and
    emptied after); the ingestion those tasks ask for, timed apart as one worker would do it."""
    from workers.ingesting import ingest_runs
    from workers.runs import reconcile_pass as one_pass

    runs, rng = _active_runs(folder, active_runs), random.Random(3)
    busy, idle, ingest = [], [], []
    try:
        for step in range(1, RECONCILE_PASSES + 1):
            _one_step_each(runs, step, rng)
            started = time.perf_counter()
            report = one_pass()
            busy.append(time.perf_counter() - started)
            assert report.runs == active_runs and report.ingest_requested == active_runs, report
            started = time.perf_counter()
            ingest_runs([run.pk for run in runs])
            ingest.append(time.perf_counter() - started)
            started = time.perf_counter()
            one_pass()
            idle.append(time.perf_counter() - started)
    finally:
        _empty_bench_queue()
    name = f"(c) reconcile pass, {active_runs} active runs"
    return [Figure(f"{name}, each with a new step", statistics.median(busy), "s", RECONCILE_TARGET_S, False,
                   note=f"median of {RECONCILE_PASSES}: one poll, {active_runs} folders looked at, their ingest "
                        f"sent in tasks of 25 runs"),
            Figure(f"{name}, nothing new", statistics.median(idle), "s", RECONCILE_TARGET_S, False),
            Figure("    the ingest tasks of that pass, one worker", statistics.median(ingest), "s",
                   note=f"{active_runs / statistics.median(ingest):,.0f} runs/s: a worker keeps up with "
                        f"{5 * active_runs / statistics.median(ingest):,.0f} runs writing every 5 s")]


def _empty_bench_queue() -> None:
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


SECTIONS = (ingestion, chart_queries, reconcile_pass)


def main() -> int:
    url, base = _throwaway_database()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp:
            _django(url, Path(tmp) / "var")
            figures = []
            for section in SECTIONS:
                started = time.perf_counter()
                out = section(Path(tmp) / section.__name__)
                figures += out if isinstance(out, list) else [out]
                print(f"[{section.__name__} took {time.perf_counter() - started:.0f} s]", file=sys.stderr)
            for figure in figures:
                print(figure.line())
    finally:
        _drop(url, base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
