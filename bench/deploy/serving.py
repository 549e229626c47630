"""Serving benchmark with a standard client: each engine through Triton and through the web app's /v1, against the
same model in this process under Hugging Face transformers' ``generate`` (the floor a user would otherwise reach
for), at several numbers of concurrent streams.

    python -m bench.deploy.serving [--checkpoint CHECKPOINT] [--streams 1,8,32,64] [--new-tokens 128]
        [--requests-per-stream 4] [--min-requests 64] [--repeats 3] [--engines workbench,vllm]
        [--targets triton,v1] [--no-floor] [--no-predict] [--train-steps 30] [--json results.json]

Without a checkpoint it builds one: a GPT-2-layout model (4 layers, d_model 256, head_dim 64, context 512) trained
``--train-steps`` steps on the repository's Shakespeare text: enough for text that re-tokenizes to the tokens
generated, which is how the client counts them (``bench.deploy.aiperf_client``); the figures are about speed, not text.

For each engine (``deploy.export.ENGINES``: workbench, vllm) the checkpoint is exported to a Triton entry by that
engine's exporter (room for the largest stream count, so no stream waits for a slot) and loaded in a local Triton;
an engine whose export refuses the model (vLLM not installed, a head size it lacks) is left out with the reason. The
web app is started over that Triton (``bench.deploy.webapp``) with each entry as a ready deployment. NVIDIA's
AIPerf then drives, per number of streams, Triton's HTTP generate_stream and /v1/completions, streamed, with the
same prompts, sampling (temperature 1) and tokens per request, every level ``--repeats`` times in turn (each level
once, then again), since one run of a level on a shared machine varies by a sixth from the next: each row is a
level's median run, with every run's tokens/s beside it. It prints one table: time to first token,
inter-token latency and tokens/s per path, the planner's predicted tokens/s and its error (``bench.deploy.predict``:
host costs measured on a probe model first, the device's from the model's kernels timed on this machine), tokens/s
against the floor's and against the path's own at its fewest streams, and the machine's load average as each was
measured (on a shared machine, others' work).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack, redirect_stdout
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Optional

from bench.deploy.aiperf_client import DEFAULT_VENV, Measurement, Target, openai_completions_target, profile, \
    triton_generate_target
from bench.deploy.predict import PathPrediction, TimedKernels, predict_path, probe_spec, probe_streams
from deploy.export import ENGINES, ExportOptions
from deploy.prepare import ExportError
from deploy.triton import LocalTriton
from trainer.checkpoint.consolidated import write_consolidated
from trainer.contract import ModelSpec, ParallelPlan
from trainer.contract.manifest import CONSOLIDATED, FORMAT_CONSOLIDATED, CheckpointManifest, read_manifest, step_dir
from trainer.contract.presets import demo_text
from trainer.data.tokenizer import TOKENIZER, train_tokenizer
from trainer.model import build_model
from trainer.planner.estimate.serving import Load, iteration_device

# The engine's batching test serves this one (random weights; a decode step's work, not the per-token cost of
# responses, sets the pace); the benchmark's default is the same layout at d_model 256.
BENCH_MODEL = ModelSpec(name="bench", n_layers=4, d_model=512, n_heads=8, seq_len=512, vocab_size=2048)
SERVING_MODEL = BENCH_MODEL.replace(d_model=256, n_heads=4)
TEMPERATURE = 1.0
FLOOR = "transformers generate (floor)"
PROMPT_TOKENS = 40


def bench_checkpoint(folder: Path, spec: ModelSpec = BENCH_MODEL) -> Path:
    """A checkpoint of ``spec`` with random weights and a Shakespeare tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    text = demo_text(300_000).decode()
    tokenizer = train_tokenizer((text[i:i + 1000] for i in range(0, len(text), 1000)), spec.vocab_size)
    tokenizer.save(str(folder / TOKENIZER))
    write_consolidated(build_model(spec, seed=0).state_dict(), folder / CONSOLIDATED)
    CheckpointManifest(step=0, format=FORMAT_CONSOLIDATED, tokens_seen=0, model=spec.to_dict(),
                       plan=ParallelPlan().to_dict(), world_size=1, tokenizer=str(folder / TOKENIZER), seed=0,
                       run="bench", consolidated=CONSOLIDATED).write(folder)
    return folder


