"""Deployments: the exporter's report, the smoke check, instances, streaming and a prompt template; Triton's
metrics URL; chat turns of prompt templates; checkpoints registered from elsewhere (no run, an owner).

A model name is unique on its server only among the deployments that hold it (not unloaded, not failed), so a name
can be deployed again.
"""
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('workbench', '0008_series_steps_and_buckets'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='checkpoint',
            options={'ordering': ['run', '-step', 'id']},
        ),
        migrations.RemoveConstraint(
            model_name='deployment',
            name='unique_model_name_per_server',
        ),
        migrations.AddField(
            model_name='checkpoint',
            name='name',
            field=models.CharField(blank=True, help_text="An imported checkpoint's name", max_length=120),
        ),
        migrations.AddField(
            model_name='checkpoint',
            name='owner',
            field=models.ForeignKey(blank=True, help_text="Who registered an imported checkpoint; empty for a run's", null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='deployment',
            name='claimed_at',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name='deployment',
            name='instances',
            field=models.PositiveIntegerField(default=1, help_text='Model instances Triton runs'),
        ),
        migrations.AddField(
            model_name='deployment',
            name='prompt_template',
            field=models.ForeignKey(blank=True, help_text="Turns chat messages into the model's prompt", null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='deployments', to='workbench.prompttemplate'),
        ),
        migrations.AddField(
            model_name='deployment',
            name='ready_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='deployment',
            name='report',
            field=models.JSONField(blank=True, default=dict, help_text="The exporter's report"),
        ),
        migrations.AddField(
            model_name='deployment',
            name='smoke_ok',
            field=models.BooleanField(blank=True, help_text="Whether the served model's greedy tokens equal the checkpoint's own", null=True),
        ),
        migrations.AddField(
            model_name='deployment',
            name='streaming',
            field=models.BooleanField(default=True, help_text='Exported decoupled: one response per token'),
        ),
        migrations.AddField(
            model_name='deployment',
            name='unloaded_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='prompttemplate',
            name='chat_template',
            field=models.TextField(default='{role}: {content}\n', help_text='One chat turn, with {role} and {content}'),
        ),
        migrations.AddField(
            model_name='tritonserver',
            name='metrics_url',
            field=models.CharField(blank=True, help_text='Where /metrics is read, e.g. http://127.0.0.1:8002', max_length=200),
        ),
        migrations.AlterField(
            model_name='checkpoint',
            name='run',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='checkpoints', to='workbench.run'),
        ),
        migrations.AddConstraint(
            model_name='checkpoint',
            constraint=models.UniqueConstraint(condition=models.Q(('run__isnull', True)), fields=('owner', 'path'), name='unique_imported_checkpoint_per_owner'),
        ),
        migrations.AddConstraint(
            model_name='checkpoint',
            constraint=models.CheckConstraint(condition=models.Q(('run__isnull', False), ('owner__isnull', False), _connector='OR'), name='checkpoint_of_a_run_or_an_owner'),
        ),
        migrations.AddConstraint(
            model_name='deployment',
            constraint=models.UniqueConstraint(condition=models.Q(('status__in', ['pending', 'exporting', 'loading', 'ready'])), fields=('server', 'model_name'), name='unique_held_model_name_per_server'),
        ),
    ]
