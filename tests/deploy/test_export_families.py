"""An exported entry of a Llama, Mixtral or Qwen2-MoE checkpoint serves, from the entry's own files (the model spec
the export writes, the shard, the tokenizer), the checkpoint's greedy tokens; a mixture-of-experts model trained with
a capacity is served, and its smoke reference recorded, as it computes with no token dropped."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from deploy.export import ExportOptions, export
from deploy.prepare import as_served
from deploy.quality import model_with
from deploy.reduce import dequantize_state, reduce_state
from deploy.serving.engine import Engine, Request
from deploy.serving.layout import TOKENIZER, Codec
from deploy.serving.tensor_parallel import build_rank_model
from tests.deploy.test_serving_engine import ListSink, family_model
from trainer.checkpoint.consolidated import write_consolidated
from trainer.contract import ParallelPlan
from trainer.contract.manifest import CONSOLIDATED, FORMAT_CONSOLIDATED, CheckpointManifest
from trainer.contract.presets import MODELS, demo_text
from trainer.data.tokenizer import TOKENIZER as TOKENIZER_FILE
from trainer.data.tokenizer import train_tokenizer
from trainer.generate import generate

PROMPT = "ROMEO:\nWhat light through yonder window breaks? It is the east, and Juliet is the sun."


def family_checkpoint(folder: Path, family: str, **kw) -> Path:
    """A weights-only checkpoint of the preset ``family`` (its biases and gains moved off 0 and 1:
    ``family_model``) with a byte-level BPE of its vocabulary trained on the Shakespeare text."""
    spec, model = family_model(family, **kw)
    folder.mkdir(parents=True, exist_ok=True)
    text = demo_text(100_000).decode()
    train_tokenizer((text[i:i + 1000] for i in range(0, len(text), 1000)), spec.vocab_size).save(
        str(folder / TOKENIZER_FILE))
    write_consolidated(model.state_dict(), folder / CONSOLIDATED)
    CheckpointManifest(step=0, format=FORMAT_CONSOLIDATED, tokens_seen=0, model=spec.to_dict(),
                       plan=ParallelPlan().to_dict(), world_size=1, tokenizer=str(folder / TOKENIZER_FILE), seed=0,
                       run=family, consolidated=CONSOLIDATED).write(folder)
    return folder


def _serve_from_entry(version: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy tokens of the entry as its Triton model builds it (one rank, the CPU, fp32), decoded together."""
    model = build_rank_model(version, 0, 1, len(prompts), torch.device("cpu"), torch.float32)
    engine = Engine(model, Codec(version / TOKENIZER), model.spec.seq_len)
    sinks = [ListSink() for _ in prompts]
    for prompt, sink in zip(prompts, sinks):
        engine.submit(Request(prompt, sink, max_tokens=n))
    while engine.busy():
        engine.step()
    return [sink.result.token_ids for sink in sinks]


@pytest.mark.parametrize("family, reduction", [("tiny-llama", "int8"), ("tiny-mixtral", "bf16"),
                                               ("tiny-qwen-moe", "none")])
def test_an_entry_serves_the_checkpoints_greedy_tokens_from_its_own_files(family, reduction, tmp_path):
    checkpoint = family_checkpoint(tmp_path / "checkpoint", family)
    report = export(checkpoint, tmp_path / "models", ExportOptions(name="m", reduction=reduction, measure=False))
    version = tmp_path / "models" / "m" / "1"
    codec = Codec(version / TOKENIZER)
    smoke = report["smoke"]
    prompts = [codec.encode(smoke["prompt"]), codec.encode(PROMPT)]
    served = _serve_from_entry(version, prompts, 40)
    spec, model = family_model(family)
    reference = model_with(dequantize_state(reduce_state(model.state_dict(), reduction)), spec)
    assert served == [generate(reference, p, 40, temperature=0)[len(p):] for p in prompts]
    assert served[0][:smoke["max_tokens"]] == smoke["token_ids"]  # what a deployment's smoke check compares


def test_an_entry_of_a_model_trained_with_a_capacity_drops_no_token(tmp_path):
    checkpoint = family_checkpoint(tmp_path / "checkpoint", "tiny-mixtral", capacity_factor=1.0)
    report = export(checkpoint, tmp_path / "models", ExportOptions(name="m", measure=False))
    version = tmp_path / "models" / "m" / "1"
    codec = Codec(version / TOKENIZER)
    prompts = [codec.encode(report["smoke"]["prompt"]), codec.encode(PROMPT * 2)]
    spec, model = family_model("tiny-mixtral", capacity_factor=1.0)
    unlimited = model_with(model.state_dict(), as_served(spec))
    assert as_served(spec).capacity_factor == 0 and as_served(MODELS["tiny"]) is MODELS["tiny"]
    served = _serve_from_entry(version, prompts, 24)
    assert served == [generate(unlimited, p, 24, temperature=0)[len(p):] for p in prompts]
    assert served[0][:report["smoke"]["max_tokens"]] == report["smoke"]["token_ids"]
