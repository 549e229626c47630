"""Preparing a dataset ahead of its runs (the task workbench.datasets.prepare).

It runs ``python -m trainer.data prepare … --json`` as a process, with the dataset's own settings (text field,
tokenizer, share of bad rows allowed, validation share) and the vocabulary asked for: into the folder a run of a
model of that vocabulary prepares into, so that the run finds the data prepared and reuses it. The process prints a
progress line on stderr as each shard is encoded, and one JSON line on stdout: the prepared data's meta.json (status
0), or a refusal with the bad-row report when there is one (status 2). A redelivered task starts the process again,
which keeps the shards a crashed one finished.

On a Slurm cluster (the preparation's ``cluster``) the same command is a batch job of its own, named
``wb-prep<id>-<when the row was made>``, with WORKBENCH["PREPARE_CPUS"] CPUs on one node and as many encoding
processes: its script, its output (the progress lines) and its report lie in
``<cluster's runs root>/preparations/<job name>/``, which the nodes and the workers share. The task follows the job
to its end; a redelivered task finds the job by its name and follows it instead of submitting another.
"""
import json
import sys
from pathlib import Path

from django.conf import settings

from webapp.models import Cluster, DatasetPreparation
from webapp.services import preparations
from webapp.services.runs import runs_root
from workers.deploy_commands import REFUSED
from workers.job_process import run_cluster_job, run_job_process
from workers.launchers import CommandRequest, launcher_for
from workers.launching import scheduler_settings

Status = DatasetPreparation.Status

TIMEOUT_S = 24 * 3600.0
PROGRESS_EVERY_S = 1.0
CLUSTER_PROGRESS_EVERY_S = 2.0  # a scheduler call each time


def preparation_command(preparation: DatasetPreparation) -> list[str]:
    dataset = preparation.dataset
    command = [sys.executable, "-m", "trainer.data", "prepare", "--path", dataset.path,
               "--vocab", str(dataset.tokenizer_vocab or preparation.vocab), "--val-fraction", str(dataset.val_fraction),
               "--text-field", dataset.text_field, "--max-bad-fraction", str(dataset.max_bad_fraction), "--json"]
    return [*command, "--tokenizer", dataset.tokenizer] if dataset.tokenizer else command


def cluster_request(preparation: DatasetPreparation) -> CommandRequest:
    """The preparation as a batch job of its own on its Slurm cluster."""
    cluster, dataset = preparation.cluster, preparation.dataset
    cpus = settings.WORKBENCH["PREPARE_CPUS"]
    # named for the row and when it was made: every delivery finds the job by that name, and a row of another
    # database with the same id (a second workbench on the cluster, a restored one) never takes it for its own
    name = f"wb-prep{preparation.pk}-{preparation.created_at:%Y%m%d%H%M%S%f}"
    folder = runs_root(cluster) / "preparations" / name
    folder.mkdir(parents=True, exist_ok=True)
    read = [str(Path(p).parent) for p in (dataset.path, dataset.tokenizer) if p]
    return CommandRequest(job_name=name, run_dir=folder,
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

    def progress(elapsed: float, said: str) -> bool:
        return preparations.preparation_progress(preparation, f"{said or 'reading the source'} "
                                                              f"({elapsed:.0f} s so far)")

    def fail(why: str) -> bool:
        return preparations.preparation_settle(preparation, Status.FAILED, why, {})

    cluster = preparation.cluster
    if cluster is not None and cluster.kind != Cluster.Kind.LOCAL:
        request = cluster_request(preparation)
        ended = run_cluster_job("preparation", launcher_for(request.settings), request, TIMEOUT_S,
                                CLUSTER_PROGRESS_EVERY_S, progress, fail,
                                lambda job_id: preparations.preparation_submitted(preparation, job_id))
    else:
        ended = run_job_process("preparation", preparation_command(preparation), TIMEOUT_S, PROGRESS_EVERY_S,
                                progress, fail)
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
