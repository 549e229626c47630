import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from trainer.contract import ParallelPlan, presets

BEFORE_SPECS = [("workbench", "0003_tune_job")]
WITH_SPECS = [("workbench", "0004_run_spec")]


def test_it_has_a_migration_for_every_model_change(db):
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_it_gives_existing_runs_the_spec_they_launched_with_or_their_parts_make(tmp_path):
    try:
        apps = _migrate(BEFORE_SPECS)
        owner = apps.get_model("auth", "User").objects.create(username="old")
        model = apps.get_model("workbench", "ModelConfig").objects.create(
            owner=owner, name="tiny", spec=presets.MODELS["tiny"].to_dict())
        cluster = apps.get_model("workbench", "Cluster").objects.create(
            name="local", spec=presets.local_cpu_cluster(1).to_dict(), runs_root=str(tmp_path))
        plan = apps.get_model("workbench", "ParallelismPlan").objects.create(
            owner=owner, name="one", model_config=model, cluster=cluster,
            spec=ParallelPlan(micro_batch=2, global_batch=4).to_dict())
        dataset = apps.get_model("workbench", "Dataset").objects.create(owner=owner, name="d", path="/data/d.txt")
        Run = apps.get_model("workbench", "Run")
        parts = dict(owner=owner, model_config=model, plan=plan, cluster=cluster, dataset=dataset)
        launched = Run.objects.create(name="launched", steps=7, **parts)
        launched.run_dir = str(tmp_path / str(launched.pk))
        launched.save()
        drafted = Run.objects.create(name="drafted", steps=9, **parts)  # no folder yet: it is named after the id
        broken = Run.objects.create(name="broken", steps=0, **parts)  # steps=0 makes no valid spec

        # What the first launch wrote, before the plan was edited: that is what the run ran with.
        Path(launched.run_dir).mkdir()
        old_spec = {"schema_version": 1, "name": "launched", "model": presets.MODELS["tiny"].to_dict(),
                    "plan": ParallelPlan(micro_batch=1, global_batch=4).to_dict(),
                    "cluster": presets.local_cpu_cluster(1).to_dict(), "dataset": {"path": "/data/d.txt"},
                    "output_dir": launched.run_dir, "steps": 7}
        (Path(launched.run_dir) / "spec.json").write_text(json.dumps(old_spec))

        Run = _migrate(WITH_SPECS).get_model("workbench", "Run")
        launched, drafted, broken = (Run.objects.get(pk=r.pk) for r in (launched, drafted, broken))
        assert launched.spec["plan"]["micro_batch"] == 1 and launched.spec["output_dir"] == launched.run_dir
        assert drafted.spec["plan"]["micro_batch"] == 2 and drafted.spec["steps"] == 9
        assert drafted.run_dir == drafted.spec["output_dir"] == str(tmp_path / str(drafted.pk))
        assert broken.spec is None
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


BEFORE_JOB_ROWS = [("workbench", "0027_calibration_refit_requested_at")]
WITH_JOB_ROWS = [("workbench", "0030_background_job_fields")]


@pytest.mark.django_db(transaction=True)
def test_it_keeps_tuning_jobs_and_scores_when_their_rows_become_common_job_rows():
    try:
        apps = _migrate(BEFORE_JOB_ROWS)
        owner = apps.get_model("auth", "User").objects.create(username="old")
        dataset = apps.get_model("workbench", "Dataset").objects.create(owner=owner, name="d", path="/data/d.txt")
        TuneJob = apps.get_model("workbench", "TuneJob")
        done = TuneJob.objects.create(owner=owner, request={}, dataset=dataset, status="completed",
                                      result={"best": 1}, started_at="2026-01-02T03:04:05Z")
        failed = TuneJob.objects.create(owner=owner, request={}, dataset=dataset, status="failed", error="no data")
        queued = TuneJob.objects.create(owner=owner, request={}, dataset=dataset)
        checkpoint = apps.get_model("workbench", "Checkpoint").objects.create(owner=owner, step=1, path="/ck")
        eval_set = apps.get_model("workbench", "EvaluationSet").objects.create(owner=owner, name="s", kind="text",
                                                                                path="/s.txt")
        scored = apps.get_model("workbench", "Evaluation").objects.create(
            owner=owner, eval_set=eval_set, checkpoint=checkpoint, status="done", scores={"metrics": {"acc": 0.5}})

        apps = _migrate(WITH_JOB_ROWS)
        TuneJob = apps.get_model("workbench", "TuneJob")
        done, failed, queued = (TuneJob.objects.get(pk=job.pk) for job in (done, failed, queued))
        assert (done.status, done.report, done.claimed_at.year) == ("done", {"best": 1}, 2026)
        assert (failed.status, failed.message, failed.report) == ("failed", "no data", {})
        assert queued.status == "pending"
        assert apps.get_model("workbench", "Evaluation").objects.get(pk=scored.pk).report == {"metrics": {"acc": 0.5}}
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