def trained_checkpoint(root: Path, spec: ModelSpec, steps: int) -> Path:
    """``spec`` trained ``steps`` steps on the Shakespeare text by the real training loop in this process (a world
    of one); its last checkpoint folder."""
    import torch.distributed as dist

    from trainer.contract import DatasetSpec, OptimizerSpec, RunSpec
    from trainer.contract.presets import local_cpu_cluster
    from trainer.engine.loop import run

    root.mkdir(parents=True, exist_ok=True)
    (root / "shakespeare.txt").write_bytes(demo_text(300_000))
    run_spec = RunSpec(model=spec, plan=ParallelPlan(micro_batch=4, global_batch=4), cluster=local_cpu_cluster(1),
                       dataset=DatasetSpec(path=str(root / "shakespeare.txt"), prepared_dir=str(root / "prepared")),
                       output_dir=str(root / "run"), steps=steps, checkpoint_every=steps, log_every=max(1, steps),
                       optimizer=OptimizerSpec(lr=3e-3, min_lr=3e-4, warmup_steps=min(10, steps))).validate()
    joined_here = not dist.is_initialized()
    try:
        with redirect_stdout(sys.stderr):  # the loop's log lines; the table alone goes to standard output
            finished = run(run_spec, root / "run", resume=False)
        if finished != "finished":
            raise RuntimeError(f"training the bench model did not finish; see {root / 'run'}")
    finally:
        if joined_here and dist.is_initialized():
            dist.destroy_process_group()
    return step_dir(root / "run", steps)


def bench_prompts(count: int, tokenizer_file: Path, max_tokens: int = PROMPT_TOKENS) -> list[str]:
    """``count`` different prompts of at most ``max_tokens`` tokens: the starts of consecutive passages of the
    Shakespeare text."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    text = demo_text(400_000).decode()
    passages = (text[i * 4 * max_tokens:(i + 1) * 4 * max_tokens] for i in range(count))
    return [tokenizer.decode(tokenizer.encode(p).ids[:max_tokens]) for p in passages]


# -- engines: each of deploy.export.ENGINES, exported by the command line's exporter for it ---------------------

def export_entry(engine: str, checkpoint: Path, repository: Path, name: str, max_streams: int) -> dict:
    """``checkpoint`` as the Triton entry ``repository/name`` served by ``engine``, with room for ``max_streams``
    sequences at once (the workbench engine's slots, vLLM's sequences), so no stream waits for a slot."""
    from deploy.__main__ import EXPORTERS

    options = ExportOptions(name=name, measure=False, engine=engine, max_sequences=max_streams)
    return EXPORTERS[engine](checkpoint, repository, options)


TARGETS = ("triton", "v1")


# -- the floor: the same model under transformers in this process -------------------------------------------------

def transformers_floor(hf_folder: Path, prompts: list[str], streams: int, requests: int,
                       new_tokens: int) -> Measurement:
    """``requests`` prompts through ``model.generate`` in batches of ``streams`` (left-padded, sampled at
    TEMPERATURE, exactly ``new_tokens`` each): time to the first token and between tokens from a clock called after
    every step, tokens/s over all batches."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteria, StoppingCriteriaList

    model = AutoModelForCausalLM.from_pretrained(hf_folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(hf_folder)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    class Clock(StoppingCriteria):
        def __init__(self):
            self.stamps: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            self.stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    def batch(start: int, size: int, tokens: int) -> tuple[float, Clock, int]:
        inputs = tokenizer([prompts[(start + i) % len(prompts)] for i in range(size)], return_tensors="pt",
                           padding=True)
        clock = Clock()
        began = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True,
                                 temperature=TEMPERATURE, top_k=0, pad_token_id=tokenizer.pad_token_id,
                                 stopping_criteria=StoppingCriteriaList([clock]))
        return began, clock, (out.shape[1] - inputs["input_ids"].shape[1]) * size

    torch.manual_seed(0)
    batch(0, streams, 2)  # warm-up
    firsts, gaps, generated, busy = [], [], 0, 0.0
    for start in range(0, requests, streams):
        began, clock, count = batch(start, streams, new_tokens)
        firsts.append(clock.stamps[0] - began)
        gaps += [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]
        generated += count
        busy += clock.stamps[-1] - began
    return Measurement(streams=streams, requests=requests, errors=0, ttft_ms=1e3 * sum(firsts) / len(firsts),
                       itl_ms=1e3 * sum(gaps) / max(1, len(gaps)), tokens_per_s=generated / busy,
                       tokens_per_request=generated / requests)


