"""A checkpoint exports as a folder transformers' from_pretrained loads and computes the same logits from: imported
models of every family come back bit for bit (tensors, names, dtype, tokenizer, chat template), checkpoints the
trainer wrote come with their own tokenizer, whatever plan saved them (tensor × uneven pipeline stages, FSDP2 ×
context parallel), and specs no Hugging Face class computes are refused naming the field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from deploy.__main__ import main as deploy_main
from deploy.hf_export import HFExportError, export_hf
from deploy.hf_import import import_hf
from deploy.hf_layout import LayoutError, config_from_spec, spec_from_config
from tests.deploy.hf_families import CHAT_TEMPLATE, FAMILIES, VOCAB, hf_model, save_family
from tests.trainer.launch import launch, tiny_spec
from trainer.checkpoint.consolidated import write_consolidated
from trainer.contract import DatasetSpec, ParallelPlan
from trainer.contract.manifest import FORMAT_CONSOLIDATED, CheckpointManifest, model_differences, read_manifest, \
    step_dir
from trainer.contract.presets import MODELS
from trainer.generate import load_model_from_checkpoint
from trainer.model import build_model

SHARD_BYTES = 64_000  # the tiny models are 0.3 to 1 MB: several shards each
TEXT = "ROMEO:\nWhat say'st thou, my dear nurse?"


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face folder's safetensors files (one file or shards)."""
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request, tmp_path_factory):
    """(family, transformers model, its saved folder, the folder export-hf wrote from its import, in shards)."""
    root = tmp_path_factory.mktemp(request.param)
    model = hf_model(request.param)
    source = save_family(request.param, model, root / f"tiny-{request.param}")
    checkpoint = import_hf(source, root / "checkpoint")
    export_hf(checkpoint, root / "exported", max_shard_bytes=SHARD_BYTES)
    return request.param, model, source, root / "exported"


def test_each_family_loads_in_transformers_and_computes_the_same_logits(exported):
    _, model, _, folder = exported
    loaded = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    assert type(loaded) is type(model)
    ids = torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_import_then_export_gives_back_every_tensor_bit_for_bit(exported):
    _, _, source, folder = exported
    before, after = tensors(source), tensors(folder)
    assert before.keys() == after.keys()
    for name, tensor in before.items():
        assert after[name].dtype == tensor.dtype and torch.equal(after[name], tensor), name
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(after) and len(set(index["weight_map"].values())) > 1
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in after.values())


def test_the_config_and_tokenizer_come_back(exported):
    family, _, source, folder = exported
    theirs, ours = (json.loads((f / "config.json").read_text()) for f in (source, folder))
    assert ours["model_type"] == theirs["model_type"] == family
    assert ours["architectures"] == theirs["architectures"]
    assert (ours["bos_token_id"], ours["eos_token_id"]) == (theirs["bos_token_id"], theirs["eos_token_id"])
    original = AutoTokenizer.from_pretrained(str(source))
    exported_tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert exported_tokenizer(TEXT)["input_ids"] == original(TEXT)["input_ids"]
    if family != "gpt2":
        chat = [{"role": "user", "content": "What say'st thou?"}]
        assert exported_tokenizer.chat_template == CHAT_TEMPLATE
        assert exported_tokenizer.apply_chat_template(chat, add_generation_prompt=True) == \
            original.apply_chat_template(chat, add_generation_prompt=True)


def test_a_bfloat16_model_comes_back_in_bfloat16_bit_for_bit(tmp_path):
    source = save_family("llama", hf_model("llama").to(torch.bfloat16), tmp_path / "bf16")
    checkpoint = import_hf(source, tmp_path / "checkpoint")
    result = export_hf(checkpoint, tmp_path / "out")
    before, after = tensors(source), tensors(tmp_path / "out")
    assert result["dtype"] == "bfloat16" and result["shards"] == 1
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert not (tmp_path / "out" / "model.safetensors.index.json").exists()
    assert all(after[n].dtype == torch.bfloat16 and torch.equal(after[n], t) for n, t in before.items())
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    export_hf(checkpoint, tmp_path / "fp32", dtype="float32")
    assert all(t.dtype == torch.float32 for t in tensors(tmp_path / "fp32").values())


def test_a_trained_checkpoint_exports_with_its_own_tokenizer(shakespeare_checkpoint, tmp_path):
    """The trainer's GPT (native engine, its byte-level BPE): transformers' GPT-2 computes its logits and its
    tokenizer encodes as the checkpoint's."""
    result = export_hf(shakespeare_checkpoint, tmp_path / "out")
    assert (result["model_type"], result["dtype"], result["has_tokenizer"]) == ("gpt2", "float32", True)
    ours, tokenizer = load_model_from_checkpoint(shakespeare_checkpoint)
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    ids = torch.tensor([tokenizer.encode(TEXT)])
    with torch.no_grad():
        assert (ours(ids) - theirs(ids).logits).abs().max().item() < 1e-4
    hf_tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert hf_tokenizer(TEXT + "<|endoftext|>")["input_ids"] == tokenizer.encode(TEXT + "<|endoftext|>")
    assert hf_tokenizer.eos_token_id == tokenizer.eos_id == theirs.config.eos_token_id


