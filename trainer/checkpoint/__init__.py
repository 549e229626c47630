"""Checkpoints: the native engine's DCP shards (``dcp``), DeepSpeed's files read back (``deepspeed_format``), and one
consolidated safetensors file of whole fp32 weights that generation and deployment read (``consolidated``).

Finding complete checkpoints and reading their manifests needs no torch: ``trainer.contract.manifest``.
"""
