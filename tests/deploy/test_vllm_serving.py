"""The vllm engine: a GPT-2-layout checkpoint (head_dim 64) exported with ``python -m deploy export --engine vllm``
as the deploy worker runs it, and a Llama-layout one (grouped-query attention, rotary positions with Llama 3.1's
scaling), both trained here and served by vLLM's CPU engine inside the real Triton: the checkpoint's greedy tokens
(the smoke check's reference too), streamed, stopped when the client leaves, with the workbench engine's metrics; a
model vLLM has no kernels for is refused before anything is written, with the reason."""
from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from deploy.client import GenerateParams
from deploy.export import ExportOptions
from deploy.prepare import ExportError
from deploy.vllm import entry, support
from tests.deploy.test_export_families import family_checkpoint
from trainer.contract import DatasetSpec, ModelSpec, OptimizerSpec, ParallelPlan, RunSpec
from trainer.contract.manifest import step_dir
from trainer.contract.presets import MODELS, local_cpu_cluster
from trainer.generate import generate, load_model_from_checkpoint

GPT = ModelSpec(name="vllm-gpt", n_layers=2, d_model=128, n_heads=2, seq_len=256, vocab_size=512)  # head_dim 64
LLAMA = MODELS["tiny-llama"].replace(name="vllm-llama", d_model=128, n_heads=2, n_kv_heads=1, seq_len=128)
STEPS = {"gpt": 150, "llama": 100}  # enough that greedy tokens vary with the prompt
PROMPTS = ["ROMEO:", "First Citizen:\nWe are"]


def _train(root: Path, model: ModelSpec, dataset: DatasetSpec, steps: int) -> Path:
    """``steps`` steps of ``model`` by the real training loop in this process (a world of one); its last
    checkpoint."""
    import torch.distributed as dist

    from trainer.engine.loop import run

    spec = RunSpec(model=model, plan=ParallelPlan(micro_batch=8, global_batch=8), cluster=local_cpu_cluster(1),
                   dataset=dataset, output_dir=str(root), steps=steps, checkpoint_every=steps, log_every=steps,
                   optimizer=OptimizerSpec(lr=3e-3, min_lr=3e-4, warmup_steps=10)).validate()
    joined_here = not dist.is_initialized()
    try:
        assert run(spec, root, resume=False) == "finished"
    finally:
        if joined_here and dist.is_initialized():
            dist.destroy_process_group()
    return step_dir(root, steps)


@pytest.fixture(scope="module")
def checkpoints(shakespeare_checkpoint, tmp_path_factory) -> dict[str, Path]:
    """The GPT and the Llama, trained on the Shakespeare fixture's prepared dataset (its tokenizer)."""
    data = shakespeare_checkpoint.parents[2]
    dataset = DatasetSpec(path=str(data / "shakespeare.txt"), prepared_dir=str(data / "prepared"))
    root = tmp_path_factory.mktemp("vllm-checkpoints")
    return {name: _train(root / name, model, dataset, STEPS[name]) for name, model in (("gpt", GPT), ("llama", LLAMA))}


def _export_command(checkpoint: Path, repository: Path, name: str) -> list[str]:
    """The deploy worker's export command (workers.deploying.export_command) with the engine chosen."""
    return [sys.executable, "-m", "deploy", "export", "--checkpoint", str(checkpoint), "--repository",
            str(repository), "--name", name, "--reduction", "none", "--tensor-parallel", "1", "--instances", "1",
            "--kind", "cpu", "--engine", "vllm", "--no-measure"]


@pytest.fixture(scope="module")
def served(triton, checkpoints):
    """The GPT exported by the command line, the Llama by ``entry.export``; both loaded at once (one vLLM engine
    each, 35-45 s apiece here), unloaded after the module. Yields (client, the GPT's export report)."""
    done = subprocess.run(_export_command(checkpoints["gpt"], triton.repository, "vllm-gpt"), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    entry.export(checkpoints["llama"], triton.repository, ExportOptions(name="vllm-llama", measure=False,
                                                                        engine="vllm"))
    client = triton.client(timeout_s=300)

    def load(name: str) -> None:
        with triton.client(timeout_s=300) as own:  # a client a thread
            own.load(name)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(load, ("vllm-gpt", "vllm-llama")))
    yield client, report
    for name in ("vllm-gpt", "vllm-llama"):
        client.unload(name)
    client.close()


