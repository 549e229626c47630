"""The planner: what a plan will cost before any GPU is touched, and which plans to try. Standard library only.

    estimate/   parameters, FLOPs, memory per GPU, step time, MFU, cost, inference; calibration to measured runs
    tune/       the plan space, ranking, the memory/time Pareto front, and short real trials

    python -m trainer.planner.estimate --model gpt3-175b --gpu A100-SXM-80GB --nodes 128 --dp 8 --tp 8 --pp 16 …
    python -m trainer.planner.tune --model gpt2-small --gpu A100-SXM-80GB --nodes 1 --global-batch 64
"""
