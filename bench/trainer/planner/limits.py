"""Benchmark: the heaviest requests the contract accepts, timed beside the targets (an estimate under 1 s, a tune
under 10 s on one core).

    python -m bench.trainer.planner.limits

Each case sits at the contract's limits (trainer/contract/rules.py): the widest and deepest model, 2^20 ranks, the
largest batch, the whole search space, the most global batches a tune may list, a cluster whose size has the most
divisors below 2^20. A tune stops at search.MAX_PLANS plans, so its time is bounded whatever the space.
"""
from __future__ import annotations

import time

from trainer.planner.estimate.api import estimate_json
from trainer.planner.tune.api import tune_json
from trainer.planner.tune.space import MAX_LISTED

ESTIMATE_TARGET_S, TUNE_TARGET_S = 1.0, 10.0
WIDEST = {"n_layers": 1024, "d_model": 131072, "n_heads": 4096, "seq_len": 1048576, "vocab_size": 2097152}
MOST_RANKS = {"gpu": "H100-SXM", "nodes": 1024, "gpus_per_node": 1024}
WHOLE_SPACE = {"precisions": ["bf16", "fp16", "fp32"], "engines": ["native", "deepspeed"], "max_micro_batch": 65536,
               "max_virtual_stages": 1024}

ESTIMATES = {
    "widest model, tp×pp = 2^20 ranks": {"model": WIDEST, "cluster": MOST_RANKS, "token_budget": 1e15, "plan": {
        "tp": 1024, "pp": 1024, "micro_batch": 16, "global_batch": 16384, "sequence_parallel": True}},
    "4,096 experts over 2^20 ranks": {"model": {**WIDEST, "n_experts": 4096}, "cluster": MOST_RANKS, "plan": {
        "dp": 1048576, "ep": 4096, "micro_batch": 16, "global_batch": 16777216}},
}
TUNES = {
    "2^20 ranks, the whole space": {"model": {**WIDEST, "d_model": 65536, "n_heads": 1024, "seq_len": 2048},
                                    "cluster": MOST_RANKS, "global_batch": 16777216, "space": WHOLE_SPACE},
    "720,720 ranks (240 divisors)": {"model": {"n_layers": 720, "d_model": 28800, "n_heads": 720, "seq_len": 2048,
                                               "vocab_size": 50000},
                                     "cluster": {"gpu": "H100-SXM", "nodes": 720, "gpus_per_node": 1001},
                                     "global_batch": 14414400, "space": WHOLE_SPACE},
    f"{MAX_LISTED} global batches": {"model": "gpt3-175b", "cluster": {"gpu": "H100-SXM", "nodes": 128},
                                     "global_batch": [512 * (i + 1) for i in range(MAX_LISTED)], "space": WHOLE_SPACE},
}


def _timed(call, payload) -> tuple[float, dict]:
    started = time.perf_counter()
    out = call(payload)
    return time.perf_counter() - started, out


def main() -> int:
    worst = 0.0
    for name, payload in ESTIMATES.items():
        seconds, _ = _timed(estimate_json, payload)
        worst = max(worst, seconds / ESTIMATE_TARGET_S)
        print(f"estimate  {name:40s} {seconds:6.2f} s  target {ESTIMATE_TARGET_S:4.0f} s  "
              f"ratio {seconds / ESTIMATE_TARGET_S:.2f}")
    for name, payload in TUNES.items():
        seconds, out = _timed(tune_json, payload)
        worst = max(worst, seconds / TUNE_TARGET_S)
        print(f"tune      {name:40s} {seconds:6.2f} s  target {TUNE_TARGET_S:4.0f} s  "
              f"ratio {seconds / TUNE_TARGET_S:.2f}  ({out['evaluated']:,} plans{'; capped' if out['note'] else ''})")
    print(f"worst ratio to target: {worst:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
