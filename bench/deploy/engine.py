"""The engine's own figures: what the KV cache buys and what Triton costs a single request.

    python -m bench.deploy.engine [--checkpoint runs/<id>/checkpoints/step-<n>] [--new-tokens 256]

Without a checkpoint it uses the engine batching test's model (``bench.deploy.serving.BENCH_MODEL``, random weights). It
prints, side by side:
1. in-process greedy decoding of ``--new-tokens`` tokens with the KV cache and without it (every token recomputes
   the whole prefix): tokens/s and their ratio (target ≥ 5×);
2. one request at batch 1 end to end through a local Triton (gRPC) against the same request through the same
   engine in this process: seconds and their ratio (target ≤ 1.2×).
Concurrent streams, engines side by side and the transformers floor are ``python -m bench.deploy.serving``'s, with a
standard client.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from bench.deploy.serving import bench_checkpoint
from deploy.client import GenerateParams
from deploy.export import ExportOptions, export
from deploy.serving.engine import CountingMetrics, Engine, Request
from deploy.serving.layout import Codec
from deploy.serving.model import ServingGPT, ServingSpec
from deploy.triton import LocalTriton
from trainer.checkpoint.consolidated import checkpoint_state
from trainer.contract.manifest import read_manifest
from trainer.generate import generate
from trainer.model import build_model

PROMPT = "ROMEO:\nWhat light through yonder window breaks?"


def _rate(tokens: int, seconds: float) -> str:
    return f"{tokens / seconds:9.0f} tokens/s"


def kv_cache(model, prompt_ids: list[int], new_tokens: int) -> tuple[float, float]:
    """Seconds for new_tokens greedy tokens with the cache (median of 3, after a warm-up) and by recomputing the
    prefix each token (once: it is the slow one)."""
    generate(model, prompt_ids, 8, temperature=0)
    times = []
    for _ in range(3):
        started = time.perf_counter()
        with_cache = generate(model, prompt_ids, new_tokens, temperature=0)
        times.append(time.perf_counter() - started)
    cached = statistics.median(times)
    ids = list(prompt_ids)
    started = time.perf_counter()
    with torch.no_grad():
        for _ in range(new_tokens):
            ids.append(int(model(torch.tensor([ids[-model.spec.seq_len:]]))[0, -1].argmax()))
    recomputed = time.perf_counter() - started
    assert ids == with_cache, "the cache changed the tokens"
    return cached, recomputed


class _Done:
    def __init__(self):
        self.event, self.result = threading.Event(), None

    def on_token(self, text, token_id):
        pass

    def on_finish(self, result):
        self.result = result
        self.event.set()

    def on_error(self, message):
        raise RuntimeError(message)

    def is_cancelled(self):
        return False


def in_process_seconds(folder: Path, prompt_ids: list[int], new_tokens: int, repeats: int) -> float:
    """Median seconds of one request through the engine in this process, over the exported weights."""
    from deploy.serving.layout import MODEL_SPEC, load_shard, read_json

    spec = ServingSpec.from_dict(read_json(folder / MODEL_SPEC))
    engine = Engine(ServingGPT(spec, load_shard(folder, 0), 16), Codec(folder / "tokenizer.json"), spec.seq_len,
                    CountingMetrics())
    engine.start()
    times = []
    try:
        for _ in range(repeats + 1):
            done = _Done()
            started = time.perf_counter()
            engine.submit(Request(list(prompt_ids), done, max_tokens=new_tokens))
            done.event.wait()
            times.append(time.perf_counter() - started)
    finally:
        engine.stop()
    return statistics.median(times[1:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.deploy.engine", description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", default="", help="a checkpoint folder (default: a random bench model)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="deploy-bench-engine-") as tmp:
        root = Path(tmp)
        checkpoint = Path(args.checkpoint) if args.checkpoint else bench_checkpoint(root / "checkpoint")
        manifest = read_manifest(checkpoint)
        spec = manifest.model_spec()
        model = build_model(spec, 0).eval()
        model.load_state_dict(checkpoint_state(checkpoint))
        codec = Codec(Path(manifest.tokenizer))
        prompt_ids = codec.encode(PROMPT)
        new = min(args.new_tokens, spec.seq_len - len(prompt_ids))
        print(f"model {spec.name or 'checkpoint'}: {spec.n_layers} layers, d_model {spec.d_model}, "
              f"seq_len {spec.seq_len}; prompt {len(prompt_ids)} tokens, {new} new tokens; "
              f"{torch.get_num_threads()} torch threads")

        cached, recomputed = kv_cache(model, prompt_ids, new)
        print(f"\n1. in-process decoding, {new} new tokens")
        print(f"   with the KV cache    {cached:7.3f} s {_rate(new, cached)}")
        print(f"   without (recompute)  {recomputed:7.3f} s {_rate(new, recomputed)}")
        print(f"   ratio                {recomputed / cached:7.1f}×   (target ≥ 5×)")

        export(checkpoint, root / "models", ExportOptions(name="bench", measure=False))
        local = in_process_seconds(root / "models" / "bench" / "1", prompt_ids, new, args.repeats)
        server = LocalTriton.on_free_ports(root / "models", root / "triton").start()
        try:
            client = server.client(timeout_s=300)
            client.load("bench")
            params = GenerateParams(PROMPT, max_tokens=new)
            client.generate("bench", params, "grpc")  # warm up
            times = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                client.generate("bench", params, "grpc")
                times.append(time.perf_counter() - started)
            served = statistics.median(times)
            print(f"\n2. one request at batch 1, {new} new tokens (median of {args.repeats})")
            print(f"   in-process engine    {local:7.3f} s {_rate(new, local)}")
            print(f"   through Triton gRPC  {served:7.3f} s {_rate(new, served)}")
            print(f"   ratio                {served / local:7.2f}×   (target ≤ 1.2×)")

            client.unload("bench")
            client.close()
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
