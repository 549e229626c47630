"""The training program: one loop (``loop``: a ``Trainer`` built per run) over an engine interface (``base``: one
``train_step``) with two engines, ``native`` (torch.distributed on one device mesh) and ``deepspeed`` (ZeRO,
DeepSpeed's pipeline and MoE). Around the steps: ``checkpointer`` (where a run starts, when it saves), ``recorder``
(a step's metrics row) and ``runfiles`` (what the loop writes and listens to: events, metrics and logs, the stop
request, the profile report).
"""
