"""What a Triton model of this project runs: the serving model, its engine and its tensor-parallel ranks.

The exporter copies this package, as it is, into each model's version folder; it imports torch, safetensors and
tokenizers only, never the rest of the project, so the model repository serves on a machine that has only those.
"""
