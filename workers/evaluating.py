"""Evaluating a checkpoint on an evaluation set (the task workbench.evaluations.run).

It runs ``python -m trainer.evaluate --checkpoint … --set … --kind … --json`` as a job of its own on this machine
(workers.job_process.follow_command: it needs torch and the harness, which the workers never import), named
``wb-eval<id>-<when the row was made>``, in ``<runs root>/evaluations/<job name>/``: the harness's progress on stderr, one JSON line of scores on stdout
(status 0), or a refusal naming the set's bad line (status 2). A deployment is evaluated as any client would use
it: ``--endpoint <the web app>/v1/completions --model <its name>``, with its owner's API token in the process's
environment, and ``--tokenizer <its checkpoint's>`` where its entry returns log-probabilities (choices scored by
likelihood too). A redelivered task finds the job by its name and follows it.
"""
import json
import sys

from django.conf import settings

from webapp.models import Evaluation
from webapp.services import evaluations
from workers.deploy_commands import REFUSED
from workers.job_process import Following, command_folder, command_job_name, follow_command, local_settings
from workers.launchers import CommandRequest

Status = Evaluation.Status

FOLLOWING = Following("evaluation", "starting the harness", timeout_s=12 * 3600.0)


def evaluation_command(evaluation: Evaluation) -> list[str]:
    if evaluation.deployment is not None:
        target = ["--endpoint", f"{settings.WORKBENCH['URL']}/v1/completions",
                  "--model", evaluation.deployment.model_name]
        tokenizer = evaluations.evaluation_tokenizer(evaluation)
        if tokenizer:
            target += ["--tokenizer", tokenizer]
    else:
        target = ["--checkpoint", evaluation.checkpoint.path]
    return [sys.executable, "-m", "trainer.evaluate", *target, "--set", evaluation.eval_set.path,
            "--kind", evaluation.eval_set.kind, "--json"]


def evaluation_request(evaluation: Evaluation) -> CommandRequest:
    name = command_job_name("eval", evaluation)
    env = {"OPENAI_API_KEY": evaluations.evaluation_api_key(evaluation)} if evaluation.deployment else {}
    return CommandRequest(job_name=name, run_dir=command_folder(None, "evaluations", name),
                          command=tuple(evaluation_command(evaluation)), settings=local_settings(), env=env)


def _summary(scores: dict) -> str:
    metrics = scores.get("metrics") or {}
    shown = ", ".join(f"{name} {value:.4f}" for name, value in metrics.items() if not name.endswith("_stderr"))
    return f"{scores.get('items', 0)} items: {shown}"


def evaluation_run(evaluation_id: int) -> str:
    evaluation = evaluations.evaluation_claim(evaluation_id)
    if evaluation is None:
        return "settled"
    ended = follow_command(evaluation, evaluation_request(evaluation), FOLLOWING)
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
