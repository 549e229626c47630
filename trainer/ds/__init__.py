"""The DeepSpeed engine: ZeRO 1–3 with optional CPU offload, DeepSpeed activation checkpointing, DeepSpeed MoE and
checkpoints consolidated into the native parameter names. Imported only when a plan says engine='deepspeed'."""
