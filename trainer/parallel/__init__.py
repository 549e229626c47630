"""Parallelism for the native engine, composed torchtitan-style on one (pp, dp, tp) device mesh.

``parallelize.parallelize`` turns a validated plan into this rank's part of the model, in order: ``mesh`` (the one
device mesh and its groups), ``pipeline.split_stage`` (this rank's stages), ``tensor.apply_tp`` (tensor + sequence
parallel), ``ac.apply_ac`` (activation recompute), ``expert.apply_ep`` (experts over dp ranks),
``data_parallel.apply_fsdp`` / ``apply_ddp`` / ``ReplicatedGradSync`` (data parallel), then
``pipeline.build_schedule``. ``clip`` computes the global gradient norm across every shard and stage.
"""
