"""The planner's answers as the wizard shows them: figures with their formulas, memory as a stacked bar, the tuner's
ranking, Pareto front and rejections. Only presentation: every number comes from the planner's JSON."""
from __future__ import annotations

import json
from typing import Any

from trainer.planner.estimate.explain import run_time
from trainer.planner.estimate.render import human

# The parts of a rank's memory, in the planner's order, with the words the legend uses.
SEGMENTS = (("weights", "parameters"), ("gradients", "gradients"), ("optimizer", "optimizer states"),
            ("activations", "activations"), ("buffers", "buffers"), ("overhead", "overhead"))
TERM_DEPTH = 2  # how deep a formula's terms unfold under it; the REST answer has them all
CHART_WIDTH, CHART_HEIGHT, CHART_PAD, CHART_LEFT = 520, 260, 40, 84  # the left margin holds the times
_BYTES = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))  # decimal, as the planner's GB (memory_gb · 1e9)
CPU_PRESET = "cpu"  # the device preset of local CPU ranks (trainer.contract.gpus): each rank is a process
CURRENCY = "USD"   # what a cost per GPU-hour is given in, and so every cost the wizard shows
# How the tuner begins the reason of a plan it estimated and found too large (trainer.planner.tune.search's
# memory_reason); every other reason is a rule that cut choices before any plan was estimated.
OUT_OF_MEMORY = "out of memory"


def amount(value: float, unit: str) -> str:
    """A figure's value as text: bytes in the unit that suits them (a tiny model's MB, a large one's GB), the rest
    as the planner's own tables write them."""
    if unit == "bytes":
        for size, name in _BYTES:
            if abs(value) >= size:
                return f"{value / size:,.3g} {name}" if abs(value) / size < 1000 else f"{value / size:,.0f} {name}"
        return f"{value:,.0f} bytes"
    return human(value, unit)


def _is_figure(value: Any) -> bool:
    return isinstance(value, dict) and {"value", "unit", "formula"} <= set(value)


def _terms(terms: dict, depth: int) -> list[dict]:
    rows = []
    for name, term in terms.items():
        if _is_figure(term):
            rows.append({"name": name, "text": amount(term["value"], term["unit"]), "formula": term["formula"],
                         "terms": _terms(term.get("terms", {}), depth - 1) if depth > 1 else []})
        else:
            rows.append({"name": name, "text": f"{term:,}" if isinstance(term, (int, float))
                         and not isinstance(term, bool) else str(term), "formula": "", "terms": []})
    return rows


def figure(key: str, label: str, fig: dict, text: str | None = None) -> dict:
    """One figure: its label, its value as text, its formula and its terms (the ``<details>`` under it)."""
    return {"key": key, "label": label, "value": fig["value"], "unit": fig["unit"],
            "text": text if text is not None else amount(fig["value"], fig["unit"]),
            "formula": fig["formula"], "terms": _terms(fig.get("terms", {}), TERM_DEPTH)}


def duration(seconds: float) -> str:
    """Seconds as a reader counts them: 292.3 s → 4.9 min, 9e5 s → 10.4 days."""
    for size, name in ((86400 * 365, "years"), (86400, "days"), (3600, "h"), (60, "min")):
        if seconds >= 2 * size:
            return f"{seconds / size:,.1f} {name}"
    return human(seconds, "s")


def _percent(part: float, whole: float) -> str:
    """A CSS width: a share of ``whole`` as a percentage with a dot, whatever the locale."""
    return f"{100 * part / whole:.3f}%" if whole > 0 else "0%"


def ranks(cluster: dict) -> dict:
    """What the cluster's ranks are called, and what the memory a rank is held against is: a GPU and its memory,
    or, on the cpu preset, a process and the memory that preset plans for each (not this machine's memory)."""
    gpu = cluster["gpu"]["name"]
    if gpu == CPU_PRESET:
        return {"one": "process", "many": "processes", "kind": "CPU", "hour": "process-hour",
                "capacity": "the memory the cpu preset plans for each process (not this machine's memory)"}
    return {"one": "GPU", "many": "GPUs", "kind": gpu, "hour": "GPU-hour", "capacity": f"the {gpu}'s memory"}


