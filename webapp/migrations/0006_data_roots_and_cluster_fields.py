"""Data roots that staff give users or groups; a cluster's environment setup becomes a list of lines.

The setup text is converted, not cast: its lines become the list (blank ones dropped), and back again on the way
down. A column cast would fail on PostgreSQL, where text such as "module load cuda" is not JSON.
"""
from django.conf import settings
from django.db import migrations, models


def text_to_lines(apps, schema_editor):
    Cluster = apps.get_model("workbench", "Cluster")
    for cluster in Cluster.objects.all():
        cluster.env_setup_lines = [line.rstrip() for line in cluster.env_setup.splitlines() if line.strip()]
        cluster.save(update_fields=["env_setup_lines"])


def lines_to_text(apps, schema_editor):
    Cluster = apps.get_model("workbench", "Cluster")
    for cluster in Cluster.objects.all():
        cluster.env_setup = "\n".join(cluster.env_setup_lines or [])
        cluster.save(update_fields=["env_setup"])


class Migration(migrations.Migration):

    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("workbench", "0005_run_launching_since"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="cluster",
            name="env_setup_lines",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.RunPython(text_to_lines, lines_to_text),
        migrations.RemoveField(model_name="cluster", name="env_setup"),
        migrations.RenameField(model_name="cluster", old_name="env_setup_lines", new_name="env_setup"),
        migrations.AlterField(
            model_name="cluster",
            name="env_setup",
            field=models.JSONField(blank=True, default=list, help_text="Shell lines run before the trainer (module load …, source …), a JSON list of strings. Trusted staff input: each line is written into the batch script verbatim, as a shell command"),
        ),
        migrations.AlterField(
            model_name="cluster",
            name="container_image",
            field=models.CharField(blank=True, help_text="An image reference: [registry[:port]/]name[:tag][@digest]", max_length=300),
        ),
        migrations.AlterField(
            model_name="cluster",
            name="runs_root",
            field=models.CharField(blank=True, help_text="Folder for run folders, under one of WORKBENCH_RUNS_ROOTS; empty: the default", max_length=500),
        ),
        migrations.CreateModel(
            name="DataRoot",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("path", models.CharField(help_text="An absolute path to an existing folder", max_length=500, unique=True)),
                ("description", models.TextField(blank=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                ("groups", models.ManyToManyField(blank=True, help_text="Groups whose members may register datasets under this folder", related_name="data_roots", to="auth.group")),
                ("users", models.ManyToManyField(blank=True, help_text="Users who may register datasets under this folder", related_name="data_roots", to=settings.AUTH_USER_MODEL)),
            ],
            options={"ordering": ["path"]},
        ),
    ]
