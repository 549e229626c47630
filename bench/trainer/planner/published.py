"""The planner against published training runs: ``python -m bench.trainer.planner.published``.

For each run of ``published`` it prints the published step time and throughput beside the planner's, the relative
error of the predicted throughput, the predicted peak memory per GPU as expected and at the most (the high end of
its band, by which the planner says whether the plan fits), and whether it fits; then the median and maximum
|error|, and the runs whose fit the planner gets wrong. Runs the sources give memory only for (configurations that
did not fit) have no step time. ``--json`` prints the same as one JSON object. Nothing here is fitted to these runs:
the planner's constants are its own (docs/formulas.md, Compute from the kernels; Memory besides the tensors).
"""
from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass

from trainer.planner.estimate.core import Planner
from trainer.planner.estimate.published import PublishedRun, published_runs


@dataclass(frozen=True)
class Comparison:
    run: PublishedRun
    predicted_s: float
    peak_gb: float          # as expected
    high_gb: float          # at the most
    capacity_gb: float

    @property
    def error(self) -> float | None:
        """Relative error of the predicted throughput: published step / predicted step − 1 (None: no step)."""
        return None if self.run.step_s is None else self.run.step_s / self.predicted_s - 1.0

    @property
    def predicted_fit(self) -> bool:
        return self.high_gb <= self.capacity_gb

    def tflops(self, step_s: float) -> float:
        """Model FLOPs per GPU and second at ``step_s``: what MFU divides by the peak."""
        planner_flops = Planner(self.run.model, self.run.cluster).model_flops_per_token
        return planner_flops * self.run.plan.global_batch * self.run.model.seq_len / step_s \
            / self.run.plan.world_size / 1e12

    def to_dict(self) -> dict:
        return {"run": self.run.name, "source": self.run.source, "published_step_s": self.run.step_s,
                "predicted_step_s": self.predicted_s, "throughput_error": self.error, "peak_gb": self.peak_gb,
                "peak_high_gb": self.high_gb, "capacity_gb": self.capacity_gb, "published_fit": self.run.fit,
                "predicted_fit": self.predicted_fit}


def compare(run: PublishedRun) -> Comparison:
    numbers = Planner(run.model, run.cluster, run.options).evaluate(run.plan)
    return Comparison(run, numbers.step_time.seconds, numbers.peak_bytes / 1e9, numbers.peak_band.high / 1e9,
                      numbers.capacity_bytes / 1e9)


def summary(rows: list[Comparison]) -> dict:
    errors = [abs(r.error) for r in rows if r.error is not None]
    return {"runs": len(errors), "median_abs_error": statistics.median(errors), "max_abs_error": max(errors),
            "fits_missed": [r.run.name for r in rows if r.run.fit and not r.predicted_fit],
            "fits_claimed_wrongly": [r.run.name for r in rows if not r.run.fit and r.predicted_fit]}


def render(rows: list[Comparison]) -> str:
    head = (f"{'run':32} {'source':34} {'step s':>8} {'predicted':>9} {'TFLOP/s':>8} {'predicted':>9} "
            f"{'error':>7} {'peak GB':>8} {'at most':>8} {'of':>5} {'fit':>4} {'fits':>5}")
    lines = [head, "-" * len(head)]
    for r in rows:
        published = (f"{r.run.step_s:8.2f} {r.predicted_s:9.2f} {r.tflops(r.run.step_s):8.1f} "
                     f"{r.tflops(r.predicted_s):9.1f} {r.error:+7.1%}" if r.error is not None else
                     f"{'—':>8} {r.predicted_s:9.2f} {'—':>8} {r.tflops(r.predicted_s):9.1f} {'—':>7}")
        lines.append(f"{r.run.name:32} {r.run.source:34} {published} {r.peak_gb:8.1f} {r.high_gb:8.1f} "
                     f"{r.capacity_gb:5.1f} {'yes' if r.run.fit else 'no':>4} {'yes' if r.predicted_fit else 'NO':>5}")
    s = summary(rows)
    lines += ["", f"throughput error over {s['runs']} runs: median |error| {s['median_abs_error']:.1%}, "
                  f"max {s['max_abs_error']:.1%}",
              "runs that fit but are predicted not to: " + (", ".join(s["fits_missed"]) or "none"),
              "runs that did not fit but are predicted to: " + (", ".join(s["fits_claimed_wrongly"]) or "none")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    rows = [compare(run) for run in published_runs()]
    if args.json:
        print(json.dumps({"runs": [r.to_dict() for r in rows], "summary": summary(rows)}, indent=2))
    else:
        print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
