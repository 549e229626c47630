"""A checkpoint, or a model behind an OpenAI-compatible /v1, evaluated on an evaluation set with EleutherAI's
lm-evaluation-harness (``lm-eval``).

    python -m trainer.evaluate --checkpoint runs/<id>/checkpoints/step-<n> --set items.jsonl --kind choice [--json]
    OPENAI_API_KEY=<token> python -m trainer.evaluate --endpoint http://host:8000/v1/completions --model <name> \
        [--tokenizer <the model's tokenizer.json>] --set items.jsonl --kind choice [--json]

The harness does what every team's scores are compared by (its prompt handling, its metrics and their standard
errors); this module gives it the model and the task:

- ``CheckpointLM`` is the harness's model interface over a checkpoint of any plan, loaded unsharded
  (trainer.generate): the log-likelihood of a continuation after a context, the rolling log-likelihood of a whole
  text, and greedy generation up to stop strings.
- An endpoint is the harness's own ``local-completions`` model: greedy requests to /v1/completions, the text
  sent as it is (the server tokenizes it). Given the model's tokenizer, a continuation's log-likelihood is asked of
  it too, as the harness asks any OpenAI-compatible server: the context and continuation echoed back with each
  token's log-probability, the continuation's tokens counted by that tokenizer.
- ``task_configs`` turns an evaluation set into the harness's tasks: ``choice`` (JSONL of ``question``, ``choices``
  and the index of the right one, ``answer``), ``reference`` (JSONL of ``prompt`` and ``reference``: the greedy
  answer's exact match) or ``text`` (JSONL with ``text``, or a plain text file whose paragraphs are the documents:
  perplexity per word and per byte, and bits per byte; a checkpoint only). A choice set is scored two ways:
  ``acc`` and ``acc_norm`` by the likeliest choice (as the harness's multiple-choice tasks do; an endpoint given
  its tokenizer), with each choice's log-likelihood kept, and ``acc_generated`` by the letter the model writes after
  the choices listed as A., B., … (greedy, the harness's generative variant of such tasks), which a checkpoint and
  its deployments share, so that they can be compared.
  The data is read with the ``datasets`` library's JSON reader, from the file itself: nothing is fetched.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM

from trainer.generate import generate, load_model_from_checkpoint

Kind = Literal["choice", "reference", "text"]
KINDS: tuple[Kind, ...] = ("choice", "reference", "text")
TASK_NAME = "workbench_eval"
GENERATED_TASK = "workbench_eval_generated"
# per task: the harness's metric (with its filter) and the name a score is given
METRICS = {"choice": {"acc": "acc", "acc_norm": "acc_norm"}, "reference": {"exact_match": "exact_match"},
           "text": {m: m for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")}}
GENERATED_METRICS = {"exact_match": "acc_generated"}
MAX_GENERATED = 64  # tokens a reference answer may take
MAX_LETTER_TOKENS = 8  # tokens a multiple-choice answer may take: its letter, perhaps after a space
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class EvaluationError(ValueError):
    """An evaluation set or checkpoint that cannot be evaluated; the message says what to change."""


@dataclass(frozen=True)
class Scores:
    kind: Kind
    metrics: dict[str, float]  # each metric of the kind, and its standard error as "<metric>_stderr" where given
    items: int
    answers: tuple[str, ...] = ()  # the generated answers, item by item, where the kind generates
    likelihoods: tuple[tuple[float, ...], ...] = ()  # each choice's log-likelihood, item by item, where scored

    def to_dict(self) -> dict:
        return {"kind": self.kind, "items": self.items, "metrics": self.metrics, "answers": list(self.answers),
                "likelihoods": [list(item) for item in self.likelihoods]}


# ---- the model ---------------------------------------------------------------------------------------------------

class CheckpointLM(LM):
    """The harness's model interface over one checkpoint, on one device, one request at a time per batch row."""

    def __init__(self, checkpoint: str | Path, device: str = "cpu", batch_size: int = 8):
        super().__init__()
        self.model, self.tokenizer = load_model_from_checkpoint(checkpoint, device=device)
        if self.tokenizer is None:
            raise EvaluationError(f"the checkpoint {checkpoint} records no tokenizer: it cannot read text")
        self.max_length = self.model.spec.seq_len
        self.batch_size = batch_size
        self._device = torch.device(device)

    # The harness encodes context and continuation together and splits them where the context ends, so that a
    # merge across the boundary does not change the continuation's tokens (its own models do the same).
    def _pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        spaces = len(context) - len(context.rstrip())
        if spaces:  # a trailing space belongs to the continuation, as the tokenizer would read it
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.tokenizer.encode(context + continuation)
        head = self.tokenizer.encode(context)
        return whole[:len(head)], whole[len(head):]

    @torch.no_grad()
    def _scores(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """For each (context ids, continuation ids): the continuation's summed log-probability, and whether each of
        its tokens is the model's greedy choice. The window is the model's context, cut on the left."""
        out = []
        for start in range(0, len(pairs), self.batch_size):
            batch = pairs[start:start + self.batch_size]
            windows = [(ctx + cont)[-(self.max_length + 1):][:-1] for ctx, cont in batch]
            width = max(len(w) for w in windows)
            ids = torch.zeros(len(batch), width, dtype=torch.long, device=self._device)
            for row, window in enumerate(windows):
                ids[row, :len(window)] = torch.tensor(window, dtype=torch.long)
            logprobs = F.log_softmax(self.model(ids).float(), dim=-1)
            for row, ((_, cont), window) in enumerate(zip(batch, windows)):
                n = len(cont)
                steps = logprobs[row, len(window) - n:len(window)]  # the positions that predict the continuation
                target = torch.tensor(cont, dtype=torch.long, device=self._device)
                out.append((float(steps.gather(1, target[:, None]).sum()), bool((steps.argmax(-1) == target).all())))
        return out

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        pairs = []
        for request in requests:
            context, continuation = request.args
            ctx, cont = self._pair(context, continuation)
            if not cont:
                raise EvaluationError(f"an empty continuation after {context[-40:]!r}: every choice needs text")
            pairs.append((ctx or [self._eos()], cont))
        return self._scores(pairs)

    def loglikelihood_rolling(self, requests) -> list[float]:
        """Each text's log-likelihood, token by token, in windows of the model's context (the first token after the
        end-of-text one)."""
        totals = []
        for request in requests:
            ids = self.tokenizer.encode(request.args[0])
            if not ids:
                totals.append(0.0)
                continue
            pieces = [([self._eos()] if at == 0 else ids[max(0, at - self.max_length):at], ids[at:at + self.max_length])
                      for at in range(0, len(ids), self.max_length)]
            totals.append(sum(score for score, _ in self._scores(pieces)))
        return totals

    def generate_until(self, requests) -> list[str]:
        answers = []
        for request in requests:
            context, options = request.args
            until = [s for s in (options or {}).get("until", []) if s]
            limit = int((options or {}).get("max_gen_toks", MAX_GENERATED))
            prompt = self.tokenizer.encode(context)[-(self.max_length - 1):]
            new = generate(self.model, prompt, min(limit, self.max_length - len(prompt)), temperature=0.0)
            text = self.tokenizer.decode(list(new[len(prompt):]) if len(new) > len(prompt) else [])
            cuts = [text.index(s) for s in until if s in text]
            answers.append(text[:min(cuts)] if cuts else text)
        return answers

    def _eos(self) -> int:
        return self.tokenizer.eos_id if self.tokenizer.eos_id is not None else 0


# ---- the task ----------------------------------------------------------------------------------------------------

REQUIRED = {"choice": ("question", "choices", "answer"), "reference": ("prompt", "reference"), "text": ("text",)}


def read_items(path: Path, kind: Kind) -> list[dict]:
    """The set's items, checked: EvaluationError naming the first bad line and what it lacks."""
    if kind == "text" and path.suffix != ".jsonl":
        paragraphs = [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
        return [{"text": p} for p in paragraphs]
    items = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise EvaluationError(f"{path.name}:{number}: not JSON ({exc})") from None
        missing = [k for k in REQUIRED[kind] if not isinstance(item, dict) or k not in item]
        if missing:
            raise EvaluationError(f"{path.name}:{number}: a {kind} item needs {', '.join(REQUIRED[kind])}; "
                                  f"{', '.join(missing)} missing")
        if kind == "choice" and not (isinstance(item["choices"], list) and 2 <= len(item["choices"]) <= len(LETTERS)
                                     and isinstance(item["answer"], int)
                                     and 0 <= item["answer"] < len(item["choices"])):
            raise EvaluationError(f"{path.name}:{number}: choices must be a list of 2 to {len(LETTERS)}, and answer "
                                  f"the index of the right one")
        items.append(item)
    if not items:
        raise EvaluationError(f"{path.name} holds no items")
    return items


def task_configs(data_file: Path, kind: Kind, endpoint: bool = False, likelihood: bool = True) -> list[dict]:
    """The harness's tasks for a JSONL file of checked items of ``kind``: what a checkpoint is scored on; for an
    endpoint, a choice's likelihood where it can be asked (``likelihood``) and what is scored from generated text
    (EvaluationError for a kind that has none)."""
    common = {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data_file)}},
              "test_split": "test"}
    if kind == "choice":
        listed = ("{{question}}\n{% for choice in choices %}{{ '" + LETTERS + "'[loop.index0] }}. {{choice}}\n"
                  "{% endfor %}Answer:")
        generated = {**common, "task": GENERATED_TASK, "output_type": "generate_until", "doc_to_text": listed,
                     "doc_to_target": "{{ '" + LETTERS + "'[answer] }}",
                     "generation_kwargs": {"until": ["\n"], "do_sample": False, "max_gen_toks": MAX_LETTER_TOKENS},
                     # the first capital letter standing alone is the answer, as the harness's generative
                     # multiple-choice tasks read it
                     "filter_list": [{"name": "letter", "filter": [
                         {"function": "regex", "regex_pattern": r"\b([A-Z])\b"}, {"function": "take_first"}]}],
                     "metric_list": [{"metric": "exact_match"}]}
        likeliest = {**common, "task": TASK_NAME, "output_type": "multiple_choice",
                     "doc_to_text": "{{question}}\nAnswer:", "doc_to_choice": "{{choices}}", "doc_to_target": "{{answer}}",
                     "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}]}
        return [likeliest, generated] if likelihood else [generated]
    if kind == "reference":
        return [{**common, "task": GENERATED_TASK, "output_type": "generate_until", "doc_to_text": "{{prompt}}",
                 "doc_to_target": "{{reference}}",
                 "generation_kwargs": {"until": ["\n"], "do_sample": False, "max_gen_toks": MAX_GENERATED},
                 "metric_list": [{"metric": "exact_match", "ignore_case": True, "ignore_punctuation": True}]}]
    if endpoint:
        raise EvaluationError("a text set is scored by the model's log-likelihood over windows of its context, "
                              "which an endpoint's does not tell: evaluate the deployment's checkpoint instead")
    return [{**common, "task": TASK_NAME, "output_type": "loglikelihood_rolling", "doc_to_text": "",
             "doc_to_target": "{{text}}", "metric_list": [{"metric": m} for m in METRICS["text"]]}]


def _scores(results: dict, kind: Kind, items: int) -> Scores:
    metrics, answers, likelihoods = {}, (), ()
    for task, names in ((TASK_NAME, METRICS[kind]), (GENERATED_TASK, GENERATED_METRICS if kind == "choice"
                                                      else METRICS[kind])):
        for key, value in results["results"].get(task, {}).items():
            metric = key.split(",")[0]
            stderr = metric.endswith("_stderr")
            name = names.get(metric.removesuffix("_stderr"))
            if name and isinstance(value, (int, float)):
                metrics[name + ("_stderr" if stderr else "")] = float(value)
        samples = sorted(results.get("samples", {}).get(task, []), key=lambda sample: sample["doc_id"])
        if task == GENERATED_TASK and samples:
            answers = tuple(sample["resps"][0][0] for sample in samples)
        if task == TASK_NAME and kind == "choice" and samples:  # a response of (log-likelihood, greedy) per choice
            likelihoods = tuple(tuple(float(choice[0][0]) for choice in sample["resps"]) for sample in samples)
    return Scores(kind=kind, metrics=metrics, items=items, answers=answers, likelihoods=likelihoods)


def _evaluate(make_model, eval_set: str | Path, kind: Kind, limit: int | None, endpoint: bool,
              likelihood: bool = True) -> Scores:
    if kind not in KINDS:
        raise EvaluationError(f"kind={kind!r}: give one of {', '.join(KINDS)}")
    eval_set = Path(eval_set)
    if not eval_set.is_file():
        raise EvaluationError(f"no evaluation set at {eval_set}")
    items = read_items(eval_set, kind)[:limit]
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the set is a local file: never ask the hub
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    with tempfile.TemporaryDirectory() as folder:
        data_file = Path(folder) / "items.jsonl"
        data_file.write_text("".join(json.dumps(item) + "\n" for item in items))
        tasks = task_configs(data_file, kind, endpoint, likelihood)
        results = simple_evaluate(model=make_model(), tasks=tasks,
                                  task_manager=TaskManager(include_defaults=False), bootstrap_iters=100,
                                  log_samples=True, verbosity="ERROR")
    return _scores(results, kind, len(items))


def evaluate_checkpoint(checkpoint: str | Path, eval_set: str | Path, kind: Kind, limit: int | None = None,
                        device: str = "cpu") -> Scores:
    """``checkpoint`` scored on ``eval_set`` by the harness (the first ``limit`` items when given)."""
    return _evaluate(lambda: CheckpointLM(checkpoint, device=device), eval_set, kind, limit, endpoint=False)


def _tokenizer_folder(tokenizer: Path, folder: Path) -> Path:
    """``tokenizer`` (a tokenizer.json) in a folder that transformers reads as it is: the harness counts a context's
    tokens with it, and sends the text it decodes back, unchanged (no clean-up of spaces)."""
    if not tokenizer.is_file():
        raise EvaluationError(f"no tokenizer at {tokenizer}: give the model's tokenizer.json")
    shutil.copyfile(tokenizer, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                              "clean_up_tokenization_spaces": False}))
    return folder


