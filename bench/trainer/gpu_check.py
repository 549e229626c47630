"""One GPU, one unattended run: training MFU, the planner's peak memory and KV-cache decode speed, against targets.

    python -m bench.trainer.gpu_check [--out DIR] [--model gpt3-1.3b] [--steps 20] [--warmup 5]
        [--micro-batch B] [--checkpointing none] [--device cuda] [--gpu H200-SXM]
        [--decode-batches 1,16,64] [--prompt-len 512] [--decode-tokens 128] [--text FILE]

1. Trains the model in bf16 (autocast over fp32 weights) for a few steps through the project's own trainer
   (``trainer.engine.loop.run``) on the demo corpus, with the largest micro-batch the planner says fits with room
   to spare; reports the median MFU after warm-up (target 45 %) and the allocator's peak against the planner's peak
   for the same plan (target: within 5 %).
2. Decodes with a KV cache (random bf16 weights, greedy) at several batch sizes and a fixed prompt, against the
   planner's HBM-bandwidth bound (target 60 % of it).
3. Prints a summary: each target, the figure reached, pass/fail, and what limits a missed one.

Everything lands in DIR/gpu_check.json. The same code runs on a CPU with a small model (``--model tiny --device
cpu``): the trainer's own byte counts stand in for the allocator's peak there, and the figures use the CPU device of
``presets.local_cpu_cluster``. Only long-stable public torch APIs are used, and nothing of DeepSpeed.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from bench.trainer import gpu_figures as G
from bench.trainer.common import fresh, sample_text
from trainer.contract import ClusterSpec, DatasetSpec, ModelSpec, OptimizerSpec, ParallelPlan, RunSpec
from trainer.contract.presets import MODELS, cluster, local_cpu_cluster
from trainer.contract.runfolder import METRICS, read_jsonl
from trainer.data import load_tokens, prepare_dataset
from trainer.engine.loop import run
from trainer.model import GPT, KVCache
from trainer.planner.estimate import Planner, PlanNumbers, count
from trainer.planner.estimate.flops import mfu, model_flops_per_step

MICRO_BATCHES = (16, 12, 8, 4, 2, 1)  # tried largest first: larger matmuls run nearer peak
HEADROOM = 0.7                         # a chosen plan's planned peak leaves 30 % of the GPU for the planner's error
TOKENIZER_VOCAB = 4096                 # a BPE this size trains in seconds on the sample text; ids fit any preset
RESULT = "gpu_check.json"



class _Clock:
    """Seconds since ``main`` started, for the progress lines of an unattended run."""

    start = time.perf_counter()

    @classmethod
    def elapsed(cls) -> float:
        return time.perf_counter() - cls.start


def log(message: str) -> None:
    print(f"[{_Clock.elapsed():7.1f} s] {message}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.trainer.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "gpu-check"))
    p.add_argument("--model", default="gpt3-1.3b", choices=sorted(MODELS))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the medians")
    p.add_argument("--micro-batch", type=int, default=0, help="0: the largest the planner fits with headroom")
    p.add_argument("--checkpointing", default="none", choices=("none", "selective", "full"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--gpu", default="H200-SXM", help="the GPU preset the figures use on CUDA")
    p.add_argument("--decode-batches", default="1,16,64")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--decode-repeats", type=int, default=3, help="timed decodes per batch (the median is kept)")
    p.add_argument("--text", default="", help="training text (default: the demo corpus, first 300 kB)")
    p.add_argument("--prepared-dir", default="", help="where the tokenized text goes (default: OUT/prepared)")
    return p.parse_args(argv)


# ---- set-up -------------------------------------------------------------------------------------------------

def resolve_device(name: str) -> torch.device:
    # the trainer trains on CUDA whenever CUDA is visible, so a CPU run must hide it rather than ask for the CPU
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible")
    if name == "cpu" and torch.cuda.is_available():
        raise SystemExit("--device cpu: the trainer uses CUDA when it is visible; run with CUDA_VISIBLE_DEVICES=")
    return torch.device(name, 0) if name == "cuda" else torch.device("cpu")


def check_cluster(device: torch.device, gpu: str) -> ClusterSpec:
    return cluster(gpu, 1, gpus_per_node=1) if device.type == "cuda" else local_cpu_cluster(1)


def bf16_plan(micro_batch: int, checkpointing: str) -> ParallelPlan:
    return ParallelPlan(micro_batch=micro_batch, global_batch=micro_batch, precision="bf16",
                        activation_checkpointing=checkpointing)


def choose_plan(model: ModelSpec, clu: ClusterSpec, micro_batch: int = 0,
                checkpointing: str = "none") -> tuple[ParallelPlan, PlanNumbers]:
    """The given micro-batch if the planner says it fits; else the largest of MICRO_BATCHES within HEADROOM."""
    planner = Planner(model, clu)
    for b in (micro_batch,) if micro_batch else MICRO_BATCHES:
        numbers = planner.evaluate(bf16_plan(b, checkpointing))
        if numbers.peak_bytes <= (1.0 if micro_batch else HEADROOM) * numbers.capacity_bytes:
            return numbers.plan, numbers
    raise SystemExit(f"no micro-batch of {model.name} with checkpointing={checkpointing} fits on {clu.gpu.name} "
                     f"by the planner ({numbers.peak_bytes / 1e9:.1f} GB at micro-batch {numbers.plan.micro_batch})")


def prepared_dataset(out: Path, model: ModelSpec, text: str, prepared_dir: str) -> DatasetSpec:
    """The sample text tokenized by a BPE no larger than the model's vocabulary, its ids checked against it."""
    spec = DatasetSpec(path=str(Path(text) if text else sample_text(out)),
                       prepared_dir=prepared_dir or str(out / "prepared"),
                       tokenizer_vocab=min(model.vocab_size, TOKENIZER_VOCAB))
    data = prepare_dataset(spec, model.vocab_size)
    top = int(np.max(load_tokens(data.train_path)))
    if top >= model.vocab_size:
        raise SystemExit(f"token id {top} is outside {model.name}'s vocabulary of {model.vocab_size}")
    return spec


