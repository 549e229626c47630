"""A GPT-2 saved by transformers imports as a checkpoint that computes what transformers computes: the same logits,
the same greedy continuation, the same token ids; and folders that cannot be imported are refused, saying why."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

from deploy.__main__ import main as deploy_main
from deploy.hf_import import HFImportError, import_hf_gpt2
from trainer.checkpoint.consolidated import checkpoint_state, load_consolidated
from trainer.contract.manifest import FORMAT_CONSOLIDATED, read_manifest
from trainer.contract.presets import demo_text
from trainer.data.tokenizer import EOS
from trainer.generate import generate, load_model_from_checkpoint

TOKENIZER_VOCAB = 300  # 256 bytes, <|endoftext|>, 43 merges
SAMPLE = "ROMEO:\nWhat say'st thou, my dear nurse?<|endoftext|>First Citizen: Ünïcode — “quoted”\n"


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory) -> Path:
    """vocab.json + merges.txt of a byte-level BPE trained on 8 KB of Shakespeare, as GPT-2 ships them."""
    folder = tmp_path_factory.mktemp("bpe")
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator([demo_text(8_000).decode()], vocab_size=TOKENIZER_VOCAB, min_frequency=2,
                            special_tokens=[EOS], show_progress=False)
    bpe.save_model(str(folder))
    return folder


@pytest.fixture(scope="module")
def hf_model(tokenizer_files) -> GPT2LMHeadModel:
    """A random GPT-2 whose weights are large enough for logits far apart (greedy decoding without near-ties) and
    whose biases and norms are not the zeros and ones of a fresh model (a swapped one would show)."""
    eos = json.loads((tokenizer_files / "vocab.json").read_text())[EOS]
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=TOKENIZER_VOCAB,
                        bos_token_id=eos, eos_token_id=eos, initializer_range=0.3)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, hf_model, tokenizer_files) -> Path:
    """The folder save_pretrained writes (config.json, model.safetensors), with the tokenizer's files."""
    folder = tmp_path_factory.mktemp("hf") / "tiny-gpt2"
    hf_model.save_pretrained(folder)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(tokenizer_files / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def imported(tmp_path_factory, hf_folder) -> Path:
    return import_hf_gpt2(hf_folder, tmp_path_factory.mktemp("imported") / "step-0")


def _copy(folder: Path, to: Path, leave_out: tuple[str, ...] = ()) -> Path:
    shutil.copytree(folder, to, ignore=lambda _, names: [n for n in names if n in leave_out])
    return to


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_it_computes_the_logits_transformers_computes(imported, hf_model):
    model, _ = load_model_from_checkpoint(imported)
    ids = torch.randint(0, TOKENIZER_VOCAB, (3, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(ids), hf_model(ids).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    assert model.spec.activation == "gelu_tanh" and model.spec.tied_embeddings


def test_it_continues_a_prompt_greedily_as_transformers_does(imported, hf_model):
    model, tokenizer = load_model_from_checkpoint(imported)
    prompt = tokenizer.encode("ROMEO:\nWhat say")
    ours = generate(model, prompt, 20, temperature=0)
    # eos_token_id=None: transformers would otherwise stop at <|endoftext|> where generate goes on
    theirs = hf_model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=20, eos_token_id=None,
                               pad_token_id=tokenizer.eos_id)[0].tolist()
    assert ours == theirs
    assert len(set(ours[len(prompt):])) > 5  # a real continuation, not one token repeated


def test_it_writes_a_tokenizer_that_encodes_as_gpt2s_files_do(imported, hf_folder):
    _, tokenizer = load_model_from_checkpoint(imported)
    theirs = GPT2TokenizerFast.from_pretrained(str(hf_folder))
    ids = tokenizer.encode(SAMPLE)
    assert ids == theirs(SAMPLE)["input_ids"]
    assert tokenizer.decode(ids) == SAMPLE
    assert tokenizer.eos_id == theirs.convert_tokens_to_ids(EOS) and tokenizer.eos_id in ids
    assert tokenizer.vocab_size == TOKENIZER_VOCAB


def test_it_writes_a_weights_only_checkpoint_the_trainer_reads(imported, hf_folder):
    manifest = read_manifest(imported)
    assert (manifest.step, manifest.format, manifest.tokens_seen, manifest.world_size) == (0, FORMAT_CONSOLIDATED, 0,
                                                                                            1)
    assert manifest.run == "hf:tiny-gpt2" and Path(manifest.tokenizer) == (imported / "tokenizer.json").resolve()
    state = checkpoint_state(imported)
    assert state["head.weight"] is state["embed.tokens.weight"]  # stored once, tied again on load


def test_it_imports_a_pytorch_bin_in_the_old_hub_layout_to_the_same_weights(tmp_path, hf_folder, hf_model, imported):
    """Old hub files: pytorch_model.bin, no ``transformer.`` prefix, the causal-mask buffers beside the weights."""
    legacy = _copy(hf_folder, tmp_path / "legacy", leave_out=("model.safetensors",))
    state = {k.removeprefix("transformer."): v for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}
    for i in range(hf_model.config.n_layer):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64))
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, legacy / "pytorch_model.bin")
    from_bin = load_consolidated(import_hf_gpt2(legacy, tmp_path / "out"))
    from_safetensors = load_consolidated(imported)
    assert from_bin.keys() == from_safetensors.keys()
    assert all(torch.equal(from_bin[k], from_safetensors[k]) for k in from_bin)


