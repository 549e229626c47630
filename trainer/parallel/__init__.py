"""Parallelism for the native engine, composed torchtitan-style on one (pp, dp, tp) device mesh.

``mesh.Topology`` holds the mesh and its process groups and is passed explicitly to every ``apply_…`` step:
``apply_tp`` (tensor + sequence parallel), ``apply_ac`` (activation recompute), ``apply_fsdp`` / ``apply_ddp``
(data parallel), and ``pipeline.build_pipeline`` (pipeline stages and schedule). ``clip`` computes the global
gradient norm across every shard and stage.
"""
