"""A tuning job's statuses become the common ones (queued → pending, completed → done), and a missing report an empty
one; alone in its migration (0028_background_jobs says why)."""
from django.db import migrations

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
        ('workbench', '0028_background_jobs'),
    ]

    operations = [
        migrations.RunPython(tune_statuses_forward, tune_statuses_backward),
    ]