# ---- 1. training ----------------------------------------------------------------------------------------------

def train(model: ModelSpec, plan: ParallelPlan, clu: ClusterSpec, dataset: DatasetSpec, run_dir: Path,
          steps: int) -> list[dict]:
    """The project's trainer on ``plan`` for ``steps`` steps, no checkpoints; metrics.jsonl's records."""
    spec = RunSpec(model=model, plan=plan, cluster=clu, dataset=dataset, output_dir=str(run_dir), steps=steps,
                   optimizer=OptimizerSpec(lr=3e-4, warmup_steps=2), name="gpu-check").validate()
    run(spec, fresh(run_dir), resume=False)
    return [r for _, r in read_jsonl(run_dir / METRICS)]


def allocator_peak(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def training_result(model: ModelSpec, clu: ClusterSpec, numbers: PlanNumbers, measured: dict) -> tuple[dict, list]:
    """The measured and planned figures side by side, and the two target rows."""
    plan = numbers.plan
    got, planned = G.compared_parts(measured, numbers)
    peak, planned_peak = sum(got.values()), sum(planned.values())
    floor = G.memory_floor_share(count(model).total, measured["step_time_s"], plan.grad_accum,
                                 clu.gpu.memory_bandwidth_gbs * 1e9)
    predicted_mfu = mfu(model_flops_per_step(model, plan.global_batch), numbers.step_time.seconds,
                        clu.gpu.peak_tflops, plan.world_size)
    rows = [G.mfu_row(measured["mfu"], G.mfu_limit(floor, plan.activation_checkpointing, predicted_mfu)),
            G.memory_row(peak, planned_peak, G.memory_limit(got, planned))]
    result = {**measured, "planned_step_time_s": numbers.step_time.seconds, "planned_mfu": predicted_mfu,
              "memory_floor_share": floor, "peak_bytes": peak, "planned_peak_bytes": planned_peak,
              "planned_full_peak_bytes": numbers.peak_bytes, "capacity_bytes": numbers.capacity_bytes,
              "memory_basis": "allocator peak" if "rest" in got else "model states + activations (no allocator)",
              "measured_parts": got, "planned_parts": planned}
    return result, rows


def print_training(model: ModelSpec, r: dict) -> None:
    print(f"\n1. training {model.name}, bf16 autocast, {r['timed_steps']} of {r['steps']} steps timed (median)")
    print(f"   {'':24} {'measured':>14} {'planner':>14}")
    print(f"   {'step time (s)':24} {r['step_time_s']:14.4f} {r['planned_step_time_s']:14.4f}")
    print(f"   {'MFU':24} {r['mfu']:14.3f} {r['planned_mfu']:14.3f}   target ≥ {G.MFU_TARGET:.2f}")
    for name in r["measured_parts"]:
        print(f"   {name + ' (GB)':24} {r['measured_parts'][name] / 1e9:14.3f} {r['planned_parts'][name] / 1e9:14.3f}")
    print(f"   {'peak (GB)':24} {r['peak_bytes'] / 1e9:14.3f} {r['planned_peak_bytes'] / 1e9:14.3f}   "
          f"target error ≤ {G.MEMORY_ERROR_TARGET:.2f} ({r['memory_basis']})")
    print(f"   loss {r['loss_first']:.3f} → {r['loss_last']:.3f}", flush=True)


# ---- 2. decoding ----------------------------------------------------------------------------------------------

def decode_model(model: ModelSpec, device: torch.device) -> GPT:
    """The architecture with torch's default random initialisation, made on the device (quicker than the
    trainer's seeded init, and the weights' values do not change a decode step's time), in bf16, for inference."""
    torch.manual_seed(0)
    with torch.device(device):
        net = GPT(model)
    return net.to(torch.bfloat16).eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def decode_once(net: GPT, prompt: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """(prefill seconds, seconds of ``new_tokens`` greedy decode steps). The next token stays on the device, so
    the host may queue steps ahead, as a server's loop would."""
    device = prompt.device
    _sync(device)
    t0 = time.perf_counter()
    cache = KVCache()
    logits = net(prompt, cache)[:, -1]
    _sync(device)
    t1 = time.perf_counter()
    for _ in range(new_tokens):
        logits = net(logits.argmax(dim=-1, keepdim=True), cache)[:, -1]
    _sync(device)
    return t1 - t0, time.perf_counter() - t1


def time_decode(net: GPT, batch: int, prompt_len: int, new_tokens: int, repeats: int) -> dict:
    device = next(net.parameters()).device
    gen = torch.Generator().manual_seed(batch)
    prompt = torch.randint(0, net.spec.vocab_size, (batch, prompt_len), generator=gen).to(device)
    decode_once(net, prompt, min(new_tokens, 8))  # warm-up: kernels chosen, the allocator grown
    runs = [decode_once(net, prompt, new_tokens) for _ in range(repeats)]
    decode_s = statistics.median(d for _, d in runs)
    return {"batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
            "prefill_s": statistics.median(p for p, _ in runs), "decode_s": decode_s,
            "step_s": decode_s / new_tokens, "tokens_per_s": batch * new_tokens / decode_s}


def decode_result(model: ModelSpec, clu: ClusterSpec, measured: list[dict]) -> tuple[list[dict], list]:
    prompt, new = measured[0]["prompt_len"], measured[0]["new_tokens"]
    bounds = {m["batch"]: G.decode_bound(model, clu, m["batch"], prompt, new) for m in measured}
    copies = {m["batch"]: G.decode_bound(model, clu, m["batch"], prompt, new, copying=True) for m in measured}
    rows = G.decode_rows(measured, bounds, copies, model.n_layers)
    table = [{**m, "bound_tokens_per_s": bounds[m["batch"]], "bound_with_cache_copy_tokens_per_s": copies[m["batch"]],
              "fraction_of_bound": m["tokens_per_s"] / bounds[m["batch"]]} for m in measured]
    return table, rows


def print_decode(model: ModelSpec, table: list[dict]) -> None:
    t = table[0]
    print(f"\n2. KV-cache decode {model.name}, bf16, prompt {t['prompt_len']}, {t['new_tokens']} new tokens (median)")
    print(f"   {'batch':>5} {'ms/step':>9} {'tokens/s':>12} {'HBM bound':>12} {'fraction':>9} {'bound w/ copy':>14}")
    for r in table:
        print(f"   {r['batch']:5d} {r['step_s'] * 1e3:9.3f} {r['tokens_per_s']:12,.0f} "
              f"{r['bound_tokens_per_s']:12,.0f} "
              f"{r['fraction_of_bound']:9.3f} {r['bound_with_cache_copy_tokens_per_s']:14,.0f}")
    print(f"   target fraction ≥ {G.DECODE_FRACTION_TARGET:.2f}", flush=True)


# ---- the run --------------------------------------------------------------------------------------------------

def environment(device: torch.device) -> dict:
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}


def train_what_fits(model: ModelSpec, clu: ClusterSpec, numbers: PlanNumbers, dataset: DatasetSpec, run_dir: Path,
                    steps: int) -> tuple[PlanNumbers, list[dict], list[int]]:
    """Train the chosen plan; should the planner have been wrong and it runs out of memory, the next smaller
    micro-batch, so that one unattended run still ends with figures. Returns the plan's numbers, the metrics
    records and the micro-batches that ran out of memory."""
    failed: list[int] = []
    while True:
        try:
            return numbers, train(model, numbers.plan, clu, dataset, run_dir, steps), failed
        except torch.cuda.OutOfMemoryError:
            failed.append(numbers.plan.micro_batch)
        smaller = [b for b in MICRO_BATCHES if b < failed[-1]]
        if not smaller:
            raise SystemExit(f"{model.name} ran out of memory at every micro-batch down to {failed[-1]}")
        gc.collect()  # outside the except block: the traceback's frames, and the tensors they hold, are gone
        torch.cuda.empty_cache()
        numbers = Planner(model, clu).evaluate(bf16_plan(smaller[0], numbers.plan.activation_checkpointing))
        log(f"out of memory at micro-batch {failed[-1]} (planner: {numbers.peak_bytes / 1e9:.1f} GB would fit); "
            f"again at micro-batch {smaller[0]}")


def training_section(args: argparse.Namespace, out: Path, model: ModelSpec, clu: ClusterSpec,
                     device: torch.device) -> tuple[dict, list[G.Row]]:
    plan, numbers = choose_plan(model, clu, args.micro_batch, args.checkpointing)
    log(f"plan: micro-batch {plan.micro_batch}, checkpointing {plan.activation_checkpointing}; planner peak "
        f"{numbers.peak_bytes / 1e9:.1f} of {numbers.capacity_bytes / 1e9:.0f} GB (fits: {numbers.fits})")
    dataset = prepared_dataset(out, model, args.text, args.prepared_dir)
    log(f"data ready ({dataset.tokenizer_vocab}-token BPE); training {args.steps} steps")
    numbers, records, failed = train_what_fits(model, clu, numbers, dataset, out / "train", args.steps)
    measured = G.training_measurement(records, args.warmup)
    measured["max_memory_allocated_bytes"] = allocator_peak(device)
    training, rows = training_result(model, clu, numbers, measured)
    training.update(plan=numbers.plan.to_dict(), out_of_memory_at_micro_batch=failed)
    log("training done")
    print_training(model, training)
    return training, rows


def decode_section(args: argparse.Namespace, model: ModelSpec, clu: ClusterSpec,
                   device: torch.device) -> tuple[list[dict], list[G.Row]]:
    gc.collect()  # the trainer's model and optimizer are gone: give their memory back before the decode model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    net = decode_model(model, device)
    batches = [int(b) for b in args.decode_batches.split(",")]
    log(f"decode model built; timing batches {batches}")
    measured = []
    for b in batches:
        measured.append(time_decode(net, b, args.prompt_len, args.decode_tokens, args.decode_repeats))
        log(f"batch {b}: {measured[-1]['tokens_per_s']:,.0f} tokens/s")
    decode, rows = decode_result(model, clu, measured)
    print_decode(model, decode)
    return decode, rows


def write_result(out: Path, result: dict) -> None:
    """Written after each section, so that a crash later still leaves the figures measured before it."""
    rows = result.get("rows", [])
    result.update(all_passed=bool(rows) and all(r["passed"] for r in rows), wall_s=_Clock.elapsed())
    (out / RESULT).write_text(json.dumps(result, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    _Clock.start = time.perf_counter()
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(args.device)
    model, clu = MODELS[args.model], check_cluster(device, args.gpu)
    if args.prompt_len + args.decode_tokens > model.seq_len:
        raise SystemExit(f"prompt {args.prompt_len} + {args.decode_tokens} new tokens exceed seq_len {model.seq_len}")
    env = environment(device)
    log(f"{env['device_name']}, torch {env['torch']} (CUDA {env['cuda']}); {model.name}: "
        f"{count(model).total / 1e9:.3f} B parameters, seq {model.seq_len}, vocab {model.vocab_size}; "
        f"figures on {clu.gpu.name}")
    result: dict = {"environment": env, "model": model.to_dict(), "cluster": clu.to_dict()}

    training, rows = training_section(args, out, model, clu, device)
    result.update(training=training, rows=[r.to_dict() for r in rows])
    write_result(out, result)
    decode, decode_rows = decode_section(args, model, clu, device)
    rows += decode_rows
    result.update(decode=decode, rows=[r.to_dict() for r in rows])

    print("\n3. summary")
    for line in G.summary_lines(rows):
        print("   " + line)
    if training["out_of_memory_at_micro_batch"]:
        print(f"   the planner fitted micro-batch {training['out_of_memory_at_micro_batch']}, which ran out of memory")
    write_result(out, result)
    log(f"wrote {out / RESULT}")
    if dist.is_initialized():  # the trainer joined a world of one; leave the process as it was found
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
