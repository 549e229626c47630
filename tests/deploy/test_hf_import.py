"""A model saved by transformers (GPT-2, Llama with Llama 3.1's rope scaling, Qwen2, Mixtral, Qwen2-MoE) imports as a
checkpoint that computes what transformers computes: the same logits, the same greedy continuation, the same token
ids and chat template; and folders that cannot be imported are refused, naming the field."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

from deploy.__main__ import main as deploy_main
from deploy.hf_import import HFImportError, import_hf, import_hf_gpt2
from tests.deploy.hf_families import BOS, CHAT_TEMPLATE, END, FAMILIES, hf_model as family_model, save_family
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
    with pytest.raises(HFImportError, match=r"no weights file \(model.safetensors, model.safetensors.index.json, "
                                            r"pytorch_model.bin or pytorch_model.bin.index.json\); found "
                                            r"config.json, generation_config.json, merges.txt, vocab.json"):
        import_hf_gpt2(empty, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_it_refuses_half_a_tokenizer_before_writing_anything(tmp_path, hf_folder):
    half = _copy(hf_folder, tmp_path / "half", leave_out=("merges.txt",))
    with pytest.raises(HFImportError, match="has vocab.json but no merges.txt: a byte-level BPE tokenizer needs both"):
        import_hf_gpt2(half, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_it_refuses_a_model_of_another_family(tmp_path, hf_folder):
    bert = _copy(hf_folder, tmp_path / "bert")
    _edit_config(bert, model_type="bert")
    with pytest.raises(HFImportError, match="model_type='bert' cannot be imported: supported are 'gpt2', 'llama', "
                                            "'qwen2', 'mixtral', 'qwen2_moe'"):
        import_hf_gpt2(bert, tmp_path / "out")
    with pytest.raises(HFImportError, match="has no config.json"):
        import_hf_gpt2(tmp_path, tmp_path / "out")


@pytest.mark.parametrize("changes, message", [
    (dict(n_embd=32), r"transformer.wte.weight has shape \[300, 64\] but config.json \(n_layers=2, d_model=32"),
    (dict(n_layer=3), r"missing transformer.h.2.ln_1.weight, transformer.h.2.ln_1.bias, "
                      r"transformer.h.2.attn.c_attn.weight, transformer.h.2.attn.c_attn.bias and 8 more"),
    (dict(activation_function="relu"), r"activation_function='relu' is not supported: use one of 'gelu', "
                                       r"'gelu_new', 'gelu_pytorch_tanh'"),
    (dict(scale_attn_by_inverse_layer_idx=True), r"scale_attn_by_inverse_layer_idx=True is not supported"),
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
    assert summary == {"target": str((tmp_path / "out").resolve()), "model_type": "gpt2", "dtype": "float32",
                       "parameters": hf_model.num_parameters(), "vocab_size": TOKENIZER_VOCAB, "has_tokenizer": True,
                       "has_chat_template": False}
    assert deploy_main(["import-hf", str(hf_folder), str(tmp_path / "out")]) == 2  # never over a checkpoint
    assert "not an empty folder" in capsys.readouterr().err


# --- every family: a tiny random model of each, made and saved by transformers --------------------------------------

@pytest.fixture(scope="module")
def family_folders(tmp_path_factory) -> dict[str, tuple]:
    """family → (the transformers model, the folder it was saved to with its tokenizer)."""
    root = tmp_path_factory.mktemp("families")
    models = {family: family_model(family) for family in FAMILIES}
    return {family: (model, save_family(family, model, root / f"tiny-{family}")) for family, model in models.items()}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, family_folders, tmp_path_factory):
    """(family, transformers model, its folder, the checkpoint imported from it)."""
    model, folder = family_folders[request.param]
    return request.param, model, folder, import_hf(folder, tmp_path_factory.mktemp("imported") / "step-0")


def test_each_family_computes_the_logits_transformers_computes(family):
    name, hf, _, checkpoint = family
    model, _ = load_model_from_checkpoint(checkpoint)
    ids = torch.randint(0, TOKENIZER_VOCAB, (3, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    assert theirs.std() > 1  # logits far apart: the comparison is not between near-zero numbers


def test_each_family_continues_a_prompt_greedily_as_transformers_does(family):
    name, hf, _, checkpoint = family
    model, tokenizer = load_model_from_checkpoint(checkpoint)
    prompt = tokenizer.encode("ROMEO:\nWhat say")
    ours = generate(model, prompt, 20, temperature=0)
    # eos_token_id=None: transformers would otherwise stop at the end-of-text token where generate goes on
    theirs = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=20, eos_token_id=None, pad_token_id=0)[0].tolist()
    assert ours == theirs
    assert len(set(ours[len(prompt):])) > 5  # a real continuation, not one token repeated


def test_each_family_records_its_shape_in_the_spec(family):
    name, hf, _, checkpoint = family
    spec = read_manifest(checkpoint).model_spec()
    assert spec.family == {"gpt2": "gpt", "qwen2_moe": "qwen2-moe"}.get(name, name)
    expected = {
        "gpt2": dict(norm="layernorm", norm_eps=1e-6, positions="learned", activation="gelu_tanh", bias=True),
        "llama": dict(norm="rmsnorm", norm_eps=1e-5, positions="rope", activation="swiglu", n_kv_heads=2,
                      rope_base=500000.0, ffn_hidden=96, tied_embeddings=False),
        "qwen2": dict(has_qkv_bias=True, has_attention_out_bias=False, tied_embeddings=True, norm_eps=1e-6),
        "mixtral": dict(n_experts=4, top_k=2, capacity_factor=0.0, renormalizes_topk=True, moe_ffn=96),
        "qwen2_moe": dict(n_experts=4, capacity_factor=0.0, renormalizes_topk=False, moe_ffn=48, ffn=96,
                          shared_expert_ffn=80, shared_expert_gate=True, first_dense_layers=1, moe_layers=(1, 2)),
    }[name]
    assert {k: getattr(spec, k) for k in expected} == expected
    if name == "llama":
        scaling = spec.rope_scaling
        assert (scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor,
                scaling.original_max_positions) == (8.0, 1.0, 4.0, 32)


def test_each_family_keeps_its_tokenizer_and_chat_template(family):
    name, _, folder, checkpoint = family
    _, tokenizer = load_model_from_checkpoint(checkpoint)
    theirs = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer.encode(SAMPLE) == theirs(SAMPLE)["input_ids"]
    assert tokenizer.eos_id == theirs.convert_tokens_to_ids(EOS if name == "gpt2" else END)
    assert json.loads((checkpoint / "hf" / "import.json").read_text())["model_type"] == name
    if name != "gpt2":  # GPT-2's vocab.json + merges.txt have no tokenizer_config.json
        kept = json.loads((checkpoint / "tokenizer_config.json").read_text())
        assert kept["chat_template"] == CHAT_TEMPLATE and kept["eos_token"] == END


def test_it_imports_sharded_weights_to_the_same_checkpoint(tmp_path, family_folders, tmp_path_factory):
    hf, folder = family_folders["mixtral"]
    sharded = tmp_path / "sharded"
    save_family("mixtral", hf, sharded, max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file() and not (sharded / "model.safetensors").exists()
    from_shards = load_consolidated(import_hf(sharded, tmp_path / "a"))
    whole = load_consolidated(import_hf(folder, tmp_path / "b"))
    assert from_shards.keys() == whole.keys() and all(torch.equal(from_shards[k], whole[k]) for k in whole)


@pytest.mark.parametrize("name, changes, message", [
    ("llama", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
     r"rope_scaling.rope_type='yarn' is not supported: use 'default' or 'llama3'"),
    ("llama", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), r"rope_type 'llama3' lacks low_freq_factor"),
    ("llama", dict(hidden_act="gelu"), r"hidden_act='gelu' is not supported"),
    ("llama", dict(head_dim=32), r"head_dim=32 is not hidden_size/num_attention_heads=64/4"),
    ("mixtral", dict(sliding_window=4096), r"sliding_window=4096 is not supported: .* set it to null"),
    ("qwen2", dict(use_sliding_window=True, sliding_window=16), r"use_sliding_window=true is not supported"),
    ("qwen2_moe", dict(mlp_only_layers=[1]), r"mlp_only_layers=\[1\] with decoder_sparse_step=1 is not supported: "
                                             r".* experts would be on layers \[0, 2\]"),
    ("qwen2_moe", dict(num_experts=3), r"model.layers.1.mlp.experts.3.gate_proj.weight"),  # unexpected tensors
])
def test_it_refuses_what_a_family_config_asks_that_it_cannot_compute(tmp_path, family_folders, name, changes, message):
    changed = _copy(family_folders[name][1], tmp_path / "changed")
    _edit_config(changed, **changes)
    with pytest.raises(HFImportError, match=message):
        import_hf(changed, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_command_line_says_why_it_refuses_in_one_line_with_status_2(tmp_path, family_folders, capsys):
    changed = _copy(family_folders["mixtral"][1], tmp_path / "changed")
    _edit_config(changed, sliding_window=4096)
    assert deploy_main(["import-hf", str(changed), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: sliding_window=4096 is not supported")
    assert deploy_main(["import-hf", str(family_folders["mixtral"][1]), str(tmp_path / "ok")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["model_type"] == "mixtral"
    assert "import-hf: reading model.safetensors" in captured.err  # progress lines for a worker's log


def test_the_command_line_reports_a_torn_weights_file_in_one_line_with_status_1(tmp_path, hf_folder, capsys):
    torn = _copy(hf_folder, tmp_path / "torn")
    (torn / "model.safetensors").write_bytes((hf_folder / "model.safetensors").read_bytes()[:1000])
    assert deploy_main(["import-hf", str(torn), str(tmp_path / "out")]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and err[0].startswith("error: the import failed: ")
    assert not (tmp_path / "out").exists()
