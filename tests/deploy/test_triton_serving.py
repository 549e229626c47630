"""A checkpoint trained with tp=2 × pp=2, exported and served by a real Triton: the trainer's tokens over HTTP and
gRPC, the same split over two ranks, streamed, batched across clients, cancelled on disconnect; and a Qwen2-MoE
checkpoint (RMSNorm, grouped-query attention with q/k/v biases, SwiGLU experts, a gated shared expert) split over
two ranks, with the trainer's tokens too."""
from __future__ import annotations

import re
import subprocess
import threading
import time

import pytest

from deploy.client import GenerateParams, ModelNotReady, TritonClient, TritonUnavailable
from deploy.export import ExportOptions, export
from tests.deploy.test_export_families import family_checkpoint
from tests.deploy_fixtures import greedy_of
from tests.trainer.launch import free_port

PROMPTS = ["ROMEO:", "\n", "First Citizen:\nWe are"]
MODELS = {"par": dict(), "par-tp2": dict(tensor_parallel=2), "par-unary": dict(streaming=False)}
FAMILY, FAMILY_ENTRY = "tiny-qwen-moe", "qwen-moe-tp2"  # of random weights: the tokens, not the text, are checked


@pytest.fixture(scope="module")
def family_checkpoint_folder(tmp_path_factory):
    return family_checkpoint(tmp_path_factory.mktemp("family") / "checkpoint", FAMILY)


@pytest.fixture(scope="module")
def served(triton, parallel_checkpoint, family_checkpoint_folder):
    """The three exports of the parallel checkpoint and the Qwen2-MoE one split over two ranks, loaded; unloaded
    after the module."""
    client = triton.client()
    for name, kw in MODELS.items():
        export(parallel_checkpoint, triton.repository, ExportOptions(name=name, measure=False, **kw))
        client.load(name)
    export(family_checkpoint_folder, triton.repository, ExportOptions(name=FAMILY_ENTRY, measure=False,
                                                                      tensor_parallel=2))
    client.load(FAMILY_ENTRY)
    yield client
    for name in (*MODELS, FAMILY_ENTRY):
        client.unload(name)
    client.close()


@pytest.fixture(scope="module")
def reference(parallel_checkpoint):
    return greedy_of(parallel_checkpoint)


@pytest.fixture(scope="module")
def family_reference(family_checkpoint_folder):
    return greedy_of(family_checkpoint_folder)


def _metric(text: str, name: str, model: str, **labels) -> float:
    """The value of one sample of the Prometheus text; 0 when absent."""
    wanted = {"model": model, **labels}
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if m and dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) == wanted:
            return float(m.group(2))
    return 0.0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["par-unary", "par"])
def test_it_serves_the_trainers_greedy_tokens(served, reference, model, protocol):
    """par-unary goes through tritonclient.http's infer; par (decoupled) through Triton's generate endpoint;
    gRPC through tritonclient.grpc's stream. 80 new tokens pass the 64-token window once."""
    for prompt, n in zip(PROMPTS, (40, 80, 20)):
        answer = served.generate(model, GenerateParams(prompt, max_tokens=n), protocol)
        assert answer.token_ids == reference(prompt, n), (model, protocol, prompt)
        assert answer.finish_reason == "length" and answer.completion_tokens == n


def test_it_serves_a_qwen2_moe_split_over_two_ranks_with_the_trainers_greedy_tokens(served, family_reference):
    """The protocols are the GPT's above; here what the model computes: 80 new tokens pass the window once, so the
    slot is filled again over 63 tokens routed at once."""
    for prompt, n in zip(PROMPTS, (40, 80, 20)):
        answer = served.generate(FAMILY_ENTRY, GenerateParams(prompt, max_tokens=n), "grpc")
        assert answer.token_ids == family_reference(prompt, n), prompt


def test_it_serves_the_model_split_over_two_ranks_as_the_unsplit_one(served, triton):
    for prompt in PROMPTS:
        params = GenerateParams(prompt, max_tokens=40)
        assert served.generate("par-tp2", params, "grpc").token_ids == served.generate("par", params, "grpc").token_ids
    ranks = subprocess.run(["pgrep", "-f", "workbench_serving.tensor_parallel.*--rank 1"], capture_output=True,
                           text=True).stdout.split()
    assert ranks, "the tensor-parallel rank 1 runs as its own process"


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_it_streams_one_token_at_a_time(served, reference, protocol):
    chunks = list(served.stream("par", GenerateParams("ROMEO:", max_tokens=24), protocol))
    tokens = [c for c in chunks if c.token_ids]
    assert len(tokens) == 24 and all(len(c.token_ids) == 1 for c in tokens)
    assert [c.token_ids[0] for c in tokens] == reference("ROMEO:", 24)
    whole = served.generate("par", GenerateParams("ROMEO:", max_tokens=24), "grpc")
    assert "".join(c.text for c in chunks) == whole.text and chunks[-1].finish_reason == "length"


@pytest.fixture(scope="module")
def bench_served(triton, tmp_path_factory):
    """The benchmark's model (random weights; d_model 512, 4 layers): big enough that a decode step's work, not
    the per-token cost of responses, sets the pace, as in real serving."""
    from bench.deploy.serving import bench_checkpoint

    checkpoint = bench_checkpoint(tmp_path_factory.mktemp("bench") / "checkpoint")
    export(checkpoint, triton.repository, ExportOptions(name="bench", measure=False))
    client = triton.client(timeout_s=300)
    client.load("bench")
    yield client
    client.unload("bench")
    client.close()