def memory_view(answer: dict) -> dict:
    """The busiest rank's memory against its device's: the stacked segments, the legend and the stages."""
    memory = answer["memory"]
    rank = ranks(answer["cluster"])
    stages = memory["stages"]
    stage = next((s for s in stages if s["stage"] == memory["peak_stage"]), stages[0])
    capacity, total = memory["capacity"]["value"], stage["total"]["value"]
    scale = max(capacity, total)
    segments = []
    for key, label in SEGMENTS:
        part = stage[key]
        segments.append({**figure(key, label, part), "of_device": _percent(part["value"], scale),
                         "of_total": _percent(part["value"], total),
                         "share": f"{100 * part['value'] / total:.1f} %" if total else "0 %"})
    return {"segments": segments, "total": figure("total", f"peak per {rank['one']}", memory["peak"]),
            "stage_total": figure("total", "total", stage["total"]),
            "capacity": figure("capacity", f"memory per {rank['one']}", memory["capacity"]),
            "used": f"{100 * total / capacity:.2f} %" if capacity else "–",
            # the range the GPU's overheads give (none on the cpu preset, which has no caching allocator)
            "band": ({end: amount(memory["band"][end], "bytes") for end in ("low", "high")}
                     if memory["band"]["high"] > memory["band"]["low"] else None),
            "capacity_at": _percent(capacity, scale), "fits": memory["fits"], "rank": memory["peak_rank"],
            "stage": stage["stage"], "rule": memory.get("rank_rule", ""),
            "stages": [{"stage": s["stage"], "rank": s["rank"], "total": amount(s["total"]["value"], "bytes"),
                        "layers": layers_text(s.get("layers", [])), "peak": s["stage"] == stage["stage"]}
                       for s in stages] if len(stages) > 1 else []}


def layers_text(spans: list) -> str:
    """A rank's layers as the planner lists them, [first, last] of each chunk: "0–3", or "0–1, 6–7" for chunks."""
    return ", ".join(f"{a}–{b}" if b > a else str(a) for a, b in spans)


def plan_shape(plan: dict) -> str:
    """How the ranks are shared out: dp × cp × tp × pp, with cp only where it is used."""
    axes = [("dp", plan["dp"])] + ([("cp", plan["cp"])] if plan.get("cp", 1) > 1 else []) + \
        [("tp", plan["tp"]), ("pp", plan["pp"])]
    return " × ".join(f"{name} {n}" for name, n in axes)


