"""Tiny synthetic run folders for the live-data tests: metrics.jsonl written with the contract's own records, read
in by the real ingestion, and a count of the rows the database read for a query."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from django.db import connection
from django.test.utils import CaptureQueriesContext

from trainer.contract.records import EvalMetrics, Event, StepMetrics, event
from trainer.contract.runfolder import EVENTS, METRICS, append_jsonl
from trainer.profiling.digest import write_summary
from webapp import services
from webapp.services.ingest import run_ingest

START = 1_700_000_000.0  # the first step's wall time


def step_record(step: int, loss: float, tokens_per_step: int = 1024, step_time: float = 0.5, ranks=None,
                **figures) -> dict:
    """A training step's metrics.jsonl row; its wall time is ``step_time`` per step after START."""
    fields = dict(lr=3e-4, grad_norm=1.0, tokens_per_s=tokens_per_step / step_time, step_time_s=step_time, mfu=0.4,
                  memory={"max_allocated_bytes": 2**30}, flops_per_step=1, loss_scale=1.0, skipped=False)
    fields.update(figures)
    return StepMetrics(step=step, loss=loss, tokens_seen=tokens_per_step * step, time=START + step * step_time,
                       ranks=ranks or {}, **fields).to_dict()


def eval_record(step: int, val_loss: float, by_source: dict[str, float] | None = None) -> dict:
    return EvalMetrics(step=step, val_loss=val_loss, val_loss_by_source=by_source).to_dict()


def new_run(owner, plan, dataset, name: str = "r", **fields):
    return services.run_create(owner=owner, name=name, plan=plan, dataset=dataset, **fields)


def append_metrics(run, records) -> None:
    """Write ``records`` to the run folder's metrics.jsonl, in one write, and read them in."""
    path = Path(run.run_dir) / METRICS
    path.parent.mkdir(parents=True, exist_ok=True)
    if len(records) < 100:
        for record in records:
            append_jsonl(path, record)
    else:  # thousands of rows: one write instead of one open a row
        with open(path, "a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in records))
    run_ingest(run.pk)


def rows_read(call) -> int:
    """How many table rows the database read to answer ``call()``: on PostgreSQL its own count of heap tuples
    fetched (by index) and scanned (sequentially) in this transaction; on SQLite the rows each query returned."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:  # the planner's statistics, as autovacuum keeps them for a live table
            cursor.execute("ANALYZE workbench_seriesstep, workbench_seriesbucket")
        before = _tuples_read()
        call()
        return _tuples_read() - before
    with CaptureQueriesContext(connection) as queries:
        call()
    total = 0
    with connection.cursor() as cursor:
        for query in queries.captured_queries:
            if query["sql"].lstrip().upper().startswith("SELECT"):
                cursor.execute(f"SELECT COUNT(*) FROM ({query['sql']})")
                total += cursor.fetchone()[0]
    return total


def _tuples_read() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0) "
                       "FROM pg_stat_xact_user_tables WHERE relname IN ('workbench_seriesstep', "
                       "'workbench_seriesbucket')")
        return int(cursor.fetchone()[0])


def trace_file(path: Path, compute_us: int, comm_us: int) -> None:
    """A chrome trace of one profiled step of 1,000 µs: an operator computing, then a collective, then idle."""
    events = [{"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 1000, "pid": 1, "tid": 1},
              {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 0, "dur": compute_us, "pid": 1, "tid": 1},
              {"ph": "X", "name": "c10d::allreduce_", "cat": "cpu_op", "ts": compute_us, "dur": comm_us, "pid": 1,
               "tid": 1}]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)


def write_profile(run, name: str = "steps-10") -> None:
    """A profile of two ranks in the run's folder, digested by the trainer's own digest, and the events that
    announce it (not yet read in): rank 0 computes 60 % of its step, communicates 20 % and idles 20 %; rank 1 80 %,
    10 % and 10 %."""
    folder = Path(run.run_dir) / "profiles" / name
    folder.mkdir(parents=True)
    trace_file(folder / "rank-0.trace.json.gz", 600, 200)
    trace_file(folder / "rank-1.trace.json.gz", 800, 100)
    write_summary(folder)
    append_jsonl(Path(run.run_dir) / EVENTS, event(Event.STARTED, 0))
    append_jsonl(Path(run.run_dir) / EVENTS, event(Event.PROFILE_WRITTEN, 0, name=name, path=f"profiles/{name}"))


def queued_tasks(broker) -> list[str]:
    """The names of the tasks waiting in ``broker`` (a quiet broker no worker takes them from), oldest first."""
    return [json.loads(m)["headers"]["task"] for m in broker.lrange("celery", 0, -1)]
