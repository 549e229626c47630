"""Benchmarks of deployment: each serving engine through Triton and /v1, the engine alone, the planner's serving
prediction."""