def _checkpoint(folder: Path, spec) -> Path:
    """A weights-only checkpoint of ``spec`` with seeded weights and no tokenizer."""
    folder.mkdir(parents=True)
    write_consolidated(build_model(spec, seed=0).state_dict(), folder / "consolidated.safetensors")
    CheckpointManifest(step=0, format=FORMAT_CONSOLIDATED, tokens_seen=0, model=spec.to_dict(),
                       plan=ParallelPlan().to_dict(), world_size=1, tokenizer="", seed=0,
                       consolidated="consolidated.safetensors").write(folder)
    return folder


@pytest.mark.parametrize("changes, message", [
    (dict(positions="rope"), r"positions='rope' cannot be exported as a GPT2LMHeadModel \(gpt family\): GPT-2 has "
                             r"learned positions"),
    (dict(n_experts=4), r"n_experts=4 cannot be exported as a GPT2LMHeadModel"),
    (dict(n_kv_heads=2), r"n_kv_heads=2 cannot be exported .*no grouped-query attention"),
    (dict(activation="swiglu", norm="rmsnorm"), r"positions='learned' cannot be exported as a LlamaForCausalLM"),
])
def test_a_spec_no_transformers_class_computes_is_refused_naming_the_field(tmp_path, changes, message):
    checkpoint = _checkpoint(tmp_path / "step-0", MODELS["tiny"].replace(n_layers=1, **changes))
    with pytest.raises(HFExportError, match=message):
        export_hf(checkpoint, tmp_path / "out")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["step-0"]


@pytest.mark.parametrize("preset, changes, message", [
    ("tiny-mixtral", dict(moe_every=2), r"moe_every=2, first_dense_layers=0 cannot be exported as a "
                                        r"MixtralForCausalLM"),
    ("tiny-mixtral", dict(topk_norm="none"), r"topk_norm='none' cannot be exported"),
    ("tiny-qwen-moe", dict(shared_expert_gate=False), r"shared_expert_gate=false cannot be exported as a "
                                                      r"Qwen2MoeForCausalLM"),
    ("tiny-llama", dict(attention_bias=True, qkv_bias=False), r"attention_bias cannot be exported as a "
                                                              r"LlamaForCausalLM"),
])
def test_a_family_member_transformers_cannot_express_is_refused(tmp_path, preset, changes, message):
    spec = MODELS[preset].replace(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, vocab_size=64, **changes)
    with pytest.raises(HFExportError, match=message):
        export_hf(_checkpoint(tmp_path / "step-0", spec), tmp_path / "out")


