"""The contract between the web app, the workers, the planner, the trainer and deployment. Standard library only.

    specs      ModelSpec, ParallelPlan, GPUSpec, ClusterSpec, DatasetSpec, OptimizerSpec, ProfileSpec, RunSpec
    rules      every rule a plan follows: alone, against its model and cluster, what each engine refuses; the
               limit on every number (the only place that decides whether a plan runs)
    schedules  the pipeline schedules and their families (looped, V-shaped, zero-bubble), micro-batches each needs
    stages     which layers each pipeline stage holds (equal, each stage's count, or Megatron's first/last form)
    specjson   strict JSON in and out, SpecError with dotted field paths
    presets    published model shapes and GPUs
    runfolder  the run folder's files and their write discipline (whole lines, whole files)
    records    what those files hold: event kinds, metrics rows, the launch record
    manifest   a checkpoint's manifest, and finding complete checkpoints
    command    the one builder of a trainer command line (torchrun, srun or a single process)

The web process imports all of this without loading torch.
"""
from trainer.contract.rules import check_plan
from trainer.contract.specjson import SCHEMA_VERSION, SpecError
from trainer.contract.specs import (MAIN_SOURCE, BlendSource, ClusterSpec, DatasetSpec, GPUSpec, InitFrom, ModelSpec,
                                    OptimizerSpec, ParallelPlan, ProfileSpec, RopeScaling, RunSpec, blend_sources,
                                    check_run)

__all__ = ["SCHEMA_VERSION", "SpecError", "ModelSpec", "RopeScaling", "ParallelPlan", "GPUSpec", "ClusterSpec",
           "DatasetSpec", "OptimizerSpec", "ProfileSpec", "InitFrom", "RunSpec", "BlendSource", "blend_sources",
           "MAIN_SOURCE", "check_plan", "check_run"]