def test_it_imports_weights_without_tokenizer_files_and_says_so(tmp_path, hf_folder, caplog):
    bare = _copy(hf_folder, tmp_path / "bare", leave_out=("vocab.json", "merges.txt"))
    with caplog.at_level(logging.WARNING, logger="deploy.hf_import"):
        target = import_hf_gpt2(bare, tmp_path / "out")
    assert read_manifest(target).tokenizer == "" and not (target / "tokenizer.json").exists()
    assert "without a tokenizer" in caplog.text
    model, tokenizer = load_model_from_checkpoint(target)
    assert tokenizer is None and model.spec.vocab_size == TOKENIZER_VOCAB


def test_it_refuses_a_folder_without_weights_naming_what_it_found(tmp_path, hf_folder):
    empty = _copy(hf_folder, tmp_path / "no-weights", leave_out=("model.safetensors",))
    with pytest.raises(HFImportError, match=r"no weights file \(model.safetensors or pytorch_model.bin\); found "
                                            r"config.json, generation_config.json, merges.txt, vocab.json"):
        import_hf_gpt2(empty, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_it_refuses_half_a_tokenizer_before_writing_anything(tmp_path, hf_folder):
    half = _copy(hf_folder, tmp_path / "half", leave_out=("merges.txt",))
    with pytest.raises(HFImportError, match="has vocab.json but no merges.txt: a byte-level BPE tokenizer needs both"):
        import_hf_gpt2(half, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_it_refuses_a_model_that_is_not_gpt2(tmp_path, hf_folder):
    llama = _copy(hf_folder, tmp_path / "llama")
    _edit_config(llama, model_type="llama")
    with pytest.raises(HFImportError, match="model_type='llama': only GPT-2"):
        import_hf_gpt2(llama, tmp_path / "out")
    with pytest.raises(HFImportError, match="has no config.json"):
        import_hf_gpt2(tmp_path, tmp_path / "out")


@pytest.mark.parametrize("changes, message", [
    (dict(n_embd=32), r"wte.weight has shape \[300, 64\] but config.json \(n_layer=2, n_embd=32"),
    (dict(n_layer=3), r"missing h.2.ln_1.weight, h.2.ln_1.bias, h.2.attn.c_attn.weight, h.2.attn.c_attn.bias "
                      r"and 8 more"),
    (dict(activation_function="relu"), r"activation_function='relu' is not supported: use one of 'gelu', "
                                       r"'gelu_new', 'gelu_pytorch_tanh'"),
    (dict(layer_norm_epsilon=1e-6), r"layer_norm_epsilon=1e-06 is not supported: .* uses 1e-05"),
    (dict(n_head=5), r"n_heads=5 does not divide d_model=64"),
])
def test_it_refuses_a_config_it_cannot_honour_saying_what_to_change(tmp_path, hf_folder, changes, message):
    changed = _copy(hf_folder, tmp_path / "changed")
    _edit_config(changed, **changes)
    with pytest.raises(HFImportError, match=message):
        import_hf_gpt2(changed, tmp_path / "out")


def test_it_imports_from_the_command_line_printing_one_json_line(tmp_path, hf_folder, hf_model, capsys):
    assert deploy_main(["import-hf", str(hf_folder), str(tmp_path / "out")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary == {"target": str((tmp_path / "out").resolve()), "parameters": hf_model.num_parameters(),
                       "vocab_size": TOKENIZER_VOCAB, "has_tokenizer": True}
    assert deploy_main(["import-hf", str(hf_folder), str(tmp_path / "out")]) == 2  # never over a checkpoint
    assert "not an empty folder" in capsys.readouterr().err
