"""Checkpoints trained elsewhere, registered by the folder they lie in (e.g. one `python -m deploy import-hf` wrote).

The folder must lie under one of the user's data roots, by the same rules as a dataset's path
(trainer.contract.datapath): a user registers only what they may read, and the export later reads nothing else. It
must hold a complete checkpoint (its manifest.json), whose model is valid; the tokenizer the manifest names, which
the export copies into the served model, must lie under the user's data roots too. The folder is recorded resolved,
so that a link changed later does not move the registration elsewhere.
"""
import os
from pathlib import Path

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from trainer.contract import ModelSpec, SpecError
from trainer.contract.manifest import read_manifest

from ..finite import finite
from ..models import Checkpoint, data_roots_for


def _folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def checkpoint_import_register(owner, path: str, name: str = "") -> tuple[Checkpoint, bool]:
    """The owner's checkpoint of the folder ``path``, and whether it was registered now (False: it already was).
    ValidationError on ``path`` when the folder may not be used or is not a complete checkpoint."""
    roots = data_roots_for(owner)
    problem = roots.problem(path)
    if problem:
        raise ValidationError({"path": [f"a checkpoint folder, like a dataset, must lie under your data roots: "
                                        f"{problem}"]})
    folder = Path(os.path.realpath(path))
    manifest = read_manifest(folder) if folder.is_dir() else None
    if manifest is None:
        raise ValidationError({"path": [f"{path} holds no complete checkpoint (no readable manifest.json): give a "
                                        f"checkpoint folder, e.g. runs/<id>/checkpoints/step-<n>, or one that "
                                        f"`python -m deploy import-hf` wrote"]})
    try:
        ModelSpec.from_dict(manifest.model)
    except (SpecError, TypeError, AttributeError) as exc:
        raise ValidationError({"path": [f"the manifest's model is not valid: {exc}"]}) from None
    if manifest.tokenizer:
        problem = roots.problem(manifest.tokenizer)
        if problem:
            raise ValidationError({"path": [f"the manifest's tokenizer must lie under your data roots too: "
                                            f"{problem}"]})
    existing = Checkpoint.objects.filter(run__isnull=True, owner=owner, path=str(folder)).first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            checkpoint = Checkpoint.objects.create(
                owner=owner, name=name or folder.name, step=manifest.step, path=str(folder),
                tokens_seen=manifest.tokens_seen, size_bytes=_folder_size(folder),
                manifest=finite(manifest.to_dict()))
    except IntegrityError:  # registered by a request of the same user at the same moment
        return Checkpoint.objects.get(run__isnull=True, owner=owner, path=str(folder)), False
    return checkpoint, True
