"""Importing Hugging Face models and exporting checkpoints (the tasks workbench.checkpoints.import_hf and
workbench.checkpoints.export_hf).

Each runs ``python -m deploy import-hf SOURCE TARGET`` or ``export-hf CHECKPOINT OUT`` as a job of its own on this
machine (workers.job_process.follow_command: they need torch, which the workers never import), named
``wb-conv<id>-<when the row was made>``, in ``<runs root>/conversions/<job name>/``. The processes print progress
lines on stderr, one JSON line on stdout, and exit 2 when they refuse (the reason on the last line: "error: …"), 1
when they fail. The conversion row says where it stands (webapp.services.conversions): running with the latest
progress line, then done (an import's checkpoint registered with its lineage, an export's folder recorded on its
checkpoint) or failed with the last error line.

The reconcile pass sends the task again for a conversion pending over two minutes and never claimed (its message
lost). A redelivered task (its worker died) claims the conversion again and follows the job by its name: an import
whose folder is complete already (the process renamed it into place just before the worker died) is registered as
it is; an export writes over its own folder.
"""
import json
import logging
import shutil
import sys
from datetime import timedelta
from pathlib import Path

from django.utils import timezone

from trainer.contract.manifest import read_manifest
from webapp.models import CheckpointConversion
from webapp.services import conversions
from webapp.services.tasks import TaskName, enqueue
from workers.deploy_commands import REFUSED
from workers.job_process import Following, command_folder, command_job_name, follow_command, local_settings
from workers.launchers import CommandRequest

log = logging.getLogger(__name__)
Kind = CheckpointConversion.Kind

FOLLOWING = Following("conversion", "started", timeout_s=3 * 3600.0, every_s=2.0)


class ConversionFailed(Exception):
    pass


def conversion_command(conversion: CheckpointConversion) -> list[str]:
    command = [sys.executable, "-m", "deploy", conversion.kind, conversion.source, conversion.target]
    return command if conversion.kind == Kind.IMPORT_HF else [*command, "--overwrite"]


class Settled(Exception):
    """The job did not run to its end: the row is settled already, or another delivery goes on with it."""


def conversion_request(conversion: CheckpointConversion) -> CommandRequest:
    name = command_job_name("conv", conversion)
    return CommandRequest(job_name=name, run_dir=command_folder(None, "conversions", name),
                          command=tuple(conversion_command(conversion)), settings=local_settings())


def _run(conversion: CheckpointConversion) -> dict:
    """The process's JSON report; ConversionFailed with its refusal or its failure's last line; Settled when it
    could not start, ran out of time, or another delivery claimed the conversion."""
    ended = follow_command(conversion, conversion_request(conversion), FOLLOWING)
    if isinstance(ended, str):
        raise Settled(ended)
    if ended.status == REFUSED:
        raise ConversionFailed(f"{conversion.kind} refused: {ended.last_error}")
    if ended.status != 0:
        raise ConversionFailed(f"{conversion.kind} failed (exit status {ended.status}): "
                               f"{ended.last_error or 'it printed nothing'}")
    try:
        return json.loads(ended.report_line)
    except ValueError:
        return {}


def _convert(conversion: CheckpointConversion) -> str:
    target = Path(conversion.target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if conversion.kind == Kind.IMPORT_HF:
        if read_manifest(target) is None:
            shutil.rmtree(target, ignore_errors=True)  # this conversion's own folder: a redelivery starts over
            report = _run(conversion)
        else:
            report = {"target": str(target), "redelivered": True}
        checkpoint = conversions.conversion_import_done(conversion, report)
        return f"imported {conversion.source} as checkpoint {checkpoint.pk}"
    report = _run(conversion)
    conversions.conversion_export_done(conversion, report)
    return f"exported {conversion.source} to {target}"


def conversion_run(conversion_id: int) -> str:
    conversion = conversions.conversion_claim(conversion_id)
    if conversion is None:
        return "settled"
    try:
        return _convert(conversion)
    except Settled as exc:
        return str(exc)
    except ConversionFailed as exc:
        conversions.conversion_fail(conversion, str(exc))
        return str(exc)
    except (OSError, ValueError) as exc:
        log.exception("conversion %s failed", conversion_id)
        conversions.conversion_fail(conversion, f"{conversion.kind} failed: {exc}")
        return str(exc)


def resend_unclaimed(older_than_s: float = 120) -> list[int]:
    """Send the task again for conversions pending a while and never claimed: their message may have been lost (a
    broker restart). A conversion claimed by a worker that died comes back by redelivery, as every task does; a
    duplicate finds its conversion settled and does nothing."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    stale = list(CheckpointConversion.objects.filter(status=CheckpointConversion.Status.PENDING,
                                                     claimed_at__isnull=True, created_at__lt=cutoff)
                 .values_list("pk", "kind"))
    for pk, kind in stale:
        if kind == Kind.IMPORT_HF:
            enqueue(TaskName.CHECKPOINT_IMPORT_HF, pk)
        else:
            enqueue(TaskName.CHECKPOINT_EXPORT_HF, pk)
    return [pk for pk, _ in stale]
