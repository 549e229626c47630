"""Metric series for charts: one row of floats a step, and min/max rollups over blocks of steps."""
import django.db.models.deletion
from django.db import migrations, models

SERIES = [(1, "loss"), (2, "val_loss"), (3, "lr"), (4, "grad_norm"), (5, "tokens_per_s"), (6, "step_time_s"),
          (7, "mfu"), (8, "memory")]


def _run():
    return models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name="+",
                             to="workbench.run")


class Migration(migrations.Migration):
    dependencies = [("workbench", "0007_attempts_events_restarts")]

    operations = [
        migrations.CreateModel(
            name="SeriesBucket",
            fields=[
                ("pk", models.CompositePrimaryKey("run_id", "series", "level", "bucket", blank=True, editable=False,
                                                  primary_key=True, serialize=False)),
                ("series", models.PositiveSmallIntegerField(choices=SERIES)),
                ("level", models.PositiveSmallIntegerField()),
                ("bucket", models.PositiveIntegerField()),
                ("count", models.PositiveIntegerField()),
                ("min_value", models.FloatField()),
                ("min_step", models.PositiveIntegerField()),
                ("min_tokens", models.BigIntegerField(null=True)),
                ("min_wall", models.FloatField(null=True)),
                ("max_value", models.FloatField()),
                ("max_step", models.PositiveIntegerField()),
                ("max_tokens", models.BigIntegerField(null=True)),
                ("max_wall", models.FloatField(null=True)),
                ("run", _run()),
            ],
        ),
        migrations.CreateModel(
            name="SeriesStep",
            fields=[
                ("pk", models.CompositePrimaryKey("run_id", "step", blank=True, editable=False, primary_key=True,
                                                  serialize=False)),
                ("step", models.PositiveIntegerField()),
                ("tokens_seen", models.BigIntegerField(null=True)),
                ("wall_time", models.FloatField(
                    help_text="Seconds since the epoch when the step's record was written", null=True)),
                ("loss", models.FloatField(null=True)),
                ("val_loss", models.FloatField(null=True)),
                ("lr", models.FloatField(null=True)),
                ("grad_norm", models.FloatField(null=True)),
                ("tokens_per_s", models.FloatField(null=True)),
                ("step_time_s", models.FloatField(null=True)),
                ("mfu", models.FloatField(null=True)),
                ("memory", models.FloatField(help_text="max_allocated_bytes of rank 0", null=True)),
                ("run", _run()),
            ],
            options={
                "indexes": [models.Index(fields=["run", "tokens_seen"], name="series_step_by_tokens"),
                            models.Index(fields=["run", "wall_time"], name="series_step_by_time")],
            },
        ),
    ]
