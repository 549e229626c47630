"""Where a user's datasets may lie: the data roots every user reads, the roots staff gave them, their own uploads.

    WORKBENCH_DATA_ROOTS      every user may register files under these (the demo corpus lies under one)
    DataRoot                  a folder staff open to some users or groups (the admin edits them)
    <UPLOAD_ROOT>/<user id>/  what the user uploaded through the API; theirs alone

The upload tree and every DataRoot not given to a user are excluded for that user even where they lie inside a
root they may read (the upload tree sits in var/data by default); trainer.contract.datapath lets the nearest
folder decide. Staff may use every root.
"""
import os
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from trainer.contract.datapath import DataPathError, data_files


class DataRoot(models.Model):
    """A folder that staff open to some users or groups, for datasets beside the global data roots."""

    path = models.CharField(max_length=500, unique=True, help_text="An absolute path to an existing folder")
    description = models.TextField(blank=True)
    users = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="data_roots",
                                   help_text="Users who may register datasets under this folder")
    groups = models.ManyToManyField("auth.Group", blank=True, related_name="data_roots",
                                    help_text="Groups whose members may register datasets under this folder")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["path"]

    def __str__(self):
        return self.path

    def clean(self):
        path = Path(self.path)
        if not path.is_absolute():
            raise ValidationError({"path": [f"{self.path} is a relative path: give the folder's absolute path"]})
        resolved = Path(os.path.realpath(path))
        if resolved == Path(resolved.anchor):
            raise ValidationError({"path": ["the file system's root would open every file on the server: give the "
                                            "folder that holds the datasets"]})
        if not resolved.is_dir():
            raise ValidationError({"path": [f"{self.path} is not an existing folder on this server: create it "
                                            f"first, or correct the path"]})


def upload_folder(user) -> Path:
    """Where ``user``'s uploaded datasets are stored."""
    return Path(settings.WORKBENCH["UPLOAD_ROOT"]) / str(user.pk)


@dataclass(frozen=True)
class UserDataRoots:
    """The folders one user's datasets may lie in, and those inside them that are not theirs."""

    roots: tuple[Path, ...]
    excluded: tuple[Path, ...]

    def files(self, path: str) -> list[Path]:
        """The files ``path`` stands for; DataPathError if the user may not use it."""
        return data_files(path, self.roots, excluded=self.excluded)

    def problem(self, path: str) -> str:
        """Why the user may not use ``path`` as a dataset, or ''."""
        try:
            self.files(path)
        except DataPathError as exc:
            return str(exc)
        return ""


def data_roots_for(user) -> UserDataRoots:
    uploads = Path(settings.WORKBENCH["UPLOAD_ROOT"])
    common = tuple(Path(r) for r in settings.WORKBENCH["DATA_ROOTS"])
    every_root = tuple(Path(p) for p in DataRoot.objects.values_list("path", flat=True))
    if user.is_staff:
        return UserDataRoots(roots=(*common, *every_root, uploads), excluded=())
    given = DataRoot.objects.filter(Q(users=user) | Q(groups__user=user)).values_list("path", flat=True).distinct()
    given = {Path(p) for p in given}
    return UserDataRoots(roots=(*common, *sorted(given), upload_folder(user)),
                         excluded=(uploads, *(r for r in every_root if r not in given)))