def test_the_command_line_prints_progress_and_one_json_line_and_never_writes_over_a_folder(tmp_path, capsys):
    spec = MODELS["tiny-qwen-moe"].replace(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, vocab_size=64)
    checkpoint = _checkpoint(tmp_path / "step-0", spec)
    out = tmp_path / "out"
    assert deploy_main(["export-hf", str(checkpoint), str(out), "--max-shard-size", "50KB", "--dtype",
                        "bfloat16"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert (result["model_type"], result["dtype"], result["has_tokenizer"]) == ("qwen2_moe", "bfloat16", False)
    assert result["shards"] == len(list(out.glob("model-*-of-*.safetensors"))) > 1
    assert "export-hf: writing shard 1/" in captured.err and "no tokenizer" in captured.err
    loaded = AutoModelForCausalLM.from_pretrained(str(out))
    assert loaded.dtype == torch.bfloat16 and loaded.config.decoder_sparse_step == 1
    capsys.readouterr()  # transformers' own progress bars
    assert deploy_main(["export-hf", str(checkpoint), str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {out} exists: give a new folder, or --overwrite to replace it"]
    assert deploy_main(["export-hf", str(checkpoint), str(out), "--overwrite"]) == 0
    assert (out / "model.safetensors").is_file() and not list(out.glob("model-*"))  # replaced whole
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # nothing left beside it
    assert deploy_main(["export-hf", str(tmp_path), str(tmp_path / "x")]) == 2
    assert "has no manifest.json" in capsys.readouterr().err


@pytest.mark.parametrize("preset", sorted(MODELS))
def test_every_preset_transformers_can_express_comes_back_from_its_config_as_the_same_model(preset):
    """config.json written from a preset and read back gives the preset's spec field for field (what a run's
    init_from compares), but for the training-only fields; tiny-mixtral's dense width, which no layer of it uses,
    is Mixtral's expert width."""
    spec = MODELS[preset]
    if preset == "tiny-moe":  # GPT-2 blocks with experts
        with pytest.raises(LayoutError, match="n_experts=4 cannot be exported as a GPT2LMHeadModel"):
            config_from_spec(spec, "float32")
        return
    config, _ = config_from_spec(spec, "bfloat16")
    back = spec_from_config(config, name=spec.name)
    if preset == "tiny-mixtral":
        assert model_differences(back.to_dict(), spec) == ["ffn_hidden", "moe_ffn_hidden"]
        assert back.moe_ffn == spec.moe_ffn
    else:
        assert model_differences(back.to_dict(), spec) == []
    assert back.moe_layers == spec.moe_layers and back.family == spec.family


def test_qwen2_moe_sparse_steps_and_dense_layers_map_both_ways():
    """decoder_sparse_step 2 with layer 1 dense (mlp_only_layers) puts experts on layer 3 of 4 alone: moe_every 2
    after 2 dense layers here; written back, transformers' rule gives the same layers."""
    config = {"model_type": "qwen2_moe", "num_hidden_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
              "num_key_value_heads": 2,
              "intermediate_size": 64, "vocab_size": 64, "num_experts": 4, "decoder_sparse_step": 2,
              "mlp_only_layers": [1]}
    spec = spec_from_config(config)
    assert (spec.moe_every, spec.first_dense_layers, spec.moe_layers) == (2, 2, (3,))
    written, _ = config_from_spec(spec, "float32")
    step, dense = written["decoder_sparse_step"], written["mlp_only_layers"]
    assert [i for i in range(4) if i not in dense and (i + 1) % step == 0] == [3]


# --- checkpoints of parallel plans -----------------------------------------------------------------------------------

PARALLEL_STEPS = 4
# name → (model, plan): tp2 × pp2 with the 3 layers as stages of (2, 1); FSDP2 over dp2 × cp2
PARALLEL_PLANS = {
    "llama-tp2-pp2-2-1": (MODELS["tiny-llama"].replace(n_layers=3), dict(tp=2, pp=2, stage_layers=(2, 1))),
    "mixtral-tp2-pp2-2-1": (MODELS["tiny-mixtral"].replace(n_layers=3), dict(tp=2, pp=2, stage_layers=(2, 1))),
    "llama-fsdp-dp2-cp2": (MODELS["tiny-llama"], dict(dp=2, cp=2, zero_stage=3)),
}


@pytest.fixture(scope="module")
def parallel_runs(shakespeare_checkpoint, tmp_path_factory) -> Path:
    """PARALLEL_STEPS steps of each plan, one 4-rank launch, on the Shakespeare fixture's prepared dataset (its
    512-token BPE), each saving its last step."""
    root = shakespeare_checkpoint.parents[2]
    dataset = DatasetSpec(path=str(root / "shakespeare.txt"), prepared_dir=str(root / "prepared"))
    runs = tmp_path_factory.mktemp("parallel-runs")
    jobs = [{"spec": tiny_spec(runs / name, dataset, PARALLEL_STEPS, model=model, micro_batch=2, global_batch=8,
                               checkpoint_every=PARALLEL_STEPS, **plan),
             "run_dir": runs / name, "resume": False, "stop_at": 0}
            for name, (model, plan) in PARALLEL_PLANS.items()]
    launch(4, jobs, runs / "jobs")
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PARALLEL_PLANS))
def test_a_checkpoint_of_a_parallel_plan_exports_to_what_the_trainer_computes(parallel_runs, tmp_path, name):
    checkpoint = step_dir(parallel_runs / name, PARALLEL_STEPS)
    manifest = read_manifest(checkpoint)
    assert manifest.world_size == 4 and manifest.format != FORMAT_CONSOLIDATED  # the engine's own shards
    saved_by = ParallelPlan.from_dict(manifest.plan)
    assert {k: getattr(saved_by, k) for k in PARALLEL_PLANS[name][1]} == PARALLEL_PLANS[name][1]
    result = export_hf(checkpoint, tmp_path / "out", max_shard_bytes=SHARD_BYTES)
    assert result["model_type"] == ("mixtral" if name.startswith("mixtral") else "llama") and result["shards"] > 1
    ours, tokenizer = load_model_from_checkpoint(checkpoint)
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    ids = torch.tensor([tokenizer.encode(TEXT * 2)[:64]])
    with torch.no_grad():
        ours_logits, their_logits = ours(ids), theirs(ids).logits
    assert (ours_logits - their_logits).abs().max().item() < 1e-4
    assert their_logits.std() > 0.05  # not the near-zero logits of an empty model
    assert AutoTokenizer.from_pretrained(str(tmp_path / "out"))(TEXT)["input_ids"] == tokenizer.encode(TEXT)
