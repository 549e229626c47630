"""Parallelism for the native engine, composed torchtitan-style on one (pp, dp, tp) device mesh.

``mesh.Topology`` holds the mesh and its process groups and is passed explicitly to every step;
``parallelize.parallelize`` applies them in order: ``pipeline.split_stage`` (this rank's stages),
``tensor.apply_tp`` (tensor + sequence parallel), ``ac.apply_ac`` (activation recompute),
``data_parallel.apply_fsdp`` / ``apply_ddp`` / ``ReplicatedGradSync`` (data parallel), then
``pipeline.build_schedule``. ``clip`` computes the global gradient norm across every shard and stage.
"""
