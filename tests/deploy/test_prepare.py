"""Prepare, then write: an export reads the checkpoint's manifest once and reduces its weights once, the entry's
bytes do not depend on when it was written, and they are the bytes the exporter wrote before it was split in two."""
from __future__ import annotations

import builtins
import functools
import hashlib
import io
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from deploy.export import ExportError, ExportOptions, export, write_entry
from deploy.prepare import PrepareOptions, prepare
from deploy.reduce import reduce_state
from trainer.checkpoint.consolidated import checkpoint_state, empty_model, write_consolidated
from trainer.contract import ModelSpec, ParallelPlan
from trainer.contract.manifest import CONSOLIDATED, FORMAT_CONSOLIDATED, MANIFEST, CheckpointManifest
from trainer.contract.presets import demo_text
from trainer.data.tokenizer import MIN_VOCAB, TOKENIZER, train_tokenizer


def manifest_opens(monkeypatch) -> list[Path]:
    """Every opening of a manifest.json from here on, by any code in this process (the real open still runs)."""
    opened: list[Path] = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and Path(file).name == MANIFEST:
            opened.append(Path(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(io, "open", counting_open)
    return opened


def calls_of(monkeypatch, function) -> list[tuple]:
    """The arguments of every call of ``function`` from here on: each module of the project that holds it, under
    any name, holds a wrapper that records the call and runs the real function."""
    calls: list[tuple] = []

    @functools.wraps(function)
    def recording(*args, **kwargs):
        calls.append(args)
        return function(*args, **kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").split(".")[0] in ("deploy", "trainer"):
            for name, value in list(vars(module).items()):
                if value is function:
                    monkeypatch.setattr(module, name, recording)
    return calls


def test_it_reads_the_manifest_once_loads_the_weights_once_and_reduces_once(shakespeare_checkpoint, tmp_path,
                                                                            monkeypatch):
    opened = manifest_opens(monkeypatch)
    loads = calls_of(monkeypatch, checkpoint_state)
    reductions = calls_of(monkeypatch, reduce_state)
    report = export(shakespeare_checkpoint, tmp_path, ExportOptions(name="m", reduction="int8", tensor_parallel=2))
    assert report["perplexity"] is not None, "measured: the validation tokens were found from the manifest"
    assert opened == [shakespeare_checkpoint / MANIFEST]
    assert len(loads) == 1
    assert [args[1] for args in reductions] == ["int8"]


def entry_files(entry: Path) -> dict[str, bytes]:
    """Every file of an entry by its path inside it; serving.json with the export's duration masked (the one
    figure that differs between two exports of the same checkpoint with the same options)."""
    files = {p.relative_to(entry).as_posix(): p.read_bytes() for p in sorted(entry.rglob("*")) if p.is_file()}
    files["1/serving.json"] = re.sub(rb'"export_seconds": [0-9.e-]+', b'"export_seconds": _',
                                     files["1/serving.json"])
    return files


def test_it_writes_the_same_bytes_on_every_export(shakespeare_checkpoint, tmp_path):
    options = ExportOptions(name="again", reduction="int8", tensor_parallel=2)
    export(shakespeare_checkpoint, tmp_path, options)
    first = entry_files(tmp_path / "again")
    export(shakespeare_checkpoint, tmp_path, options)
    second = entry_files(tmp_path / "again")
    assert list(first) == list(second)
    assert [name for name in first if first[name] != second[name]] == []


def test_it_writes_one_preparation_as_entries_of_its_own_options_only(shakespeare_checkpoint, tmp_path):
    prepared = prepare(shakespeare_checkpoint, PrepareOptions(reduction="bf16", measure=False))
    streaming = write_entry(prepared, tmp_path, ExportOptions(name="a", reduction="bf16", measure=False))
    whole = write_entry(prepared, tmp_path, ExportOptions(name="b", reduction="bf16", measure=False, streaming=False))
    assert streaming["smoke"] == whole["smoke"] and (streaming["streaming"], whole["streaming"]) == (True, False)
    assert (tmp_path / "a/1/weights/rank-0.safetensors").read_bytes() == \
        (tmp_path / "b/1/weights/rank-0.safetensors").read_bytes()
    with pytest.raises(ExportError, match="prepare it again with the entry's options"):
        write_entry(prepared, tmp_path, ExportOptions(name="c", reduction="int8", measure=False))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


# A checkpoint whose weights are exact in fp32 whatever the machine: k / 2^20 with −2^15 ≤ k < 2^15, more digits than
# bf16 and fp16 hold, so each cast rounds, and int8 divides by a per-row scale (IEEE, the same everywhere).
# Grouped-query attention and a mixture of experts, so every rule of the tensor-parallel split is used.
DYADIC_MODEL = ModelSpec(name="dyadic", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, seq_len=32,
                         vocab_size=MIN_VOCAB, n_experts=2, moe_every=2)

# sha256 (first 16 digits) of what the exporter wrote for the dyadic checkpoint before it was split into prepare
# and write_entry. A change here changes what every deployment serves: mean it, then write the new values.
FORMER_SHARDS = {  # (reduction, tensor parallel) → weights/rank-0.safetensors, rank-1, …
    ("none", 1): ["a5e374ef0dcd63b8"], ("none", 2): ["f0f6334807794146", "7ef1dacacc1e53a0"],
    ("bf16", 1): ["9c91fdb2dc5a1a70"], ("bf16", 2): ["589c8c5517fe7329", "1f3a7893da764e90"],
    ("fp16", 1): ["1ad0f1a22d36d0c9"], ("fp16", 2): ["56738fe5e2ffc2ed", "8376bfbbcc56ae27"],
    ("int8", 1): ["dbc231a695aab004"], ("int8", 2): ["1d290fbeecc820d8", "03b8fbc88caef3ec"],
}
# config.pbtxt by tensor parallel, other options default; since then with what the former exporter did not write:
# the entry's engine (parameters { key: "engine" … "workbench" }), and interface 2's inputs (logprobs,
# prompt_logprobs, presence_penalty, frequency_penalty, guide) and outputs (logprobs, prompt_logprobs)
FORMER_CONFIG = {1: "38b775a80c6ca536", 2: "da6ec88e2e1e053c"}
FORMER_GPU_CONFIG = "09109c24b7c8f7df"  # int8, tensor parallel 2, kind gpu, 2 instances, not streaming, 4 sequences


@pytest.fixture(scope="module")
def dyadic_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint folder of DYADIC_MODEL as an import writes one: consolidated weights, tokenizer, manifest."""
    folder = tmp_path_factory.mktemp("dyadic") / "ckpt"
    folder.mkdir()
    state = {}
    for salt, (name, tensor) in enumerate(sorted(empty_model(DYADIC_MODEL).state_dict().items())):
        index = torch.arange(tensor.numel(), dtype=torch.int64)
        numerators = (index * 2654435761 + salt * 40503) % 65536 - 32768
        state[name] = (numerators.to(torch.float32) / 2 ** 20).reshape(tensor.shape)
    train_tokenizer(iter([demo_text(2_000).decode()]), MIN_VOCAB).save(str(folder / TOKENIZER))
    write_consolidated(state, folder / CONSOLIDATED)
    CheckpointManifest(step=7, format=FORMAT_CONSOLIDATED, tokens_seen=0, model=DYADIC_MODEL.to_dict(),
                       plan=ParallelPlan().to_dict(), world_size=1, tokenizer=str(folder / TOKENIZER), seed=0,
                       consolidated=CONSOLIDATED).write(folder)
    return folder


def short_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


@pytest.mark.parametrize("reduction,tensor_parallel", list(FORMER_SHARDS))
def test_it_writes_the_bytes_the_former_exporter_wrote(dyadic_checkpoint, tmp_path, reduction, tensor_parallel):
    report = export(dyadic_checkpoint, tmp_path, ExportOptions(name="d", reduction=reduction,
                                                               tensor_parallel=tensor_parallel))
    version = tmp_path / "d" / "1"
    shards = sorted((version / "weights").iterdir())
    assert [p.name for p in shards] == [f"rank-{r}.safetensors" for r in range(tensor_parallel)]
    assert [short_hash(p) for p in shards] == FORMER_SHARDS[reduction, tensor_parallel]
    assert short_hash(tmp_path / "d" / "config.pbtxt") == FORMER_CONFIG[tensor_parallel]
    assert json.loads((version / "model_spec.json").read_text()) == DYADIC_MODEL.to_dict()
    assert (version / TOKENIZER).read_bytes() == (dyadic_checkpoint / TOKENIZER).read_bytes()
    assert json.loads((version / "serving.json").read_text()) == report


def test_it_writes_the_gpu_configuration_the_former_exporter_wrote(dyadic_checkpoint, tmp_path):
    export(dyadic_checkpoint, tmp_path, ExportOptions(name="d", reduction="int8", tensor_parallel=2, kind="gpu",
                                                      instances=2, streaming=False, max_sequences=4))
    assert short_hash(tmp_path / "d" / "config.pbtxt") == FORMER_GPU_CONFIG
