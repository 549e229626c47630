"""Evaluating a checkpoint on an evaluation set (the task workbench.evaluations.run).

It runs ``python -m trainer.evaluate --checkpoint … --set … --kind … --json`` as a process (it needs torch and the
harness, which the workers never import): the harness's progress on stderr, one JSON line of scores on stdout
(status 0), or a refusal naming the set's bad line (status 2). A deployment is evaluated as any client would use
it: ``--endpoint <the web app>/v1/completions --model <its name>``, with its owner's API token in the process's
environment. A redelivered task runs it again from the start.
"""
import json
import sys

from django.conf import settings

from webapp.models import Evaluation
from webapp.services import evaluations
from workers.deploy_commands import REFUSED
from workers.job_process import run_job_process

Status = Evaluation.Status

TIMEOUT_S = 12 * 3600.0
PROGRESS_EVERY_S = 1.0


def evaluation_command(evaluation: Evaluation) -> list[str]:
    if evaluation.deployment is not None:
        target = ["--endpoint", f"{settings.WORKBENCH['URL']}/v1/completions",
                  "--model", evaluation.deployment.model_name]
    else:
        target = ["--checkpoint", evaluation.checkpoint.path]
    return [sys.executable, "-m", "trainer.evaluate", *target, "--set", evaluation.eval_set.path,
            "--kind", evaluation.eval_set.kind, "--json"]


def _environment(evaluation: Evaluation) -> dict[str, str] | None:
    return {"OPENAI_API_KEY": evaluations.evaluation_api_key(evaluation)} if evaluation.deployment else None


def _summary(scores: dict) -> str:
    metrics = scores.get("metrics") or {}
    shown = ", ".join(f"{name} {value:.4f}" for name, value in metrics.items() if not name.endswith("_stderr"))
    return f"{scores.get('items', 0)} items: {shown}"


def evaluation_run(evaluation_id: int) -> str:
    evaluation = evaluations.evaluation_claim(evaluation_id)
    if evaluation is None:
        return "settled"

    def progress(elapsed: float, said: str) -> bool:
        return evaluations.evaluation_progress(evaluation, f"{said or 'starting the harness'} "
                                                           f"({elapsed:.0f} s so far)")

    ended = run_job_process("evaluation", evaluation_command(evaluation), TIMEOUT_S, PROGRESS_EVERY_S, progress,
                            lambda why: evaluations.evaluation_settle(evaluation, Status.FAILED, why, {}),
                            _environment(evaluation))
    if isinstance(ended, str):
        return ended
    try:
        scores = json.loads(ended.report_line) if ended.status == 0 else {}
    except ValueError:
        scores = {}
    if ended.status == 0 and isinstance(scores, dict) and scores.get("metrics"):
        message = _summary(scores)
        evaluations.evaluation_settle(evaluation, Status.DONE, message, scores)
    elif ended.status == REFUSED:
        message = f"refused: {ended.last_error}"
        evaluations.evaluation_settle(evaluation, Status.FAILED, message, {})
    else:
        message = f"the evaluation failed (exit status {ended.status}): {ended.last_error or 'it printed nothing'}"
        evaluations.evaluation_settle(evaluation, Status.FAILED, message, {})
    return message
