"""Run.spec: the RunSpec every attempt of a run launches with, stored when the run is created.

Existing runs take the spec.json of their first launch when there is one (that is what they ran with), otherwise
the spec their parts make today. A run whose parts no longer make a valid spec keeps none, and its launch is
refused with the reason. The spec is built here from the historical rows, as the code of this moment builds it.
"""
import json
from pathlib import Path

from django.conf import settings
from django.db import migrations, models

from trainer.contract import (ClusterSpec, DatasetSpec, ModelSpec, OptimizerSpec, ParallelPlan, ProfileSpec, RunSpec,
                              SpecError)
from trainer.contract.runfolder import SPEC


def _folder(run) -> str:
    root = run.cluster.runs_root or settings.WORKBENCH["RUNS_ROOT"]
    return run.run_dir or str(Path(root) / str(run.pk))


def _launched_spec(folder: str) -> RunSpec | None:
    try:
        return RunSpec.from_dict(json.loads((Path(folder) / SPEC).read_text()))
    except (OSError, ValueError):  # no folder or no file, unreadable JSON, or a SpecError (a ValueError)
        return None


def _spec_from_parts(run, folder: str) -> RunSpec | None:
    try:
        return RunSpec(
            name=run.name, model=ModelSpec.from_dict(run.model_config.spec), plan=ParallelPlan.from_dict(run.plan.spec),
            cluster=ClusterSpec.from_dict(run.cluster.spec),
            dataset=DatasetSpec(path=run.dataset.path, tokenizer_vocab=run.dataset.tokenizer_vocab,
                                val_fraction=run.dataset.val_fraction),
            output_dir=folder, steps=run.steps, seed=run.seed, checkpoint_every=run.checkpoint_every,
            eval_every=run.eval_every, optimizer=OptimizerSpec.from_dict(run.optimizer or {}),
            profile=ProfileSpec.from_dict(run.profile) if run.profile else None,
        ).validate()
    except SpecError:
        return None


def fill_specs(apps, schema_editor):
    Run = apps.get_model("workbench", "Run")
    for run in Run.objects.filter(spec__isnull=True).select_related("model_config", "plan", "cluster", "dataset"):
        folder = _folder(run)
        spec = _launched_spec(folder) or _spec_from_parts(run, folder)
        if spec is not None:
            run.run_dir, run.spec = folder, spec.replace(output_dir=folder).to_dict()
            run.save(update_fields=["run_dir", "spec"])


class Migration(migrations.Migration):

    dependencies = [
        ('workbench', '0003_tune_job'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='spec',
            field=models.JSONField(blank=True, editable=False, help_text='trainer.contract.RunSpec as JSON: what every attempt launches with', null=True),
        ),
        migrations.RunPython(fill_specs, migrations.RunPython.noop),
    ]
