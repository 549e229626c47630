"""The DeepSpeed config of a run: one pure function of the RunSpec, saved as deepspeed_config.json in the run folder.

Everything the native engine decides per step is decided the same way here, so that both engines train the same
model on the same data: batch sizes from the plan (global = micro × accumulation × dp), gradient clipping at
optimizer.grad_clip on the global norm, fp16 dynamic loss scaling with the native LossScaler's constants (start
2^16, halve on the first overflow, double after 2000 clean steps). The learning rate is not in the config: the
trainer sets it per step from trainer.optim.lr_at on the client AdamW, whose parameter groups (decay / no decay)
match the native engine's.
"""
from __future__ import annotations

from typing import Any

from trainer.contract import RunSpec

CONFIG_FILE = "deepspeed_config.json"
LOSS_SCALE_POWER = 16  # 2^16, trainer.optim.LossScaler's init_scale
LOSS_SCALE_WINDOW = 2000  # LossScaler's growth_interval


def deepspeed_config(spec: RunSpec) -> dict[str, Any]:
    plan = spec.plan
    zero: dict[str, Any] = {"stage": plan.zero_stage}
    if plan.zero_stage >= 1:
        # Fixed-size buckets keep the reduction order the same from step to step.
        zero.update({"reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8, "overlap_comm": False,
                     "contiguous_gradients": True})
    if plan.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if plan.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    config: dict[str, Any] = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_clipping": spec.optimizer.grad_clip,
        "zero_optimization": zero,
        # The client optimizer is torch.optim.AdamW: DeepSpeed's own Adam kernels would need a JIT build (and
        # differ in rounding), and with offload the client optimizer runs on the CPU partitions as it is.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2 ** 31 - 1,  # the trainer logs its own metrics
        "wall_clock_breakdown": False,
    }
    if plan.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif plan.precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": LOSS_SCALE_POWER,
                          "loss_scale_window": LOSS_SCALE_WINDOW, "hysteresis": 1, "min_loss_scale": 1}
    if plan.activation_checkpointing != "none":
        # partition_activations splits each saved block input over the model-parallel ranks (none here: tp = 1,
        # so it keeps the code path live without changing the numbers); cpu_checkpointing is broken upstream
        # and pointless without a GPU.
        config["activation_checkpointing"] = {"partition_activations": True, "cpu_checkpointing": False,
                                              "contiguous_memory_optimization": False,
                                              "synchronize_checkpoint_boundary": False, "profile": False}
    return config