def estimate_view(answer: dict | None, steps: int | None) -> dict | None:
    """What the estimate panel shows, or None when there is no estimate (the fields' errors say why)."""
    if answer is None:
        return None
    time = answer["time"]
    step = time["step"]
    figures = [figure("step-time", "step time", step), figure("tokens-per-s", "tokens/s", time["tokens_per_s"]),
               figure("mfu", "MFU", time["mfu"]), figure("hfu", "HFU (with recompute)", time["hfu"])]
    ring = step.get("terms", {}).get("context_parallel")
    if isinstance(ring, dict) and ring.get("value"):
        figures.append(figure("context-parallel", "context parallel's K/V ring, not hidden", ring))
    if steps and steps > 0:
        run = run_time(steps, step).to_dict()
        figures.append(figure("run-time", "this run's training", run, duration(run["value"])))
    plan, cluster = answer["plan"], answer["cluster"]
    rank = ranks(cluster)
    budget = []
    if answer.get("budget"):
        b = answer["budget"]
        cost_rate = cluster.get("gpu_hour_cost", 0.0)
        cost = (f"{b['cost']['value']:,.2f} {CURRENCY} (at {cost_rate:,.4g} {CURRENCY} per {rank['hour']})"
                if cost_rate else "– (give a cost per GPU-hour)")
        budget = [figure("budget-steps", "steps", b["steps"]),
                  figure("budget-time", "time", b["time"], duration(b["time"]["value"])),
                  figure("budget-gpu-hours", f"{rank['hour']}s", b["gpu_hours"],
                         f"{b['gpu_hours']['value']:,.4g} {rank['hour']}s"),
                  figure("cost", "cost", b["cost"], cost)]
    return {"memory": memory_view(answer), "figures": figures, "budget": budget,
            "budget_tokens": human(answer["budget"]["tokens"]["value"], "tokens") if budget else "",
            "parameters": figure("parameters", "parameters", answer["parameters"]["total"]),
            "warnings": answer.get("warnings", []), "ranks": rank,
            "world": cluster["nodes"] * cluster["gpus_per_node"], "shape": plan_shape(plan),
            "grad_accum": plan["global_batch"] // (plan["micro_batch"] * plan["dp"])}


# -- the tuner ----------------------------------------------------------------------------------------------------

def _key(plan: dict) -> str:
    return json.dumps({k: v for k, v in plan.items() if k != "schema_version"}, sort_keys=True)


def plan_summary(plan: dict) -> str:
    cp = f" cp={plan['cp']}" if plan.get("cp", 1) > 1 else ""
    parts = [f"dp={plan['dp']}{cp} tp={plan['tp']} pp={plan['pp']}", f"micro_batch={plan['micro_batch']}",
             f"{plan['engine']} ZeRO-{plan['zero_stage']}", plan["precision"],
             f"checkpointing {plan['activation_checkpointing']}"]
    if plan["sequence_parallel"]:
        parts.append("sequence parallel")
    if plan["ep"] > 1:
        parts.append(f"ep={plan['ep']}")
    if plan["pp"] > 1:
        parts.append(plan["pipeline_schedule"] + (f" v={plan['virtual_stages']}" if plan["virtual_stages"] > 1
                                                  else ""))
        layout = plan.get("stage_layers") or [n for n in (plan.get("first_stage_layers"), plan.get("last_stage_layers"))
                                              if n]
        if layout:
            parts.append(("layers " if plan.get("stage_layers") else "first/last stage layers ")
                         + "/".join(map(str, layout)))
    if plan["offload_optimizer"] or plan["offload_params"]:
        parts.append("offload " + " and ".join(n for n, on in (("optimizer", plan["offload_optimizer"]),
                                                                ("parameters", plan["offload_params"])) if on))
    return " · ".join(parts)


def _candidate(rank: int | None, candidate: dict, front: set[str]) -> dict:
    plan = candidate["plan"]
    return {"rank": rank, "summary": plan_summary(plan), "pareto": _key(plan) in front,
            "memory": amount(candidate["peak_memory_bytes"], "bytes"), "memory_bytes": candidate["peak_memory_bytes"],
            "step": human(candidate["step_time_s"], "s"), "step_s": candidate["step_time_s"],
            "mfu": human(candidate["mfu"], "fraction"), "tokens_per_s": human(candidate["tokens_per_s"], "tokens/s"),
            "json": json.dumps({k: v for k, v in plan.items() if k != "schema_version"})}


def _chart(points: list[dict]) -> dict:
    """Memory (x) against step time (y) of the listed plans, the front's members joined by a line."""
    if not points:
        return {}
    xs, ys = [p["memory_bytes"] for p in points], [p["step_s"] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    inner_w, inner_h = CHART_WIDTH - CHART_LEFT - CHART_PAD, CHART_HEIGHT - 2 * CHART_PAD

    def at(p):
        fx = (p["memory_bytes"] - x0) / (x1 - x0) if x1 > x0 else 0.5
        fy = (p["step_s"] - y0) / (y1 - y0) if y1 > y0 else 0.5
        return round(CHART_LEFT + fx * inner_w, 1), round(CHART_HEIGHT - CHART_PAD - fy * inner_h, 1)

    dots = [{"x": at(p)[0], "y": at(p)[1], "pareto": p["pareto"], "label": f"{p['summary']}: {p['memory']}, "
                                                                          f"{p['step']}"} for p in points]
    front = sorted((p for p in points if p["pareto"]), key=lambda p: p["memory_bytes"])
    return {"width": CHART_WIDTH, "height": CHART_HEIGHT, "dots": dots,
            "line": " ".join(f"{at(p)[0]},{at(p)[1]}" for p in front),
            "left": CHART_LEFT, "right": CHART_WIDTH - CHART_PAD, "top": CHART_PAD,
            "bottom": CHART_HEIGHT - CHART_PAD, "x_min": amount(x0, "bytes"), "x_max": amount(x1, "bytes"),
            "y_min": human(y0, "s"), "y_max": human(y1, "s"), "label_y": CHART_HEIGHT - CHART_PAD + 18,
            "title_y": CHART_HEIGHT - 6, "mid_x": (CHART_LEFT + CHART_WIDTH - CHART_PAD) / 2}


def tune_view(result: dict) -> dict:
    """The ranked plans, the memory/step-time Pareto front and the rejections grouped by reason.

    The tuner's rejections count two things: plans it estimated and found too large (every estimated plan either
    fits or is one of these), and choices the rules cut before any plan was built (one cut may remove a whole
    branch of plans). They are told apart here so that the counts shown add up."""
    front_keys = {_key(c["plan"]) for c in result["pareto"]}
    rows = [_candidate(i + 1, c, front_keys) for i, c in enumerate(result["top"])]
    ranked = {_key(c["plan"]): i + 1 for i, c in enumerate(result["top"])}
    front = [{**_candidate(ranked.get(_key(c["plan"])), c, front_keys)} for c in result["pareto"]]
    front.sort(key=lambda c: c["memory_bytes"])
    shown = {r["json"]: r for r in rows + front}
    rejected = sorted(result["rejected"].items(), key=lambda kv: -kv[1])
    too_large = [(reason, n) for reason, n in rejected if reason.startswith(OUT_OF_MEMORY)]
    excluded = [(reason, n) for reason, n in rejected if not reason.startswith(OUT_OF_MEMORY)]
    return {"evaluated": result["evaluated"], "fitting": result["fitting"], "rows": rows, "front": front,
            "ranks": ranks(result["cluster"]),
            "chart": _chart(list(shown.values())), "too_large": too_large,
            "too_large_total": result["evaluated"] - result["fitting"], "excluded": excluded,
            "excluded_total": sum(n for _, n in excluded), "note": result.get("note", ""),
            "elapsed": human(result.get("elapsed_s", 0.0), "s"), "global_batches": result["global_batches"]}
