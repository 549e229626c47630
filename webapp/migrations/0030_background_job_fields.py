"""The job rows' fields as webapp.models.jobs.BackgroundJob has them, once their data is (0029)."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('workbench', '0029_background_job_statuses'),
    ]

    operations = [
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