def evaluate_endpoint(url: str, model: str, eval_set: str | Path, kind: Kind, limit: int | None = None,
                      api_key: str = "", tokenizer: str | Path | None = None) -> Scores:
    """The model ``model`` behind the OpenAI-compatible completions ``url`` scored on ``eval_set``: greedy answers
    of the text, and with the model's ``tokenizer`` the likeliest choice too (EvaluationError on a kind that cannot
    be scored so, or on a request the server refuses)."""
    import requests
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    with tempfile.TemporaryDirectory() as folder:
        counted = str(_tokenizer_folder(Path(tokenizer), Path(folder))) if tokenizer else None

        def endpoint_model():
            return LocalCompletionsAPI(base_url=url, model=model, tokenizer_backend="huggingface" if counted else None,
                                       tokenizer=counted, tokenized_requests=False, max_retries=1,
                                       header={"Authorization": f"Bearer {api_key}"} if api_key else None)
        try:
            return _evaluate(endpoint_model, eval_set, kind, limit, endpoint=True, likelihood=counted is not None)
        except requests.HTTPError as exc:
            answer = exc.response
            raise EvaluationError(f"{url} answered {answer.status_code}: {answer.text[:300]}") from None
        except requests.ConnectionError as exc:
            raise EvaluationError(f"{url} could not be reached: {exc}") from None


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.evaluate", description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--checkpoint", help="a checkpoint folder (checkpoints/step-<n>)")
    target.add_argument("--endpoint", help="an OpenAI-compatible completions URL (…/v1/completions); the key is "
                                           "read from OPENAI_API_KEY")
    parser.add_argument("--model", help="the model's name at --endpoint")
    parser.add_argument("--tokenizer", help="the endpoint's model's tokenizer.json: choices are scored by their "
                                            "log-likelihood too (the endpoint must return logprobs with echo)")
    parser.add_argument("--set", required=True, dest="eval_set", help="the evaluation set: JSONL, or text")
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--limit", type=int, default=None, help="the first N items only")
    parser.add_argument("--json", action="store_true", help="print the scores as one JSON line")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.endpoint and not args.model:
        parser.error("--endpoint needs --model: the name the endpoint serves the model under")
    try:
        if args.endpoint:
            scores = evaluate_endpoint(args.endpoint, args.model, args.eval_set, args.kind, args.limit,
                                       os.environ.get("OPENAI_API_KEY", ""), args.tokenizer)
        else:
            scores = evaluate_checkpoint(args.checkpoint, args.eval_set, args.kind, args.limit)
    except (EvaluationError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(scores.to_dict()))
    else:
        print(f"{scores.items} {scores.kind} items: " + ", ".join(f"{k} {v:.4f}" for k, v in scores.metrics.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
