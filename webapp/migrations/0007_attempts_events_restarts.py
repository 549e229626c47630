"""Attempts and events of a run; a run's retries counted as restarts (attempts after the first); slurmrestd clusters."""
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


def attempts_to_restarts(apps, schema_editor):
    Run = apps.get_model("workbench", "Run")
    for run in Run.objects.all():
        run.max_restarts = max(run.max_restarts - 1, 0)
        run.restarts = max(run.attempts - 1, 0)
        run.save(update_fields=["max_restarts", "restarts"])


def restarts_to_attempts(apps, schema_editor):
    Run = apps.get_model("workbench", "Run")
    for run in Run.objects.all():
        run.max_restarts += 1
        run.save(update_fields=["max_restarts"])


class Migration(migrations.Migration):
    dependencies = [("workbench", "0006_data_roots_and_cluster_fields")]

    operations = [
        migrations.RenameField("run", "max_attempts", "max_restarts"),
        migrations.AddField("run", "restarts", models.PositiveIntegerField(
            default=0, help_text="Attempts started again after a failed job")),
        migrations.RunPython(attempts_to_restarts, restarts_to_attempts),
        migrations.AlterField("run", "max_restarts", models.PositiveIntegerField(
            default=2, help_text="How many times a failed job (a killed rank, a lost node) is started again from the "
                                 "newest checkpoint; a time limit or preemption requeues without using one")),
        migrations.AlterField("run", "attempts", models.PositiveIntegerField(
            default=0, help_text="Jobs submitted for the run, all reasons")),
        migrations.AlterField("cluster", "kind", models.CharField(
            choices=[("local", "Local torchrun"), ("slurm", "Slurm (commands on a login node)"),
                     ("slurm-rest", "Slurm (slurmrestd)")], default="local", max_length=16)),
        migrations.AddField("cluster", "stop_before_limit_s", models.PositiveIntegerField(
            default=120, help_text="How long before the Slurm time limit the trainer is asked to save a checkpoint "
                                   "and stop (the run is then requeued and resumes): room for a step and a checkpoint "
                                   "save. At least a tenth of the limit is left to train")),
        migrations.AddField("cluster", "rest_url", models.URLField(
            blank=True, help_text="slurmrestd's address for slurm-rest clusters, e.g. http://login1:6820; the token "
                                  "comes from SLURM_JWT")),
        migrations.CreateModel(
            name="Attempt",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("number", models.PositiveIntegerField()),
                ("backend", models.CharField(max_length=16)),
                ("job_id", models.CharField(max_length=64)),
                ("resume", models.BooleanField(default=False,
                                               help_text="Continued the run folder of an earlier attempt")),
                ("why", models.CharField(blank=True, help_text="Why this attempt was started", max_length=200)),
                ("script", models.TextField(blank=True, help_text="The batch script submitted (Slurm), as stored in "
                                                                  "the run folder")),
                ("command", models.JSONField(blank=True, default=list,
                                             help_text="The command that submitted or started the job")),
                ("submitted_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("ended_at", models.DateTimeField(blank=True, null=True)),
                ("state", models.CharField(blank=True, help_text="How the scheduler says the job ended",
                                           max_length=32)),
                ("exit_code", models.IntegerField(blank=True, null=True)),
                ("reason", models.TextField(blank=True, help_text="How it ended, in words")),
                ("counts_as_restart", models.BooleanField(
                    default=False, help_text="A failure that used up one of the run's restarts (a time limit or "
                                             "preemption does not)")),
                ("run", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="attempt_records",
                                          to="workbench.run")),
            ],
            options={"ordering": ["run", "number"]},
        ),
        migrations.AddConstraint("attempt", models.UniqueConstraint(fields=("run", "number"),
                                                                    name="unique_attempt_number_per_run")),
        migrations.CreateModel(
            name="RunEvent",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("time", models.DateTimeField(default=django.utils.timezone.now)),
                ("source", models.CharField(choices=[("trainer", "Trainer"), ("scheduler", "Scheduler"),
                                                     ("workbench", "Workbench")], max_length=16)),
                ("kind", models.CharField(max_length=32)),
                ("attempt", models.PositiveIntegerField(blank=True, null=True)),
                ("message", models.TextField(blank=True)),
                ("data", models.JSONField(blank=True, default=dict)),
                ("run", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="history",
                                          to="workbench.run")),
            ],
            options={"ordering": ["run", "time", "id"],
                     "indexes": [models.Index(fields=["run", "time"], name="workbench_r_run_id_ea1fd4_idx")]},
        ),
    ]
