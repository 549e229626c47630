"""Session fixtures: one prepared dataset, and a few batched launches whose run folders several tests read.

A torchrun launch costs ~15 s on a 2-core machine, so every 2-rank job of the suite runs in one launch, every
4-rank job in another, and the single-process jobs in a third.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.launch import job as _job, launch, parity_stop, tiny_spec
from trainer.contract import DatasetSpec, InitFrom
from trainer.contract.presets import demo_text

TEXT_BYTES = 200_000  # enough tinyshakespeare for a 512-token BPE and thousands of 64-token windows


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> DatasetSpec:
    root = tmp_path_factory.mktemp("data")
    (root / "shakespeare.txt").write_bytes(demo_text(TEXT_BYTES))
    spec = DatasetSpec(path=str(root / "shakespeare.txt"), prepared_dir=str(root / "prepared"))
    from trainer.data import prepare_dataset

    prepare_dataset(spec, 512)
    return spec


# Plans checked against a single process; the reference is the same spec with dp=tp=pp=1 (tied or untied head;
# with a pipeline a tied head lives on the last stage and its gradient is summed with the embedding's).
TWO_RANK_PLANS = {
    "tp2": dict(tp=2),
    "tp2-sp": dict(tp=2, sequence_parallel=True),
    "pp2-gpipe": dict(pp=2, pipeline_schedule="gpipe"),
    "pp2-1f1b": dict(pp=2, tied=False, pipeline_schedule="1f1b"),
    "pp2-interleaved": dict(pp=2, pipeline_schedule="interleaved", virtual_stages=2),
    "pp2-zb-interleaved": dict(pp=2, pipeline_schedule="zb-interleaved"),
    "pp2-zbv": dict(pp=2, pipeline_schedule="zbv", virtual_stages=2),  # both ends of the tied model on rank 0
    "pp2-dualpipev": dict(pp=2, tied=False, pipeline_schedule="dualpipev", virtual_stages=2),
    "dp2-ddp": dict(dp=2),
    "dp2-fsdp": dict(dp=2, zero_stage=3),
}
FOUR_RANK_PLANS = {
    "tp2-dp2": dict(tp=2, dp=2),
    "pp2-tp2": dict(pp=2, tp=2),
    "pp2-tp2-untied": dict(pp=2, tp=2, tied=False),
    "fsdp2-tp2-sp": dict(dp=2, zero_stage=3, tp=2, sequence_parallel=True),
}
PARITY_STEPS = 20
RESUME_STEPS, RESUME_AT = 10, 5
PRECISION_STEPS = 5
# Mixed precision across plans, compared with the fp32 reference's first steps.
PRECISION_RUNS = {1: {"fp32": {}, "bf16": dict(precision="bf16"), "fp16": dict(precision="fp16")},
                  2: {"fp16-pp2": dict(precision="fp16", pp=2), "bf16-fsdp2": dict(precision="bf16", dp=2, zero_stage=3),
                      "bf16-tp2-sp": dict(precision="bf16", tp=2, sequence_parallel=True)}}
AC_MODES = ("none", "selective", "full")


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def two_rank_runs(runs, dataset) -> Path:
    """Every 2-rank parity plan, and the first halves of the resumes into one process (stopped at a checkpoint)."""
    jobs = [_job(tiny_spec(runs / name, dataset, PARITY_STEPS, **kw), stop_at=parity_stop(kw))
            for name, kw in TWO_RANK_PLANS.items()]
    jobs.append(_job(tiny_spec(runs / "resume-dp2-to-dp1", dataset, RESUME_STEPS, dp=2), stop_at=RESUME_AT))
    jobs.append(_job(tiny_spec(runs / "resume-fsdp2-to-dp1", dataset, RESUME_STEPS, dp=2, zero_stage=3),
                     stop_at=RESUME_AT))
    jobs.append(_job(tiny_spec(runs / "resume-pp2-to-dp1", dataset, RESUME_STEPS, pp=2), stop_at=RESUME_AT))
    jobs += [_job(tiny_spec(runs / f"precision-{n}", dataset, PRECISION_STEPS, **kw)) for n, kw in PRECISION_RUNS[2].items()]
    launch(2, jobs, runs / "jobs")
    return runs


@pytest.fixture(scope="session")
def four_rank_runs(runs, dataset) -> Path:
    launch(4, [_job(tiny_spec(runs / name, dataset, PARITY_STEPS, **kw), stop_at=parity_stop(kw))
               for name, kw in FOUR_RANK_PLANS.items()], runs / "jobs")
    return runs


@pytest.fixture(scope="session")
def single_rank_runs(runs, dataset, two_rank_runs) -> Path:
    """References (tied and untied), resume straight and split, the second half of dp 2 → 1, checkpointing modes."""
    ref = lambda name, **kw: tiny_spec(runs / name, dataset, PARITY_STEPS, **kw)  # noqa: E731
    straight = tiny_spec(runs / "resume-straight", dataset, RESUME_STEPS, checkpoint_every=5, eval_every=5,
                         keep_checkpoints=1)
    split = tiny_spec(runs / "resume-split", dataset, RESUME_STEPS, checkpoint_every=5, eval_every=5)
    jobs = [_job(ref("ref-tied")), _job(ref("ref-untied", tied=False)), _job(straight),
            _job(split, stop_at=RESUME_AT), _job(split, resume=True),
            _job(tiny_spec(runs / "resume-dp2-to-dp1", dataset, RESUME_STEPS), resume=True),
            _job(tiny_spec(runs / "resume-fsdp2-to-dp1", dataset, RESUME_STEPS), resume=True),
            _job(tiny_spec(runs / "resume-pp2-to-dp1", dataset, RESUME_STEPS), resume=True)]
    jobs += [_job(tiny_spec(runs / f"ac-{mode}", dataset, 3, activation_checkpointing=mode)) for mode in AC_MODES]
    jobs += [_job(tiny_spec(runs / f"precision-{n}", dataset, PRECISION_STEPS, **kw)) for n, kw in PRECISION_RUNS[1].items()]
    launch(1, jobs, runs / "jobs")
    return runs


# ---------------------------------------------------------------- the DeepSpeed engine and mixture of experts

DS_STAGES = {"ds-zero1": dict(zero_stage=1), "ds-zero2": dict(zero_stage=2), "ds-zero3": dict(zero_stage=3),
             "ds-zero3-offload": dict(zero_stage=3, offload_optimizer=True, offload_params=True)}
MOE_STEPS = 10


def moe_model(**kw):
    """tiny-moe: 4 layers, experts on layers 1 and 3, top-2 of 4; capacity factor 2 = E/k drops nothing."""
    from trainer.contract.presets import MODELS

    return MODELS["tiny-moe"].replace(**{"capacity_factor": 2.0, **kw})


@pytest.fixture(scope="session")
def engine_runs(tmp_path_factory, dataset) -> Path:
    """One 2-rank launch (native MoE first, then every DeepSpeed job) and one single-process launch of the
    references: ~35 s together."""
    runs = tmp_path_factory.mktemp("engine-runs")
    ds = dict(engine="deepspeed", dp=2)
    ckpt = dict(checkpoint_every=RESUME_AT, eval_every=RESUME_AT)
    split = tiny_spec(runs / "ds-resume-split", dataset, RESUME_STEPS, zero_stage=2, **ds, **ckpt)
    two = [_job(tiny_spec(runs / "moe-native-ep2", dataset, MOE_STEPS, model=moe_model(), dp=2, ep=2)),
           _job(tiny_spec(runs / "moe-resume-ep2-to-ep1", dataset, MOE_STEPS, model=moe_model(), dp=2, ep=2),
                stop_at=RESUME_AT),
           _job(tiny_spec(runs / "moe-native-ep2-drop", dataset, MOE_STEPS, model=moe_model(capacity_factor=0.5),
                          dp=2, ep=2)),
           *[_job(tiny_spec(runs / n, dataset, PARITY_STEPS, **ds, **kw)) for n, kw in DS_STAGES.items()],
           _job(tiny_spec(runs / "ds-resume-straight", dataset, RESUME_STEPS, zero_stage=2, **ds, **ckpt)),
           _job(split, stop_at=RESUME_AT), _job(split, resume=True),
           _job(tiny_spec(runs / "ds-zero3-consolidate", dataset, 6, zero_stage=3, checkpoint_every=6, eval_every=6,
                          activation_checkpointing="full", **ds)),
           _job(tiny_spec(runs / "ds-moe-ep2", dataset, PARITY_STEPS, model=moe_model(capacity_factor=1.25),
                          zero_stage=1, ep=2, checkpoint_every=PARITY_STEPS, eval_every=PARITY_STEPS, **ds)),
           _job(tiny_spec(runs / "ds-moe-ep2-ac", dataset, MOE_STEPS, model=moe_model(), zero_stage=2, ep=2,
                          activation_checkpointing="full", **ds)),
           _job(tiny_spec(runs / "ds-pp2-zero1", dataset, PARITY_STEPS, engine="deepspeed", pp=2, zero_stage=1,
                          checkpoint_every=PARITY_STEPS))]
    # Runs started from the ZeRO-3 checkpoint's weights by both engines' pipelines (tests/trainer/engine/test_init_from)
    zero3 = InitFrom(checkpoint=str(runs / "ds-zero3-consolidate" / "checkpoints" / "step-6"))
    two += [_job(tiny_spec(runs / "init-ds-pp2-from-zero3", dataset, 1, engine="deepspeed", pp=2, zero_stage=1,
                           init_from=zero3)),
            _job(tiny_spec(runs / "init-native-pp2-from-zero3", dataset, 1, pp=2, init_from=zero3))]
    launch(2, two, runs / "jobs")
    launch(1, [_job(tiny_spec(runs / "ref", dataset, PARITY_STEPS)),
               _job(tiny_spec(runs / "moe-ref", dataset, MOE_STEPS, model=moe_model())),
               _job(tiny_spec(runs / "moe-resume-ep2-to-ep1", dataset, MOE_STEPS, model=moe_model()), resume=True)],
           runs / "jobs")
    return runs