# -- the table ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    path: str
    measurement: Measurement
    load: float = 0.0   # the machine's 1-minute load average when the measurement ended: others' work shows here
    predicted: Optional[float] = None   # the planner's tokens/s for this path and number of streams
    runs: tuple[float, ...] = ()   # tokens/s of every run of this level where it was measured more than once


def _row(path: str, measurement: Measurement) -> Row:
    return Row(path, measurement, os.getloadavg()[0])


def median_run(runs: list[Row]) -> Row:
    """The run of a level with the median tokens/s (the lower of the two middle ones for an even count), carrying
    every run's tokens/s."""
    ordered = sorted(runs, key=lambda r: r.measurement.tokens_per_s)
    return replace(ordered[(len(ordered) - 1) // 2], runs=tuple(r.measurement.tokens_per_s for r in ordered))


def table(rows: list[Row]) -> str:
    """A Markdown table, one row per path and number of streams: the figures, the planner's tokens/s and its error
    against the measured, tokens/s against the floor's at the same streams and against the path's own at its
    fewest streams, and the machine's load when it was measured."""
    floor = {r.measurement.streams: r.measurement.tokens_per_s for r in rows if r.path == FLOOR}
    alone: dict[str, float] = {}
    for r in sorted(rows, key=lambda r: r.measurement.streams):
        alone.setdefault(r.path, r.measurement.tokens_per_s)
    lines = ["| streams | path | time to first token (ms) | inter-token latency (ms) | tokens/s | predicted tokens/s "
             "| error | runs (tokens/s) | × floor | × fewest streams | requests | errors | tokens/request | load |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r.measurement.streams, r.path == FLOOR, r.path)):
        m = r.measurement
        versus_floor = f"{m.tokens_per_s / floor[m.streams]:.2f}" if floor.get(m.streams) else "–"
        predicted, error = "–", "–"
        if r.predicted is not None:
            predicted, error = f"{r.predicted:.0f}", f"{100 * (r.predicted / m.tokens_per_s - 1):+.1f} %"
        runs = " · ".join(f"{rate:.0f}" for rate in r.runs) if len(r.runs) > 1 else "–"
        lines.append(f"| {m.streams} | {r.path} | {m.ttft_ms:.1f} | {m.itl_ms:.2f} | {m.tokens_per_s:.0f} | "
                     f"{predicted} | {error} | {runs} | {versus_floor} | {m.tokens_per_s / alone[r.path]:.2f} | "
                     f"{m.requests} | {m.errors} | {m.tokens_per_request:.1f} | {r.load:.1f} |")
    return "\n".join(lines)


# -- the run --------------------------------------------------------------------------------------------------------

def _streams(text: str) -> list[int]:
    values = sorted({int(v) for v in text.split(",") if v.strip()})
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive numbers of streams, e.g. 1,8,32,64")
    return values


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive whole number")
    return int(text)


def _names(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [v.strip() for v in text.split(",") if v.strip()]
        unknown = [n for n in names if n not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"{', '.join(unknown)}: choose among {', '.join(allowed)}")
        return names
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.deploy.serving", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", type=Path, default=None, help="a checkpoint folder (default: the bench model)")
    p.add_argument("--streams", type=_streams, default=_streams("1,8,32,64"), help="concurrent streams, e.g. 1,8")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens each request asks for")
    p.add_argument("--requests-per-stream", type=int, default=4, help="requests per stream at each level")
    p.add_argument("--min-requests", type=int, default=64,
                   help="requests at each level at least, so that a few streams are measured over seconds")
    p.add_argument("--repeats", type=_positive, default=3,
                   help="runs of each served level, in turn; the table shows the median run")
    p.add_argument("--engines", type=_names(tuple(ENGINES)), default=list(ENGINES),
                   help=f"comma-separated, of {', '.join(ENGINES)}")
    p.add_argument("--targets", type=_names(TARGETS), default=list(TARGETS),
                   help="triton: its HTTP generate_stream; v1: the web app's /v1/completions")
    p.add_argument("--no-floor", dest="floor", action="store_false", help="leave out transformers' generate")
    p.add_argument("--no-predict", dest="predict", action="store_false",
                   help="leave out the planner's prediction (and the probe model it is measured on)")
    p.add_argument("--train-steps", type=int, default=30, help="steps the default model is trained (0: random)")
    p.add_argument("--client-venv", type=Path, default=DEFAULT_VENV, help="where aiperf is installed")
    p.add_argument("--work-dir", type=Path, default=None, help="keep the entries, logs and aiperf's artifacts here")
    p.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    return p


def run_bench(args: argparse.Namespace, root: Path, say: Callable[[str], None]) -> list[Row]:
    from deploy.hf_export import export_hf
    from bench.deploy.webapp import WebApp

    checkpoint = _checkpoint(args.checkpoint, args.train_steps, root / "train", SERVING_MODEL, say)
    manifest = read_manifest(checkpoint)
    spec = manifest.model_spec()
    say(f"model: {spec.n_layers} layers, d_model {spec.d_model}, head_dim {spec.d_model // spec.n_heads}, "
        f"context {spec.seq_len}; {args.new_tokens} new tokens a request; streams {args.streams}")
    hf_folder = root / "hf"
    export_hf(checkpoint, hf_folder)
    # prompts of 40 tokens, or fewer where the context must also hold the new tokens
    prompt_tokens = min(PROMPT_TOKENS, (spec.seq_len - args.new_tokens) // 2)
    if prompt_tokens < 4:
        raise SystemExit(f"--new-tokens {args.new_tokens} leaves no room for a prompt in the model's context "
                         f"of {spec.seq_len} tokens: ask fewer")
    probing = probe_streams(args.streams) if args.predict else ()
    levels = sorted(set(args.streams) | set(probing))
    requests = {s: max(args.min_requests, s * args.requests_per_stream, 1) for s in levels}
    prompts = bench_prompts(max(requests.values()), hf_folder / "tokenizer.json", prompt_tokens)
    prompts_file = root / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts))
    rows: list[Row] = []

    if args.floor:
        for s in args.streams:
            rows.append(_row(FLOOR, transformers_floor(hf_folder, prompts, s, requests[s], args.new_tokens)))
            say(f"{FLOOR} at {s} streams: {rows[-1].measurement.tokens_per_s:.0f} tokens/s")

    probe, kernels = None, None
    if args.predict:
        kernels = TimedKernels()
        probe = probe_spec(spec)
        # timed now, before any server runs, not when the first prediction asks: a timing beside a client's
        # leftovers or an idle server's threads would be the machine's noise
        device = [[iteration_device(model, kernels, Load(s, prompt_tokens, args.new_tokens), s) for s in levels]
                  for model in (spec, probe)]
        say(f"the model's kernels, timed on this machine with the engine's {kernels.threads} compute threads and "
            f"their operands cycled through {kernels.buffer_bytes // 2**20} MB, take " + ", ".join(
                f"{1e3 * d.value:.2f} ms an iteration at {s} streams" for s, d in zip(levels, device[0])))
        say(f"the probe model: {probe.n_layers} layers at d_model {probe.d_model}")
        probe_checkpoint = _checkpoint(None, args.train_steps, root / "probe", probe, say)
    served, probes = [], []
    for engine in args.engines:
        try:
            served.append(_entry(engine, checkpoint, root / "models", f"bench-{engine}", max(levels)))
            if probe is not None:
                probes.append(_entry(engine, probe_checkpoint, root / "models", f"probe-{engine}", max(levels)))
        except ExportError as exc:  # e.g. vLLM refuses the model or is not installed: said, the others measured
            say(f"engine {engine} left out: {exc}")
            served = [m for m in served if m["engine"] != engine]
    if not served:
        return rows
    with ExitStack() as stack:
        server = LocalTriton.on_free_ports(root / "models", root / "triton").start()
        stack.callback(server.stop)
        client = server.client(timeout_s=600)
        stack.callback(client.close)
        for model in served + probes:
            client.load(model["name"])
        web = None
        if "v1" in args.targets:
            web = stack.enter_context(WebApp(root / "web", {"http_url": server.http_url, "grpc_url": server.grpc_url,
                                                            "metrics_url": server.metrics_url},
                                             root / "models", checkpoint, manifest.to_dict(), manifest.step,
                                             served + probes))

        def measure(target: Target, streams: int, probing: bool = False, run: int = 1) -> Measurement:
            slug = ("probe-" if probing else "") + target.label.replace(" · ", "-").replace(" ", "-").replace("/", "")
            artifacts = f"{slug}-{streams}" + (f"-run{run}" if run > 1 else "")
            return profile(target, streams, requests[streams], args.new_tokens, hf_folder, prompts_file,
                           root / "aiperf" / artifacts, TEMPERATURE, args.client_venv)

        predictions: dict[str, PathPrediction] = {}
        for model in probes:
            for target in _targets(args.targets, [model], server, web):  # labelled as the served model's path
                measured = [measure(target, s, probing=True) for s in probing]
                predictions[target.label] = predict_path(
                    spec, probe, kernels, prompt_tokens, args.new_tokens,
                    [(m.streams, m.itl_ms / 1e3, m.ttft_ms / 1e3) for m in measured], measured[-1].decoding)
                host = predictions[target.label].host
                say(f"probe through {target.label}: " + ", ".join(
                    f"{m.itl_ms:.2f} ms a token at {m.streams} streams ({m.decoding:.1f} decoding at once)"
                    for m in measured) +
                    f"; host costs {1e3 * host.step_s:.2f} ms an iteration, {1e3 * host.token_s:.3f} ms a token, "
                    f"{1e3 * host.request_s:.1f} ms a request, {1e3 * host.queue_s:.2f} ms for each request ahead "
                    f"in a burst")
        runs: dict[tuple[str, int], list[Row]] = {}
        for run in range(1, args.repeats + 1):  # in turn, so that a slow spell of the machine spreads over levels
            if kernels is not None and run > 1:
                kernels.time_again()  # beside each round, as the served engine's speed drifts with the machine's
            for s in args.streams:
                for target in _targets(args.targets, served, server, web):
                    measured = measure(target, s, run=run)
                    runs.setdefault((target.label, s), []).append(_row(target.label, measured))
                    say(f"{target.label} at {s} streams, run {run} of {args.repeats}: "
                        f"{measured.tokens_per_s:.0f} tokens/s, {measured.errors} errors")
        for (label, s), level in runs.items():  # predicted from the kernels' medians over all rounds
            path = predictions.get(label)
            rows.append(replace(median_run(level), predicted=path.tokens_per_s(s) if path else None))
    return rows


def _checkpoint(given: Optional[Path], steps: int, root: Path, spec: ModelSpec, say: Callable[[str], None]) -> Path:
    """``given``, else ``spec`` trained ``steps`` steps in ``root`` (with random weights at 0)."""
    if given:
        return given
    if steps > 0:
        say(f"training the {spec.name} model {steps} steps")
        return trained_checkpoint(root, spec, steps)
    return bench_checkpoint(root / "checkpoint", spec)


def _entry(engine: str, checkpoint: Path, repository: Path, name: str, max_streams: int) -> dict:
    report = export_entry(engine, checkpoint, repository, name, max_streams)
    return {"name": name, "engine": engine, "path": str(repository / name), "report": report}


def _targets(which: list[str], models: list[dict], server: LocalTriton, web) -> list[Target]:
    """The client's targets for ``models``: Triton's HTTP generate_stream and the web app's /v1, as asked."""
    targets = []
    if "triton" in which:
        targets += [triton_generate_target(f"{m['engine']} · Triton HTTP", server.http_url, m["name"], TEMPERATURE)
                    for m in models]
    if "v1" in which:
        targets += [openai_completions_target(f"{m['engine']} · /v1", web.base_url, m["name"], web.api_key)
                    for m in models]
    return targets


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with ExitStack() as stack:
        root = args.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="deploy-bench-")))
        root.mkdir(parents=True, exist_ok=True)
        rows = run_bench(args, root, say)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([{"path": r.path, **asdict(r.measurement), "load": r.load, "runs": list(r.runs),
                                          "predicted": r.predicted} for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
