"""Section 3 of ``python -m trainer.bench``: the activations autograd saves for one micro-batch under none, selective
and full activation checkpointing (measured with saved_tensors_hooks), beside Korthikanti et al.'s per-layer formula
for this layer in fp32 without dropout (docs/formulas.md, Activation memory)."""
from __future__ import annotations

import torch

from trainer.bench.common import bench_model
from trainer.model import build_model, loss_fn
from trainer.parallel.ac import apply_ac
from trainer.profiling.memory import SavedActivations


def saved_activations(micro_batch: int = 2, **model_changes) -> list[dict]:
    spec = bench_model().replace(**model_changes)
    s, b, h, L = spec.seq_len, micro_batch, spec.d_model, spec.n_layers
    rows = []
    x = torch.randint(0, spec.vocab_size, (b, s), generator=torch.Generator().manual_seed(0))
    for mode in ("none", "selective", "full"):
        model = build_model(spec, 0)
        apply_ac(model, mode)
        with SavedActivations(model.parameters()) as probe:
            loss = loss_fn(model(x), x)
        loss.backward()
        rows.append({"mode": mode, "bytes": probe.bytes})
    # Korthikanti Table 2 for fp32 without dropout: every 2-byte term doubles, mask terms vanish:
    # s·b·h·(34 − 2)·2 + the attention scores 5·a·s²·b → (4·a·s²·b for softmax in/out in fp32, 0 with a fused kernel)
    korthikanti_none = L * s * b * h * 32 * 2
    korthikanti_full = L * 2 * s * b * h * 2
    for r in rows:
        r["ratio_to_none"] = rows[0]["bytes"] / r["bytes"]
    return rows + [{"formula_layers_none_fused_attention": korthikanti_none,
                    "formula_layers_full": korthikanti_full}]
