"""The auto-tuner: enumerate valid plans, reject those that do not fit (with reasons), rank by estimated step time,
the memory/time Pareto front, and optional short real trials. Standard library only.

    tune(model, cluster, global_batch, space=None, options=None, top_k=10, explain_top=0, measure=None,
         trial_pool=30, max_fraction=1/3, tolerance=0.05, progress=None) -> TuneResult   (to_dict() is JSON)
"""
from trainer.planner.tune.search import Candidate, TuneResult, pareto_front, rank_plans, tune
from trainer.planner.tune.space import SearchSpace, enumerate_plans
from trainer.planner.tune.trials import TrialResult, run_trials

__all__ = ["tune", "TuneResult", "Candidate", "SearchSpace", "enumerate_plans", "rank_plans", "pareto_front",
           "run_trials", "TrialResult"]
