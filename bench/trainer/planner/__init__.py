"""Benchmarks of the planner: its step-time model against published and measured runs, the tuner's speed and limits."""
