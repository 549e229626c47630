"""Architecture advice: what to change in a model (vocabulary, widths, heads, depth, experts, micro-batch,
context) for its cluster, each change with the planner's step time, memory per GPU, MFU and tokens/s before and
after, the reason and its formula. Standard library only (docs/advice.md).

    advise(model, cluster, plan=None, options=None, global_batch=None) -> Advice   (Advice.to_dict() is JSON)
"""
from trainer.planner.advice.advise import Advice, advise
from trainer.planner.advice.figures import Figures
from trainer.planner.estimate.gemms import Gemm, gemm_efficiency, shape_efficiency
from trainer.planner.advice.suggestions import Suggestion

__all__ = ["advise", "Advice", "Figures", "Suggestion", "Gemm", "gemm_efficiency", "shape_efficiency"]
