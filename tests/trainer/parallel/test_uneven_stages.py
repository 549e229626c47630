"""Pipelines whose stages hold different numbers of layers train the same model as one process: per-step losses equal
within 1e-5 relative (fp32, 20 steps), and a checkpoint saved by such a pipeline resumes in one process.

Layouts on tiny-llama (RMSNorm, SwiGLU, rotary) with its layers changed: 3 layers as (2, 1) under 1F1B; 5 layers as
(2, 1, 1, 1) under interleaved 1F1B (rank 0 holds layers 0–1 and 3, rank 1 layers 2 and 4) and under ZB-V (rank 0
holds layers 0–1 and 4, with both ends of the model); GPipe, zero-bubble interleaved and DualPipeV with other
layouts. The 5-layer models tie the head to the embedding, so the tied gradient is summed across ranks (looped
placements) and on one rank (V-shaped). One 2-rank launch runs the pipelines and the
first half of the resume, one single-process launch the references and the second half.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.conftest import PARITY_STEPS, RESUME_AT, RESUME_STEPS
from tests.trainer.launch import job as _job, launch, losses, max_rel_error, records, tiny_spec
from trainer.contract.presets import MODELS

pytestmark = pytest.mark.slow
TOLERANCE = 1e-5
LLAMA3 = MODELS["tiny-llama"].replace(n_layers=3)
LLAMA5_TIED = MODELS["tiny-llama"].replace(n_layers=5, tied_embeddings=True)
# name → (model, plan fields, the reference's name)
PIPELINES = {
    "1f1b-2-1": (LLAMA3, dict(pp=2, stage_layers=(2, 1)), "ref-3"),
    "interleaved-2-1-1-1": (LLAMA5_TIED, dict(pp=2, pipeline_schedule="interleaved", virtual_stages=2,
                                              stage_layers=(2, 1, 1, 1)), "ref-5-tied"),
    "zbv-2-1-1-1": (LLAMA5_TIED, dict(pp=2, pipeline_schedule="zbv", virtual_stages=2, stage_layers=(2, 1, 1, 1)),
                    "ref-5-tied"),
    # the other schedules: GPipe's single stage a rank, zero-bubble looped chunks, DualPipeV's V
    "gpipe-2-1": (LLAMA3, dict(pp=2, pipeline_schedule="gpipe", stage_layers=(2, 1)), "ref-3"),
    "zb-interleaved-1-1-2-1": (LLAMA5_TIED, dict(pp=2, pipeline_schedule="zb-interleaved", virtual_stages=2,
                                                 stage_layers=(1, 1, 2, 1)), "ref-5-tied"),
    "dualpipev-1-2-1-1": (LLAMA5_TIED, dict(pp=2, pipeline_schedule="dualpipev", virtual_stages=2,
                                            stage_layers=(1, 2, 1, 1)), "ref-5-tied"),
}


@pytest.fixture(scope="module")
def uneven_runs(tmp_path_factory, dataset) -> Path:
    runs = tmp_path_factory.mktemp("uneven-runs")
    resume = dict(checkpoint_every=RESUME_AT, eval_every=RESUME_AT)
    piped = [_job(tiny_spec(runs / name, dataset, PARITY_STEPS, model=model, **kw))
             for name, (model, kw, _) in PIPELINES.items()]
    piped.append(_job(tiny_spec(runs / "resume-2-1-to-one", dataset, RESUME_STEPS, model=LLAMA3, pp=2,
                                stage_layers=(2, 1), **resume), stop_at=RESUME_AT))
    launch(2, piped, runs / "jobs")
    one = [_job(tiny_spec(runs / "ref-3", dataset, PARITY_STEPS, model=LLAMA3)),
           _job(tiny_spec(runs / "ref-5-tied", dataset, PARITY_STEPS, model=LLAMA5_TIED)),
           _job(tiny_spec(runs / "ref-3-resume", dataset, RESUME_STEPS, model=LLAMA3, **resume)),
           _job(tiny_spec(runs / "resume-2-1-to-one", dataset, RESUME_STEPS, model=LLAMA3, **resume), resume=True)]
    launch(1, one, runs / "jobs")
    return runs


@pytest.mark.parametrize("name", list(PIPELINES))
def test_an_uneven_pipeline_trains_like_one_process(uneven_runs, name):
    got = losses(uneven_runs / name)
    assert len(got) == PARITY_STEPS
    assert max_rel_error(losses(uneven_runs / PIPELINES[name][2]), got) < TOLERANCE


def test_a_checkpoint_of_uneven_stages_resumes_in_one_process(uneven_runs):
    got = losses(uneven_runs / "resume-2-1-to-one")
    assert len(got) == RESUME_STEPS
    assert max_rel_error(losses(uneven_runs / "ref-3-resume"), got) < TOLERANCE


def test_each_rank_measures_its_own_stage(uneven_runs):
    """Rank 0 holds two of the three layers and rank 1 one layer and the head: parameters and activations are
    measured on each rank for what it holds."""
    per_rank = records(uneven_runs / "1f1b-2-1")[0]["memory"]["per_rank"]
    assert len(per_rank) == 2
    first, last = per_rank
    model = LLAMA3
    block = sum(p for p in [  # one Llama block: two RMSNorm gains, q, k, v, out, gate, up, down
        2 * model.d_model, model.d_model * model.d_model * 2 + 2 * model.d_model * model.kv_heads * model.head_dim,
        3 * model.d_model * model.ffn])
    embed = model.vocab_size * model.d_model
    assert first["params_bytes"] == 4 * (2 * block + embed)
    assert last["params_bytes"] == 4 * (block + model.d_model + embed)  # a layer, the final norm, the head
    assert first["activations_bytes"] > 0 and last["activations_bytes"] > 0
