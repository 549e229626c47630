"""Importing Hugging Face models as checkpoints and exporting checkpoints to the Hugging Face layout.

    checkpoint_import_hf   a model folder under the admin's models directory (WORKBENCH["MODELS_ROOT"]) → a
                           pending conversion; workbench.checkpoints.import_hf runs ``python -m deploy import-hf``
                           into <CONVERSIONS_ROOT>/imports/<id>/ and registers the checkpoint it wrote, its lineage
                           "imported from <folder>"
    checkpoint_export_hf   a checkpoint the user may see → a pending conversion; workbench.checkpoints.export_hf
                           runs ``python -m deploy export-hf`` into <CONVERSIONS_ROOT>/exports/<id>/, recorded on the
                           checkpoint (``hf_export_path``)

The workers (workers.converting) run the processes and record what they did through the functions below: a
conversion is claimed (pending or, redelivered, running → running), then done or failed with a message that says
what to change.
"""
import os
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from trainer.contract import ModelSpec, SpecError
from trainer.contract.manifest import read_manifest

from ..finite import finite
from ..models import Checkpoint, CheckpointConversion
from .job_rows import job_claim, job_settle
from .tasks import TaskName, enqueue

Kind, Status = CheckpointConversion.Kind, CheckpointConversion.Status
HF_CONFIG = "config.json"


def models_root() -> Path:
    return Path(os.path.realpath(settings.WORKBENCH["MODELS_ROOT"]))


def conversions_root() -> Path:
    return Path(settings.WORKBENCH["CONVERSIONS_ROOT"])


def import_source_problem(path: str) -> str:
    """Why ``path`` may not be imported, or '': it must be a folder of a Hugging Face model (its config.json) inside
    the admin's models directory, after links are followed."""
    root = models_root()
    if not path or not Path(path).is_absolute():
        return f"give the absolute path of a model folder inside the models directory {root}"
    folder = Path(os.path.realpath(path))
    if folder == root or root not in folder.parents:
        return (f"{path} is outside the models directory {root}: only model folders placed there may be imported "
                f"(ask staff to put the model there, or set WORKBENCH_MODELS_ROOT)")
    if not folder.is_dir():
        return f"{path} is not a folder on the server: give the folder that holds the model's {HF_CONFIG}"
    if not (folder / HF_CONFIG).is_file():
        return f"{path} has no {HF_CONFIG}: it is not a model in the Hugging Face layout"
    return ""


def is_server_import(checkpoint: Checkpoint) -> bool:
    """A checkpoint this server's import task wrote (into its own conversions folder), not a folder a user
    registered: the data-root rules for users' folders do not apply to it."""
    if checkpoint.run_id is not None or not checkpoint.imported_from:
        return False
    imports = Path(os.path.realpath(conversions_root() / "imports"))
    return imports in Path(os.path.realpath(checkpoint.path)).parents


@transaction.atomic
def checkpoint_import_hf(owner, path: str, name: str = "") -> CheckpointConversion:
    """Queue the import of the Hugging Face model in folder ``path``; ValidationError on ``path`` when refused."""
    problem = import_source_problem(path)
    if problem:
        raise ValidationError({"path": [problem]})
    source = Path(os.path.realpath(path))
    conversion = CheckpointConversion.objects.create(owner=owner, kind=Kind.IMPORT_HF, source=str(source),
                                                     name=name or source.name, target="",
                                                     message="queued for import")
    conversion.target = str(conversions_root() / "imports" / str(conversion.pk))
    conversion.save(update_fields=["target"])
    enqueue(TaskName.CHECKPOINT_IMPORT_HF, conversion.pk)
    return conversion


@transaction.atomic
def checkpoint_export_hf(owner, checkpoint: Checkpoint) -> CheckpointConversion:
    """Queue the export of ``checkpoint`` (visible to ``owner``: the caller checks) to the Hugging Face layout."""
    if read_manifest(checkpoint.path) is None:
        raise ValidationError({"checkpoint": [f"checkpoint {checkpoint.pk}'s folder {checkpoint.path} no longer holds "
                                              f"a complete checkpoint: it was pruned or moved"]})
    conversion = CheckpointConversion.objects.create(owner=owner, kind=Kind.EXPORT_HF, source=checkpoint.path,
                                                     checkpoint=checkpoint, target="", message="queued for export")
    conversion.target = str(conversions_root() / "exports" / str(conversion.pk))
    conversion.save(update_fields=["target"])
    enqueue(TaskName.CHECKPOINT_EXPORT_HF, conversion.pk)
    return conversion


# -- what the workers record ------------------------------------------------------------------------------------

def conversion_claim(conversion_id: int) -> CheckpointConversion | None:
    """The conversion, now running under this delivery's claim; None when it is settled (done, failed) or gone."""
    conversion = CheckpointConversion.objects.filter(pk=conversion_id).only("kind").first()
    if conversion is None:
        return None
    return job_claim(CheckpointConversion, conversion_id, f"running python -m deploy {conversion.kind}")


def conversion_fail(conversion: CheckpointConversion, message: str) -> bool:
    return job_settle(conversion, Status.FAILED, message)


def _folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


@transaction.atomic
def conversion_import_done(conversion: CheckpointConversion, report: dict) -> Checkpoint:
    """Register the checkpoint an import wrote (its owner's, lineage "imported from <source>"); the conversion done.
    ValueError when the folder holds no valid checkpoint."""
    folder = Path(os.path.realpath(conversion.target))
    manifest = read_manifest(folder)
    if manifest is None:
        raise ValueError(f"the import wrote no manifest.json into {folder}")
    try:
        ModelSpec.from_dict(manifest.model)
    except (SpecError, TypeError, AttributeError) as exc:
        raise ValueError(f"the imported manifest's model is not valid: {exc}") from None
    fields = dict(name=conversion.name or Path(conversion.source).name, step=manifest.step,
                  tokens_seen=manifest.tokens_seen, size_bytes=_folder_size(folder),
                  manifest=finite(manifest.to_dict()), imported_from=conversion.source)
    try:
        with transaction.atomic():
            checkpoint, _ = Checkpoint.objects.update_or_create(run=None, owner=conversion.owner, path=str(folder),
                                                                defaults=fields)
    except IntegrityError:  # a redelivery registered it at the same moment
        checkpoint = Checkpoint.objects.get(run=None, owner=conversion.owner, path=str(folder))
    job_settle(conversion, Status.DONE, f"imported as checkpoint {checkpoint.pk} ({checkpoint.name})", report,
               checkpoint=checkpoint)
    return checkpoint


@transaction.atomic
def conversion_export_done(conversion: CheckpointConversion, report: dict) -> None:
    """Record where an export wrote the model folder, on the conversion and on its checkpoint."""
    if conversion.checkpoint_id is not None:
        Checkpoint.objects.filter(pk=conversion.checkpoint_id).update(hf_export_path=conversion.target)
    job_settle(conversion, Status.DONE, f"exported to {conversion.target}", report)
