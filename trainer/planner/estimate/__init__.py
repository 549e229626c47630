"""The planner: parameters, FLOPs, memory per GPU and step time for a (model, plan, cluster). Standard library only.

    estimate(model, plan, cluster, options=None, token_budget=None) -> Estimate   (Estimate.to_dict() is JSON)
    inference_estimate(model, cluster, tp=1, batch=1, context=None, precision="bf16") -> InferenceEstimate
    calibrate(records, ...) -> Calibration
"""
from trainer.planner.estimate.calibrate import Calibration, MeasuredRun, calibrate
from trainer.planner.estimate.core import Planner, PlanNumbers
from trainer.planner.estimate.explain import Estimate, estimate
from trainer.planner.estimate.figure import Figure
from trainer.planner.estimate.inference import InferenceEstimate, inference_estimate
from trainer.planner.estimate.options import EstimateOptions
from trainer.planner.estimate.params import count, rank_params

__all__ = ["estimate", "Estimate", "EstimateOptions", "Figure", "Planner", "PlanNumbers", "count", "rank_params",
           "inference_estimate", "InferenceEstimate", "calibrate", "Calibration", "MeasuredRun"]
