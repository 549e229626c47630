"""A checkpoint evaluated by EleutherAI's lm-evaluation-harness (trainer.evaluate): the session's trained
Shakespeare checkpoint on multiple-choice items, on reference answers and on held-out text, each score checked
against what the model itself says, computed here without the harness."""
import json
import random
import re

import pytest
import torch
import torch.nn.functional as F

from tests.deploy_fixtures import TEXT_BYTES
from trainer.contract.presets import demo_text
from trainer.evaluate import EvaluationError, evaluate_checkpoint, main
from trainer.generate import generate, load_model_from_checkpoint

pytestmark = pytest.mark.slow


def _held_out_lines(count: int) -> list[str]:
    """Lines of the corpus past what the checkpoint trained on, of a dozen characters or more."""
    text = demo_text(TEXT_BYTES + 40_000).decode()[TEXT_BYTES:]
    return [line for line in text.split("\n") if len(line) >= 24][:count]


def _choice_items(count: int) -> list[dict]:
    """The first half of a line; its own second half against the same characters shuffled, twice."""
    rng, items = random.Random(0), []
    for line in _held_out_lines(count):
        cut = len(line) // 2
        head, tail = line[:cut], line[cut:]
        wrong = ["".join(rng.sample(tail, len(tail))) for _ in range(2)]
        choices = [tail, *wrong]
        rng.shuffle(choices)
        items.append({"question": head, "choices": choices, "answer": choices.index(tail)})
    return items


def _write(path, items):
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def _summed_logprob(model, tok, context: str, continuation: str) -> float:
    ctx = tok.encode(context)
    ids = tok.encode(context + continuation)
    with torch.no_grad():
        logprobs = F.log_softmax(model(torch.tensor([ids[:-1]])).float(), dim=-1)[0]
    return float(sum(logprobs[i - 1, ids[i]] for i in range(len(ctx), len(ids))))


def test_multiple_choice_accuracy_is_the_share_of_items_whose_right_choice_the_model_finds_likeliest(
        shakespeare_checkpoint, tmp_path):
    items = _choice_items(30)
    scores = evaluate_checkpoint(shakespeare_checkpoint, _write(tmp_path / "mc.jsonl", items), "choice")
    model, tok = load_model_from_checkpoint(shakespeare_checkpoint)
    # the harness asks for " <choice>" after "<question>\nAnswer:"
    picked = [max(range(3), key=lambda i: _summed_logprob(model, tok, f"{it['question']}\nAnswer:",
                                                          f" {it['choices'][i]}")) for it in items]
    expected = sum(p == it["answer"] for p, it in zip(picked, items)) / len(items)
    assert scores.items == 30 and scores.metrics["acc"] == pytest.approx(expected)
    assert scores.metrics["acc"] > 0.6  # Shakespeare's words against their own letters shuffled: chance is 1/3
    assert 0 <= scores.metrics["acc_stderr"] < 0.2 and 0 <= scores.metrics["acc_norm"] <= 1
    # and by the letter the model writes after the choices listed: its greedy line, the first capital standing alone
    answers, right = [], 0
    for it in items:
        listed = it["question"] + "\n" + "".join(f"{'ABC'[i]}. {c}\n" for i, c in enumerate(it["choices"])) + "Answer:"
        ids = tok.encode(listed)[-(model.spec.seq_len - 1):]  # within the model's context, as its answer
        budget = min(8, model.spec.seq_len - len(ids))
        answer = tok.decode(generate(model, ids, budget, temperature=0.0)[len(ids):]).split("\n")[0]
        letter = re.search(r"\b([A-Z])\b", answer)
        answers.append(answer)
        right += bool(letter) and letter.group(1) == "ABC"[it["answer"]]
    assert list(scores.answers) == answers and any(answers)
    assert scores.metrics["acc_generated"] == pytest.approx(right / len(items))


def test_a_reference_answer_is_matched_against_the_models_greedy_continuation_to_the_line_end(
        shakespeare_checkpoint, tmp_path):
    model, tok = load_model_from_checkpoint(shakespeare_checkpoint)
    items = []
    for line in _held_out_lines(8):
        prompt = line[:12]
        ids = tok.encode(prompt)
        said = tok.decode(generate(model, ids, 40, temperature=0.0)[len(ids):]).split("\n")[0]
        items.append({"prompt": prompt, "reference": said if len(items) % 2 == 0 else said + " nay"})
    scores = evaluate_checkpoint(shakespeare_checkpoint, _write(tmp_path / "ref.jsonl", items), "reference")
    assert scores.metrics["exact_match"] == pytest.approx(0.5)  # the model's own answers, half of them spoilt


def test_held_out_text_has_the_perplexity_of_a_model_that_learned_it(shakespeare_checkpoint, tmp_path):
    text = "\n\n".join(_held_out_lines(40))
    (tmp_path / "held-out.txt").write_text(text)
    scores = evaluate_checkpoint(shakespeare_checkpoint, tmp_path / "held-out.txt", "text")
    # ≈ 25 per token was seen after training; a byte is a fraction of a token, so well under the 256 of no model
    assert 1 < scores.metrics["byte_perplexity"] < 8 and scores.metrics["bits_per_byte"] < 3
    assert scores.items == 40


def test_a_bad_set_is_refused_naming_its_line(shakespeare_checkpoint, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "choices": ["b", "c"], "answer": 0}\n{"question": "a", "choices": ["b"]}\n')
    with pytest.raises(EvaluationError, match="bad.jsonl:2: a choice item needs question, choices, answer; answer "
                                              "missing"):
        evaluate_checkpoint(shakespeare_checkpoint, bad, "choice")
    assert main(["--checkpoint", str(shakespeare_checkpoint), "--set", str(bad), "--kind", "choice"]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err
