"""Evaluations, preparations, conversions and tuning jobs share one job row (webapp.models.jobs.BackgroundJob):
fields renamed where their names differed (an evaluation's scores, a tuning job's result, error and started_at are
its report, message and claimed_at), and a tuning job's statuses are the common ones (queued → pending, completed →
done)."""
from django.db import migrations, models

TUNE_STATUSES = {"queued": "pending", "completed": "done"}


def tune_statuses_forward(apps, schema_editor):
    TuneJob = apps.get_model("workbench", "TuneJob")
    for old, new in TUNE_STATUSES.items():
        TuneJob.objects.filter(status=old).update(status=new)
    TuneJob.objects.filter(report__isnull=True).update(report={})


def tune_statuses_backward(apps, schema_editor):
    TuneJob = apps.get_model("workbench", "TuneJob")
    for old, new in TUNE_STATUSES.items():
        TuneJob.objects.filter(status=new).update(status=old)


class Migration(migrations.Migration):

    dependencies = [
        ('workbench', '0027_calibration_refit_requested_at'),
    ]

    operations = [
        migrations.RenameField(model_name='evaluation', old_name='scores', new_name='report'),
        migrations.RenameField(model_name='tunejob', old_name='result', new_name='report'),
        migrations.RenameField(model_name='tunejob', old_name='error', new_name='message'),
        migrations.RenameField(model_name='tunejob', old_name='started_at', new_name='claimed_at'),
        migrations.AlterField(
            model_name='tunejob',
            name='status',
            field=models.CharField(choices=[('queued', 'Queued'), ('pending', 'Pending'), ('running', 'Running'),
                                            ('completed', 'Completed'), ('done', 'Done'), ('failed', 'Failed')],
                                   db_index=True, default='pending', max_length=16),
        ),
        migrations.AlterField(model_name='tunejob', name='report', field=models.JSONField(blank=True, null=True)),
        migrations.RunPython(tune_statuses_forward, tune_statuses_backward),
            migrations.AddField(
            model_name='checkpointconversion',
            name='job_id',
            field=models.CharField(blank=True, help_text="Its scheduler's job, once submitted", max_length=64),
        ),
        migrations.AddField(
            model_name='evaluation',
            name='job_id',
            field=models.CharField(blank=True, help_text="Its scheduler's job, once submitted", max_length=64),
        ),
        migrations.AddField(
            model_name='tunejob',
            name='job_id',
            field=models.CharField(blank=True, help_text="Its scheduler's job, once submitted", max_length=64),
        ),
        migrations.AlterField(
            model_name='checkpointconversion',
            name='message',
            field=models.TextField(blank=True, help_text="Where it stands; a failure's reason"),
        ),
        migrations.AlterField(
            model_name='checkpointconversion',
            name='report',
            field=models.JSONField(blank=True, default=dict, help_text='What the job reported when it ended'),
        ),
        migrations.AlterField(
            model_name='datasetpreparation',
            name='job_id',
            field=models.CharField(blank=True, help_text="Its scheduler's job, once submitted", max_length=64),
        ),
        migrations.AlterField(
            model_name='datasetpreparation',
            name='report',
            field=models.JSONField(blank=True, default=dict, help_text='What the job reported when it ended'),
        ),
        migrations.AlterField(
            model_name='evaluation',
            name='claimed_at',
            field=models.DateTimeField(blank=True, editable=False, help_text='When the delivery of the task now working on it started', null=True),
        ),
        migrations.AlterField(
            model_name='evaluation',
            name='report',
            field=models.JSONField(blank=True, default=dict, help_text='What the job reported when it ended'),
        ),
        migrations.AlterField(
            model_name='tunejob',
            name='claimed_at',
            field=models.DateTimeField(blank=True, editable=False, help_text='When the delivery of the task now working on it started', null=True),
        ),
        migrations.AlterField(
            model_name='tunejob',
            name='message',
            field=models.TextField(blank=True, help_text="Where it stands; a failure's reason"),
        ),
        migrations.AlterField(
            model_name='tunejob',
            name='report',
            field=models.JSONField(blank=True, default=dict, help_text='What the job reported when it ended'),
        ),
        migrations.AlterField(
            model_name='tunejob',
            name='status',
            field=models.CharField(choices=[('pending', 'Pending'), ('running', 'Running'), ('done', 'Done'), ('failed', 'Failed')], db_index=True, default='pending', max_length=16),
        ),
    ]
