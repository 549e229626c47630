"""The TensorRT-LLM entry's text: from a Hugging Face folder (or a checkpoint, exported on the way) it writes
config.pbtxt for the Python backend and model.yaml with the LLM's arguments taken from the model and the options,
the Hugging Face folder inside the entry, TensorRT-LLM's backend files when given; what cannot be served is refused
before anything is written. Serving it needs a GPU and TensorRT-LLM, which this machine has not."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from transformers import AutoConfig

from deploy.__main__ import main as deploy_main
from deploy.hf_export import export_hf
from deploy.trtllm_entry import TrtllmEntryError, TrtllmOptions, write_trtllm_entry
from trainer.checkpoint.consolidated import write_consolidated
from trainer.contract import ModelSpec, ParallelPlan
from trainer.contract.manifest import FORMAT_CONSOLIDATED, CheckpointManifest
from trainer.model import build_model

# GPT-2 layout, head_dim 64 (what TensorRT-LLM's and vLLM's attention kernels take)
SPEC = ModelSpec(name="trt", n_layers=2, d_model=128, n_heads=2, seq_len=96, vocab_size=320)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("trtllm") / "step-0"
    folder.mkdir()
    write_consolidated(build_model(SPEC, seed=0).state_dict(), folder / "consolidated.safetensors")
    CheckpointManifest(step=0, format=FORMAT_CONSOLIDATED, tokens_seen=0, model=SPEC.to_dict(),
                       plan=ParallelPlan().to_dict(), world_size=1, tokenizer="", seed=0,
                       consolidated="consolidated.safetensors").write(folder)
    return folder


@pytest.fixture(scope="module")
def hf_folder(checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hf") / "model"
    export_hf(checkpoint, out, dtype="bfloat16")
    return out


def _pbtxt_fields(text: str) -> dict[str, list[str]]:
    """key → values of config.pbtxt's top-level ``key: value`` lines and the names of its inputs and outputs."""
    fields: dict[str, list[str]] = {}
    section = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith("[") and stripped[:-1].strip() in ("input", "output", "instance_group"):
            section = stripped[:-1].strip()
        elif stripped == "]":
            section = None
        elif section and "name:" in stripped:
            fields.setdefault(section, []).append(stripped.split('name: "')[1].split('"')[0])
        elif section == "instance_group":
            fields.setdefault(section, []).append(stripped)
        elif ":" in stripped and not stripped.startswith("#"):
            key, value = stripped.split(":", 1)
            fields.setdefault(key.strip(), []).append(value.strip().strip('"'))
    return fields


