"""Benchmark: the pages' server time with 1,000 runs and a 1,000,000-step run in the database, and the bytes a
chart of that run fetches, each figure beside its target.

    python -m bench.webapp.pages                     # the local server's postgres database
    DATABASE_URL=postgres://me@db:5432/postgres python -m bench.webapp.pages

Like bench/workers/live.py (whose throwaway database and 1,000,000-step run it reuses) it works in a database of
its own beside the one DATABASE_URL names, dropped at the end. Server time is the time the Django test client
takes for a request in this process: the view, its queries and the template, without a network. Each page is asked
once to warm up, then PAGE_REPEATS times; the median is printed with the number of queries it made. The chart's
transfer is what the run page asks for at its width (two points a pixel of a 600-pixel chart, the series its
charts name): bytes of JSON per series, and gzipped.
"""
from __future__ import annotations

import gzip
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.workers.live import Figure, _chart_run, _django, _drop, _throwaway_database

PAGE_TARGET_S = 0.300
RUNS = 1_000
RUN_STEPS = 120          # each listed run's loss curve, for its sparkline
PAGE_REPEATS = 7
CHART_WIDTH_PX = 600     # run.js asks for two points a pixel


def _ledger(attempts: int, started: float) -> dict:
    """What ingestion keeps of a run's attempts for goodput (webapp.goodput), each RUN_STEPS steps of a second."""
    ledger = {}
    for number in range(1, attempts + 1):
        at = started + 1000.0 * number
        ledger[str(number)] = {"job_started": at, "started": at + 20, "load_s": 2.0, "resumed_at": 0,
                               "steps_s": float(RUN_STEPS), "last_step": RUN_STEPS, "checkpoint_save": 3.0,
                               "steps_s_at": {str(s): float(s) for s in range(0, RUN_STEPS + 1, 20)},
                               "last": at + 20 + RUN_STEPS + 3, "job_ended": at + 30 + RUN_STEPS}
    return ledger


def _many_runs(owner, run) -> list:
    """RUNS runs beside ``run`` (the 1,000,000-step one), of every status, each with a short loss curve and, as a
    run made through the API has, its stored spec and estimate; each that was launched with its attempts and the
    ledger its goodput is read from."""
    from django.db import transaction
    from django.utils import timezone

    from webapp import models
    from webapp.services.run_estimates import spec_estimate
    from webapp.services.runs import run_check
    from webapp.services.series import series_write

    rng = random.Random(4)
    statuses = list(models.RunStatus.values)
    spec = run_check(run).to_dict()
    estimate = spec_estimate(spec, run.cluster)
    never_launched = {models.RunStatus.DRAFT, models.RunStatus.QUEUED}
    runs = models.Run.objects.bulk_create([
        models.Run(owner=owner, name=f"run-{i}", model_config=run.model_config, plan=run.plan, cluster=run.cluster,
                   dataset=run.dataset, status=statuses[i % len(statuses)], steps=RUN_STEPS * 2,
                   last_step=RUN_STEPS, run_dir=str(Path(run.run_dir).parent / f"run-{i}"), spec=spec,
                   estimate=estimate, attempts=0 if statuses[i % len(statuses)] in never_launched else 1 + i % 2)
        for i in range(RUNS - 1)])
    now = timezone.now()
    with transaction.atomic():
        for other in runs:
            series_write(other, [{"step": s, "loss": 5.0 * s ** -0.2 + rng.gauss(0, 0.02), "time": 1.7e9 + s,
                                  "tokens_seen": 1024 * s} for s in range(1, RUN_STEPS + 1)])
            other.ingest_state = {"ledger": _ledger(other.attempts, 1.7e9)}
        models.Run.objects.bulk_update(runs, ["ingest_state"])
        models.Attempt.objects.bulk_create([
            models.Attempt(run=other, number=n, backend="slurm", job_id=f"{other.pk}{n}", submitted_at=now,
                           ended_at=now if n < other.attempts or other.status not in (models.RunStatus.SUBMITTED,
                                                                             models.RunStatus.RUNNING)
                           else None, state="COMPLETED")
            for other in runs for n in range(1, other.attempts + 1)])
    return runs


def _timed(client, url: str) -> tuple[float, int, bytes]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    answer = client.get(url)
    assert answer.status_code == 200, f"{url}: {answer.status_code} {answer.content[:300]!r}"
    times = []
    for _ in range(PAGE_REPEATS):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            answer = client.get(url)
            times.append(time.perf_counter() - started)
    return statistics.median(times), len(queries), answer.content


def pages(folder: Path) -> list[Figure]:
    from django.test import Client

    started = time.perf_counter()
    owner, big = _chart_run(folder)
    others = _many_runs(owner, big)
    print(f"[1,000,000-step run and {len(others):,} runs loaded in {time.perf_counter() - started:.0f} s]",
          file=sys.stderr)
    client = Client()
    client.force_login(owner)
    figures = []
    urls = {"dashboard (1,000 runs, first page)": "/",
            "dashboard, filtered by status, sorted by name": "/?status=completed&sort=name",
            "dashboard, searched": "/?q=run-99",
            "dashboard, page 30": "/?page=30",
            "run page of the 1,000,000-step run": f"/runs/{big.pk}/",
            "    its header, reloaded at each update": f"/runs/{big.pk}/part/header/",
            "    its estimate beside measured, reloaded": f"/runs/{big.pk}/part/measure/",
            "compare, that run and another": f"/compare/?ids={big.pk},{others[0].pk}",
            "    compare's chart data (loss of both)": f"/api/runs/compare/?ids={big.pk},{others[0].pk}&names=loss"
                                                       f"&x=step&points={2 * CHART_WIDTH_PX}",
            "new-run wizard": "/runs/new/",
            "deploy": "/deploy/",
            "playground": "/playground/"}
    run_page = b""
    for label, url in urls.items():
        median, queries, body = _timed(client, url)
        if url == f"/runs/{big.pk}/":
            run_page = body
        figures.append(Figure(f"{label}, median" if not label.startswith(" ") else label, median, "s", PAGE_TARGET_S, higher_is_better=False,
                              note=f"{queries} queries, {len(body):,} bytes"))
    names = sorted({n for found in re.findall(rb'data-names="([^"]+)"', run_page)
                    for n in found.decode().split(",")}) or ["loss"]
    url = f"/api/runs/{big.pk}/series/?names={','.join(names)}&x=step&points={2 * CHART_WIDTH_PX}"
    median, queries, body = _timed(client, url)
    figures.append(Figure(f"run page's chart data ({len(names)} series), median", median, "s", PAGE_TARGET_S,
                          higher_is_better=False, note=f"{queries} queries"))
    per_series = len(body) / len(names)
    figures.append(Figure("    chart transfer per series (JSON)", per_series, "bytes",
                          note=f"{len(gzip.compress(body)) / len(names):,.0f} bytes gzipped; "
                               f"{2 * CHART_WIDTH_PX:,} points asked of 1,000,000 steps; series: {', '.join(names)}"))
    return figures


def main() -> int:
    url, base = _throwaway_database()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-pages-") as tmp:
            _django(url, Path(tmp) / "var")
            for figure in pages(Path(tmp) / "pages"):
                print(figure.line())
    finally:
        _drop(url, base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
