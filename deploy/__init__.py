"""Checkpoint → Triton model repository, Triton server control, inference client."""