def _greedy_of(checkpoint: Path):
    model, tokenizer = load_model_from_checkpoint(checkpoint)

    def greedy(prompt: str, n: int) -> list[int]:
        ids = tokenizer.encode(prompt)
        return generate(model, ids, n, temperature=0)[len(ids):]
    return greedy


@pytest.fixture(scope="module")
def references(checkpoints):
    return {name: _greedy_of(folder) for name, folder in checkpoints.items()}


def _metric(text: str, name: str, model: str, **labels) -> float:
    """The value of one sample of the Prometheus text; 0 when absent."""
    wanted = {"model": model, "version": "1", **labels}
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if m and dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) == wanted:
            return float(m.group(2))
    return 0.0


def test_the_export_writes_the_hugging_face_folder_and_the_engine_arguments(served, triton):
    _, report = served
    version = Path(triton.repository) / "vllm-gpt" / "1"
    assert report["engine"] == "vllm" and report["hf_model_type"] == "gpt2"
    assert report["vllm"]["dtype"] == "float32" and report["vllm"]["max_model_len"] == GPT.seq_len
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (version / "hf").iterdir()}
    assert 'key: "engine" value: { string_value: "vllm" }' in (version.parent / "config.pbtxt").read_text()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_it_answers_the_smoke_check_with_the_checkpoints_greedy_tokens(served, protocol):
    """What the deploy worker's smoke check asks, from the report the export printed."""
    client, report = served
    smoke = report["smoke"]
    answer = client.generate("vllm-gpt", GenerateParams(smoke["prompt"], max_tokens=smoke["max_tokens"]), protocol)
    assert answer.token_ids == smoke["token_ids"] and len(set(smoke["token_ids"])) > 3
    assert answer.text == smoke["text"]
    assert (answer.finish_reason, answer.completion_tokens) == ("length", smoke["max_tokens"])


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_it_serves_the_trainers_greedy_tokens(served, references, name):
    client, _ = served
    for prompt, n in zip(PROMPTS, (60, 20)):
        answer = client.generate(f"vllm-{name}", GenerateParams(prompt, max_tokens=n), "grpc")
        assert answer.token_ids == references[name](prompt, n), prompt
        assert (answer.finish_reason, answer.completion_tokens) == ("length", n) and answer.prompt_tokens > 0


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_it_streams_as_it_generates(served, references, protocol):
    client, _ = served
    chunks = list(client.stream("vllm-gpt", GenerateParams("ROMEO:", max_tokens=24), protocol))
    assert [t for c in chunks for t in c.token_ids] == references["gpt"]("ROMEO:", 24)
    assert len([c for c in chunks if c.token_ids]) > 1, "the tokens came in more than one response"
    whole = client.generate("vllm-gpt", GenerateParams("ROMEO:", max_tokens=24), "grpc")
    assert "".join(c.text for c in chunks) == whole.text and chunks[-1].finish_reason == "length"
    assert chunks[-1].completion_tokens == 24


