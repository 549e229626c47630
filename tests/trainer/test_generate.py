"""Generation with a KV cache gives what recomputing the whole prefix gives, and loads any plan's checkpoint."""
import pytest
import torch

from trainer.generate import generate, generate_stream, load_model_from_checkpoint
from trainer.model import build_model
from trainer.contract.presets import MODELS


def _greedy_without_cache(model, ids, n):
    ids = list(ids)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids


@pytest.mark.parametrize("kw", [dict(), dict(positions="rope", n_kv_heads=2)])
def test_it_generates_with_the_cache_as_without(kw):
    model = build_model(MODELS["tiny"].replace(**kw), 3).eval()
    assert generate(model, [5, 6, 7], 30, temperature=0) == _greedy_without_cache(model, [5, 6, 7], 30)


def test_it_slides_past_the_context_window():
    model = build_model(MODELS["tiny"].replace(seq_len=16), 3).eval()
    out = generate(model, list(range(10)), 30, temperature=0)
    assert len(out) == 40


def test_it_samples_reproducibly_from_a_seed():
    model = build_model(MODELS["tiny"], 3).eval()
    a = generate(model, [1, 2], 20, temperature=0.9, top_k=40, top_p=0.9, seed=11)
    b = generate(model, [1, 2], 20, temperature=0.9, top_k=40, top_p=0.9, seed=11)
    assert a == b and len(a) == 22
    assert all(0 <= t < 512 for t in a)


def test_it_stops_at_eos():
    model = build_model(MODELS["tiny"], 3).eval()
    first = next(generate_stream(model, [1, 2], 5, temperature=0))
    assert list(generate_stream(model, [1, 2], 5, temperature=0, eos_id=first)) == [first]


def test_it_keeps_only_the_top_k():
    from trainer.generate import _pick

    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0]])
    picks = {int(_pick(logits, 1.0, 2, 1.0, torch.Generator().manual_seed(i))) for i in range(50)}
    assert picks <= {1, 2}
    assert {int(_pick(logits, 1.0, 0, 0.5, torch.Generator().manual_seed(i))) for i in range(50)} == {1}


@pytest.mark.slow
def test_it_loads_a_checkpoint_written_by_two_fsdp_ranks(two_rank_runs, single_rank_runs):
    from trainer.contract.manifest import complete_checkpoints

    step, folder = complete_checkpoints(two_rank_runs / "resume-fsdp2-to-dp1")[0]
    assert step == 5  # written by the two FSDP ranks when they stopped
    model, tokenizer = load_model_from_checkpoint(folder)
    assert tokenizer is not None
    ids = generate(model, tokenizer.encode("ROMEO:"), 10, temperature=0)
    assert len(ids) > 10 and isinstance(tokenizer.decode(ids), str)
    # the dp shards were gathered into the whole weights one process reaches after the same 5 steps
    step, one_process = complete_checkpoints(single_rank_runs / "resume-split")[0]
    same, _ = load_model_from_checkpoint(one_process)
    assert step == 5
    for (name, a), b in zip(model.named_parameters(), same.parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), name  # weights are O(0.02)


@pytest.mark.slow
def test_it_generates_from_the_command_line(single_rank_runs):
    import subprocess

    from tests.trainer.launch import PYTHON, REPO, _env
    from trainer.contract.manifest import latest_checkpoint

    folder = latest_checkpoint(single_rank_runs / "resume-split")
    done = subprocess.run([PYTHON, "-m", "trainer.generate", "--checkpoint", str(folder), "--prompt", "ROMEO:",
                           "--max-new-tokens", "8", "--temperature", "0.8", "--top-k", "50", "--seed", "1"],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ROMEO:") and len(done.stdout) > len("ROMEO:\n")