def test_the_entry_holds_config_pbtxt_model_yaml_and_the_hf_folder_with_the_models_fields(hf_folder, tmp_path):
    options = TrtllmOptions(name="gpt-trt", tensor_parallel=2, max_batch_size=48)
    report = write_trtllm_entry(hf_folder, tmp_path / "models", options)
    entry = tmp_path / "models" / "gpt-trt"
    assert report["path"] == str(entry.resolve()) and report["backend_files"] is False
    assert sorted(p.name for p in entry.iterdir()) == ["1", "config.pbtxt"]
    assert sorted(p.name for p in (entry / "1").iterdir()) == ["hf", "model.yaml"]
    assert sorted(p.name for p in (entry / "1" / "hf").iterdir()) == sorted(p.name for p in hf_folder.iterdir())

    arguments = yaml.safe_load((entry / "1" / "model.yaml").read_text())
    assert arguments == report["arguments"]
    assert arguments["model"] == str((entry / "1" / "hf").resolve())
    assert arguments["backend"] == "pytorch"
    assert arguments["tensor_parallel_size"] == 2 and arguments["pipeline_parallel_size"] == 1
    assert arguments["max_batch_size"] == 48
    assert arguments["dtype"] == "bfloat16"  # the folder's own half precision
    assert arguments["max_seq_len"] == SPEC.seq_len
    assert arguments["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    # what model.yaml says agrees with the folder transformers reads
    config = AutoConfig.from_pretrained(arguments["model"])
    assert config.n_head % arguments["tensor_parallel_size"] == 0 and config.n_positions == arguments["max_seq_len"]

    pbtxt = _pbtxt_fields((entry / "config.pbtxt").read_text())
    assert pbtxt["name"] == ["gpt-trt"] and pbtxt["backend"] == ["python"]
    # batching and streaming are model.yaml's: the backend sets them at load, which a value in config.pbtxt would stop
    assert "max_batch_size" not in pbtxt and "model_transaction_policy" not in (entry / "config.pbtxt").read_text()
    assert pbtxt["instance_group"] == ["{ kind: KIND_CPU count: 1 }"]
    assert pbtxt["input"][0] == "text_input" and {"streaming", "sampling_param_max_tokens"} <= set(pbtxt["input"])
    assert pbtxt["output"] == ["text_output", "finish_reason"]


def test_options_set_the_dtype_context_streaming_model_path_and_copy_the_backend_files(hf_folder, tmp_path):
    backend = tmp_path / "llmapi" / "1"
    backend.mkdir(parents=True)
    for name in ("model.py", "helpers.py"):
        (backend / name).write_text(f"# TensorRT-LLM's {name}\n")
    options = TrtllmOptions(name="m", dtype="float16", max_seq_len=64, streaming=False,
                            model_path="/models/m/1/hf")
    write_trtllm_entry(hf_folder, tmp_path / "repo", options, backend_files=backend)
    version = tmp_path / "repo" / "m" / "1"
    assert (version / "model.py").read_text() == "# TensorRT-LLM's model.py\n"
    assert (version / "helpers.py").is_file()
    arguments = yaml.safe_load((version / "model.yaml").read_text())
    assert (arguments["dtype"], arguments["max_seq_len"], arguments["model"]) == ("float16", 64, "/models/m/1/hf")
    assert arguments["triton_config"]["decoupled"] is False


def test_a_float32_checkpoint_is_exported_on_the_way_and_served_in_bfloat16(checkpoint, tmp_path):
    write_trtllm_entry(checkpoint, tmp_path / "repo", TrtllmOptions(name="from-ckpt"))
    version = tmp_path / "repo" / "from-ckpt" / "1"
    assert json.loads((version / "hf" / "config.json").read_text())["model_type"] == "gpt2"
    arguments = yaml.safe_load((version / "model.yaml").read_text())
    assert arguments["dtype"] == "bfloat16" and arguments["max_batch_size"] == 64


@pytest.mark.parametrize("options, message", [
    (TrtllmOptions(name="x", tensor_parallel=3), r"tensor_parallel=3 must divide the 2 attention heads"),
    (TrtllmOptions(name="x", pipeline_parallel=4), r"pipeline_parallel=4 must be 1 to the 2 layers"),
    (TrtllmOptions(name="x", max_seq_len=1000), r"max_seq_len=1000 must be 1 to the model's context 96"),
    (TrtllmOptions(name="x", max_batch_size=0), r"max_batch_size=0 must be at least 1"),
    (TrtllmOptions(name="a b"), r"name 'a b'"),
])
def test_what_cannot_be_served_is_refused_naming_it_and_nothing_is_written(hf_folder, tmp_path, options, message):
    with pytest.raises(TrtllmEntryError, match=message):
        write_trtllm_entry(hf_folder, tmp_path / "repo", options)
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


def test_the_command_line_writes_the_entry_and_refuses_with_status_2(hf_folder, tmp_path, capsys):
    assert deploy_main(["export-trtllm", str(hf_folder), str(tmp_path / "repo"), "--name", "cli",
                        "--max-batch-size", "8"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out.strip().splitlines()[-1])["arguments"]["max_batch_size"] == 8
    assert "model.py and helpers.py" in out.err  # the step left to do by hand, said
    assert deploy_main(["export-trtllm", str(tmp_path), str(tmp_path / "repo"), "--name", "cli2"]) == 2
    assert "neither a Hugging Face model folder" in capsys.readouterr().err