def test_it_ends_at_a_stop_string_and_leaves_it_out(served):
    """As the workbench engine: the answer's text ends where a stop string starts, finish_reason "stop"."""
    client, _ = served
    whole = client.generate("vllm-gpt", GenerateParams("ROMEO:", max_tokens=60), "grpc").text
    stop = whole[len(whole) // 2:len(whole) // 2 + 2]
    assert whole.index(stop) > 0
    for protocol in ("grpc", "http"):
        answer = client.generate("vllm-gpt", GenerateParams("ROMEO:", max_tokens=60, stop=(stop,)), protocol)
        assert (answer.text, answer.finish_reason) == (whole[:whole.index(stop)], "stop"), protocol


def test_it_stops_the_sequence_of_a_client_that_disconnects(served):
    client, _ = served
    before = client.metrics()
    stream = client.stream("vllm-gpt", GenerateParams("ROMEO:", max_tokens=10_000), "grpc")
    received = 0
    for chunk in stream:
        received += len(chunk.token_ids)
        if received >= 3:
            break
    stream.close()
    deadline, cancelled = time.monotonic() + 10, 0.0
    while time.monotonic() < deadline and not cancelled:
        after = client.metrics()
        cancelled = _metric(after, "workbench_requests_total", "vllm-gpt", finish_reason="cancelled") - \
            _metric(before, "workbench_requests_total", "vllm-gpt", finish_reason="cancelled")
        time.sleep(0.05)
    assert cancelled == 1, "vLLM's request was aborted, not finished"
    generated = _metric(after, "workbench_generated_tokens_total", "vllm-gpt") - \
        _metric(before, "workbench_generated_tokens_total", "vllm-gpt")
    # the window lets the request run to 250 tokens; those decoded while the disconnect travels are counted too
    assert generated < 200, f"{generated:.0f} tokens generated for a client that left after {received}"


def test_it_reports_the_workbench_engines_metrics(served):
    client, _ = served
    client.generate("vllm-gpt", GenerateParams("ROMEO:", max_tokens=8), "grpc")
    text = client.metrics()
    for name in ("workbench_time_to_first_token_seconds_count", "workbench_decode_batch_size_count",
                 "workbench_tokens_per_second_count", "workbench_generated_tokens_total"):
        assert _metric(text, name, "vllm-gpt") > 0, name
    assert _metric(text, "workbench_requests_total", "vllm-gpt", finish_reason="length") > 0


def test_a_model_vllm_has_no_kernels_for_is_refused_before_export(tmp_path):
    """The tiny preset's head_dim is 16: refused by the command, with the reason, before anything is written."""
    checkpoint = family_checkpoint(tmp_path / "checkpoint", "tiny")
    repository = tmp_path / "models"
    with pytest.raises(ExportError, match="head_dim 16 .* vLLM's CPU attention has kernels for head sizes 32, 64"):
        entry.export(checkpoint, repository, ExportOptions(name="tiny", engine="vllm", measure=False))
    done = subprocess.run(_export_command(checkpoint, repository, "tiny"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "head_dim 16" in done.stderr.strip().splitlines()[-1]
    assert not repository.exists() or not any(repository.iterdir())


def test_what_vllm_cannot_compute_is_named():
    gpt = GPT.replace(n_heads=4)  # head_dim 32: vLLM's CPU kernels take it
    assert support.problems(gpt, "none", 1, "cpu") == []
    assert support.problems(GPT.replace(n_heads=8), "none", 1, "gpu") == []  # head_dim 16 is the CPU's limit only
    (int8,) = support.problems(gpt, "int8", 1, "cpu")
    assert "int8" in int8 and "bf16 or none" in int8
    (split,) = support.problems(gpt, "bf16", 3, "gpu")
    assert "divisor of 4" in split
    (layout,) = support.problems(GPT.replace(positions="rope"), "none", 1, "cpu")
    assert "positions='rope'" in layout


def test_the_head_sizes_are_those_of_the_installed_vllm():
    """deploy.vllm.support decides without importing vLLM (seconds of imports); its table is the one the installed
    vLLM's CPU attention backend returns, read from its source."""
    source = Path(importlib.util.find_spec("vllm").origin).parent / "v1/attention/backends/cpu_attn.py"
    (function,) = [node for node in ast.walk(ast.parse(source.read_text()))
                   if isinstance(node, ast.FunctionDef) and node.name == "get_supported_head_sizes"]
    (returned,) = [node.value for node in ast.walk(function) if isinstance(node, ast.Return)]
    assert tuple(ast.literal_eval(returned)) == support.CPU_HEAD_SIZES