def test_it_batches_concurrent_streams_into_the_same_decode_steps(bench_served):
    """One client alone, then 8 at once: most decode steps serve several sequences, ≥ 3 on average. (The rate
    this buys is a timing, measured by the benchmark, python -m bench.deploy.serving, not asserted here.)"""
    client, n = bench_served, 128

    def stream_tokens(prompt: str) -> int:
        return sum(len(c.token_ids) for c in client.stream("bench", GenerateParams(prompt, max_tokens=n), "grpc"))

    stream_tokens("warm up")
    started = time.perf_counter()
    assert stream_tokens("ROMEO:") == n
    one = n / (time.perf_counter() - started)
    before = client.metrics()
    counts: list[int] = []
    threads = [threading.Thread(target=lambda i=i: counts.append(stream_tokens(f"{i}:"))) for i in range(8)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    eight = sum(counts) / (time.perf_counter() - started)
    after = client.metrics()
    steps = _metric(after, "workbench_decode_batch_size_count", "bench", version="1") - \
        _metric(before, "workbench_decode_batch_size_count", "bench", version="1")
    single = _metric(after, "workbench_decode_batch_size_bucket", "bench", version="1", le="1") - \
        _metric(before, "workbench_decode_batch_size_bucket", "bench", version="1", le="1")
    served = _metric(after, "workbench_decode_batch_size_sum", "bench", version="1") - \
        _metric(before, "workbench_decode_batch_size_sum", "bench", version="1")
    assert counts == [n] * 8
    assert steps - single > 0.5 * steps, f"{steps - single:.0f} of {steps:.0f} decode steps served > 1 sequence"
    assert served / steps >= 3, (f"{served / steps:.1f} sequences a decode step on average; 8 clients "
                                 f"{eight:.0f} tokens/s against one {one:.0f} tokens/s")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_it_stops_the_sequence_of_a_client_that_disconnects(served, protocol):
    before = served.metrics()
    stream = served.stream("par", GenerateParams("ROMEO:", max_tokens=100_000), protocol)
    received = 0
    for chunk in stream:
        received += len(chunk.token_ids)
        if received >= 5:
            break
    stream.close()

    def ended(text: str) -> dict[str, float]:
        return {reason: _metric(text, "workbench_requests_total", "par", version="1", finish_reason=reason)
                - _metric(before, "workbench_requests_total", "par", version="1", finish_reason=reason)
                for reason in ("cancelled", "length", "stop")}

    # The event: the engine ended the request (the gauge is set at the end of the step that finished it). However
    # long the disconnect takes to travel on a loaded machine, a request left running would end as "length" only
    # after its 100,000 tokens.
    deadline, after = time.monotonic() + 120, served.metrics()
    while not (any(ended(after).values()) and _metric(after, "workbench_active_sequences", "par", version="1") == 0):
        assert time.monotonic() < deadline, "the request did not end within 120 s of its client leaving"
        time.sleep(0.05)
        after = served.metrics()
    assert ended(after) == {"cancelled": 1, "length": 0, "stop": 0}, "the engine finished the request as cancelled"
    generated = _metric(after, "workbench_generated_tokens_total", "par", version="1") - \
        _metric(before, "workbench_generated_tokens_total", "par", version="1")
    assert received <= generated < 100_000, f"{generated:.0f} tokens generated for a client that left after {received}"
    assert _metric(after, "workbench_active_sequences", "par", version="1") == 0


def test_it_reports_the_server_and_its_models(served):
    assert served.server_metadata()["version"] == "2.51.0"
    index = {m["name"]: m.get("state") for m in served.repository_index()}
    assert {index[name] for name in (*MODELS, FAMILY_ENTRY)} == {"READY"}
    stats = served.statistics("par")["model_stats"][0]
    assert int(stats["inference_count"]) > 0


def test_it_says_a_model_is_not_loaded(served, triton):
    with pytest.raises(ModelNotReady, match="not loaded"):
        served.generate("never-loaded", GenerateParams("hi"), "http")
    with pytest.raises(ModelNotReady):
        list(served.stream("never-loaded", GenerateParams("hi"), "grpc"))


def test_it_says_triton_cannot_be_reached():
    port = free_port()
    client = TritonClient(f"http://127.0.0.1:{port}", f"127.0.0.1:{port}", timeout_s=5)
    assert not client.server_ready()
    with pytest.raises(TritonUnavailable, match="cannot be reached"):
        client.generate("par", GenerateParams("hi"), "http")
    with pytest.raises(TritonUnavailable, match="cannot be reached"):
        list(client.stream("par", GenerateParams("hi"), "grpc"))


def test_it_unloads_a_model(triton, parallel_checkpoint):
    client = triton.client()
    export(parallel_checkpoint, triton.repository, ExportOptions(name="short-lived", measure=False))
    client.load("short-lived")
    assert client.model_ready("short-lived")
    client.unload("short-lived")
    deadline = time.monotonic() + 20
    while client.model_ready("short-lived") and time.monotonic() < deadline:
        time.sleep(0.1)
    with pytest.raises(ModelNotReady):
        client.generate("short-lived", GenerateParams("hi"), "http")
