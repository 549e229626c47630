"""The advice as plain text: one table row a suggestion (each figure before → after, the tokens/s gain), then each
suggestion's reason and formula lines."""
from __future__ import annotations

import textwrap

from trainer.planner.advice.advise import Advice
from trainer.planner.advice.figures import GB, Figures


def _plan_label(f: Figures) -> str:
    p = f.plan
    parts = [f"dp{p.dp}"] + [f"{k}{v}" for k, v in (("tp", p.tp), ("pp", p.pp), ("ep", p.ep)) if v > 1]
    return "×".join(parts) + f" b{p.micro_batch} B{p.global_batch}" + (" zero3" if p.zero_stage == 3 else "")


def _arrow(before: str, after: str) -> str:
    return before if before == after else f"{before} → {after}"


def _row(name: str, b: Figures, a: Figures, gain: float, mark: str) -> tuple[str, ...]:
    return (mark + name, _arrow(f"{b.step_time_s * 1e3:,.1f}", f"{a.step_time_s * 1e3:,.1f}"),
            _arrow(f"{b.peak_memory_bytes / GB:,.2f}", f"{a.peak_memory_bytes / GB:,.2f}") + ("" if a.fits else " !"),
            _arrow(f"{b.mfu:.1%}", f"{a.mfu:.1%}"), _arrow(f"{b.tokens_per_s:,.0f}", f"{a.tokens_per_s:,.0f}"),
            f"{gain:+.1%}")


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def render_advice(advice: Advice) -> str:
    b = advice.baseline
    lines = [f"{advice.model.name or 'model'} on {advice.cluster.name or advice.cluster.gpu.name}, plan "
             f"{_plan_label(b)} ({advice.plan_source}); shape efficiency {b.shape_efficiency:.3f}"
             + ("" if advice.tile_model else " (no tile model: the planner's figures)"), ""]
    header = ("suggestion", "step ms", "memory/GPU GB", "MFU", "tokens/s", "gain")
    rows = [header] + [_row(s.kind, s.before, s.after, s.gain["tokens_per_s"], "* " if s.recommended else "  ")
                       for s in advice.suggestions]
    lines += _table(rows)
    lines.append("(* recommended: at least +0.5 % tokens/s and fits; ! does not fit)")
    for s in advice.suggestions:
        lines += ["", f"{s.kind}: {s.title}"]
        lines += textwrap.wrap(s.reason, 116, initial_indent="  ", subsequent_indent="  ")
        lines += [f"    {line}" for line in s.formula]
        for alt in s.alternatives:
            lines.append(f"    alternative {alt.model.n_layers}×{alt.model.d_model} s{alt.model.seq_len} "
                         f"{_plan_label(alt)}: step {alt.step_time_s * 1e3:,.2f} ms, "
                         f"{alt.peak_memory_bytes / GB:,.2f} GB{'' if alt.fits else ' (does not fit)'}, "
                         f"{alt.tokens_per_s:,.0f} tokens/s")
    lines += [f"note: {n}" for n in advice.notes]
    return "\n".join(lines)
