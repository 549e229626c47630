"""Plain-text tables of an estimate: each figure with its value, unit and formula, indented by where it comes from."""
from __future__ import annotations

from trainer.planner.estimate.figure import Figure, walk

_SCALE = {"bytes": (1e9, "GB"), "FLOP": (1e12, "TFLOP"), "FLOP/token": (1e9, "GFLOP/token"),
          "parameters": (1e6, "M params"), "fraction": (0.01, "%")}


def human(value: float, unit: str) -> str:
    if unit in _SCALE:
        div, name = _SCALE[unit]
        return f"{value / div:,.3f} {name}"
    if unit == "s" and value < 1:
        return f"{value * 1e3:,.3f} ms"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,} {unit}"
    return f"{value:,.4g} {unit}"


def figure_rows(name: str, figure: Figure, max_depth: int = 2) -> list[tuple[str, str, str]]:
    rows = []
    for path, depth, f in walk(figure, name, 0, max_depth):
        label = "  " * depth + path.rsplit(".", 1)[-1]
        rows.append((label, human(f.value, f.unit), f.formula))
    return rows


def table(rows: list[tuple[str, str, str]], title: str = "") -> str:
    if not rows:
        return ""
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [title, "-" * len(title)] if title else []
    lines += [f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]
    return "\n".join(lines)


def render_estimate(est, depth: int = 2) -> str:
    """The whole estimate as sections: parameters, FLOPs, memory per stage, time, budget, warnings."""
    p, c = est.plan, est.cluster
    out = [f"{est.model.name or 'model'} on {c.name or c.gpu.name}: dp={p.dp} tp={p.tp} pp={p.pp} b={p.micro_batch} "
           f"B={p.global_batch} m={p.grad_accum} sp={p.sequence_parallel} {p.engine}/zero{p.zero_stage} "
           f"ckpt={p.activation_checkpointing} {p.precision} {p.pipeline_schedule} v={p.virtual_stages}"
           + (f" stage_layers={list(p.stage_layers)}" if p.stage_layers else "")
           + (f" first/last_stage_layers={p.first_stage_layers}/{p.last_stage_layers}"
              if p.first_stage_layers or p.last_stage_layers else ""), ""]
    out.append(table([r for n, f in est.parameters.items() for r in figure_rows(n, f, 0)], "Parameters"))
    out.append("")
    out.append(table([r for n, f in est.flops.items() for r in figure_rows(n, f, 0)], "FLOPs"))
    for st in est.memory["stages"]:
        rows = []
        for name in ("weights", "gradients", "optimizer", "activations", "buffers", "overhead"):
            rows += figure_rows(name, st[name], depth if name != "activations" else depth + 1)
        rows += figure_rows("total", st["total"], 0)
        layers = ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in st.get("layers", []))
        held = f", layers {layers}" if est.plan.pp > 1 and layers else ""
        out += ["", table(rows, f"Memory per GPU, pipeline stage {st['stage']} (rank {st['rank']}{held})")]
    peak = est.memory["peak"]
    out += ["", f"Peak: {human(peak.value, 'bytes')} on rank {est.memory['peak_rank']} "
                f"(stage {est.memory['peak_stage']}) of {human(est.memory['capacity'].value, 'bytes')}: "
                f"{'fits' if est.memory['fits'] else 'DOES NOT FIT'}"]
    band = est.memory["band"]
    if band["high"] > band["low"]:
        out.append(f"  from {human(band['low'], 'bytes')} to {human(band['high'], 'bytes')} as the overheads turn "
                   f"out; it fits only if the high end does")
    rows = figure_rows("step", est.time["step"], 1)
    for name in ("tokens_per_s", "mfu", "hfu"):
        rows += figure_rows(name, est.time[name], 0)
    out += ["", table(rows, "Time")]
    if est.budget:
        out += ["", table([r for n, f in est.budget.items() for r in figure_rows(n, f, 0)], "Token budget")]
    for w in est.warnings:
        out.append(f"warning: {w}")
    return "\n".join(out)
