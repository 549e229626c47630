"""Preparing a dataset ahead of its runs (the task workbench.datasets.prepare).

It runs ``python -m trainer.data prepare … --json`` as a process, with the dataset's own settings (text field,
tokenizer, share of bad rows allowed, validation share) and the vocabulary asked for: into the folder a run of a
model of that vocabulary prepares into, so that the run finds the data prepared and reuses it. The process prints a
progress line on stderr as each shard is encoded, and one JSON line on stdout: the prepared data's meta.json (status
0), or a refusal with the bad-row report when there is one (status 2).

It is a job of its own (workers.job_process.follow_command), named ``wb-prep<id>-<when the row was made>``: a
detached process on this machine, or on a Slurm cluster (the preparation's ``cluster``) a batch job with
WORKBENCH["PREPARE_CPUS"] CPUs on one node and as many encoding processes. Its output (the progress lines) and its
report lie in ``<runs root>/preparations/<job name>/``, which a cluster's nodes and the workers share. The task
follows the job to its end; a redelivered task finds the job by its name and follows it instead of starting another.
"""
import json
import sys
from pathlib import Path

from django.conf import settings

from webapp.models import DatasetPreparation
from webapp.services import preparations
from workers.deploy_commands import REFUSED
from workers.job_process import Following, command_folder, command_job_name, follow_command, local_settings
from workers.launchers import CommandRequest
from workers.launching import scheduler_settings

Status = DatasetPreparation.Status

FOLLOWING = Following("preparation", "reading the source", timeout_s=24 * 3600.0,
                      every_s=2.0)  # a scheduler call each time, on a cluster


def preparation_command(preparation: DatasetPreparation) -> list[str]:
    dataset = preparation.dataset
    command = [sys.executable, "-m", "trainer.data", "prepare", "--path", dataset.path,
               "--vocab", str(dataset.tokenizer_vocab or preparation.vocab), "--val-fraction", str(dataset.val_fraction),
               "--text-field", dataset.text_field, "--max-bad-fraction", str(dataset.max_bad_fraction), "--json"]
    return [*command, "--tokenizer", dataset.tokenizer] if dataset.tokenizer else command


def preparation_request(preparation: DatasetPreparation) -> CommandRequest:
    """The preparation as a job of its own: on its cluster, or on this machine without one."""
    cluster, dataset = preparation.cluster, preparation.dataset
    name = command_job_name("prep", preparation)
    read = [str(Path(p).parent) for p in (dataset.path, dataset.tokenizer) if p]
    if cluster is None:
        return CommandRequest(job_name=name, run_dir=command_folder(None, "preparations", name),
                              command=tuple(preparation_command(preparation)), settings=local_settings())
    cpus = settings.WORKBENCH["PREPARE_CPUS"]
    return CommandRequest(job_name=name, run_dir=command_folder(cluster, "preparations", name),
                          command=(*preparation_command(preparation), "--workers", str(cpus)),
                          settings=scheduler_settings(cluster), cpus=cpus, mounts=tuple(read))


def _report(stdout_line: str) -> dict:
    try:
        report = json.loads(stdout_line)
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}


def _summary(meta: dict) -> str:
    bad = meta.get("bad_rows") or {}
    skipped = f"; skipped {bad['bad']:,} unreadable rows of {bad['rows']:,}" if bad.get("bad") else ""
    return (f"prepared {meta.get('documents', 0):,} documents: {meta.get('train_tokens', 0):,} training and "
            f"{meta.get('val_tokens', 0):,} validation tokens, vocabulary {meta.get('vocab_size')}{skipped}")


def preparation_run(preparation_id: int) -> str:
    preparation = preparations.preparation_claim(preparation_id)
    if preparation is None:
        return "settled"
    ended = follow_command(preparation, preparation_request(preparation), FOLLOWING)
    if isinstance(ended, str):
        return ended
    report = _report(ended.report_line)
    if ended.status == 0 and report:
        message = _summary(report)
        preparations.preparation_settle(preparation, Status.DONE, message, report)
    elif ended.status == REFUSED:
        message = report.get("refused") or ended.last_error or "the preparation was refused"
        preparations.preparation_settle(preparation, Status.FAILED, message, report)
    else:
        message = f"the preparation failed (exit status {ended.status}): {ended.last_error or 'it printed nothing'}"
        preparations.preparation_settle(preparation, Status.FAILED, message, {})
    return message
