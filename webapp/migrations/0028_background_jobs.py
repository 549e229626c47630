"""Evaluations, preparations, conversions and tuning jobs share one job row (webapp.models.jobs.BackgroundJob):
fields renamed where their names differed (an evaluation's scores, a tuning job's result, error and started_at are
its report, message and claimed_at); 0029 rewrites a tuning job's statuses as the common ones, 0030 gives the fields
their final form."""
from django.db import migrations, models


class Migration(migrations.Migration):
    """The schema before the data: on PostgreSQL a table whose rows a migration updated cannot be altered in the same
    transaction (its deferred constraint triggers are pending), so the statuses are rewritten in the next migration
    and the fields they allow are narrowed in the one after."""

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
    ]
