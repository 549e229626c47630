"""The training program: one loop (``loop``) over an engine interface (``base``) with two engines, ``native``
(torch.distributed on one device mesh) and ``deepspeed`` (ZeRO, DeepSpeed's pipeline and MoE). ``runfiles``
holds what the loop writes and listens to: events, metrics and logs, the stop request, the profile report.
"""
