"""Every run's estimate beside its measurement: the planner's estimate stored when the run is created, each figure
set beside what ingestion read from the run folder with its relative error or why it is not measured, the API that
answers it, and one run trained for real whose model-state bytes the planner gives exactly."""
from pathlib import Path

import pytest

from tests.webapp.live_runs import append_metrics, new_run, step_record, write_profile
from trainer.contract import ModelSpec, ParallelPlan, presets
from trainer.planner.estimate.api import estimate_json
from webapp import models
from webapp.selectors.run_estimates import FIGURE_KEYS, NO_PIPELINE, NO_PROFILE, NO_STATES, NO_STEPS
from webapp.services import run_estimates
from webapp.services.ingest import run_ingest
from webapp.services.run_estimates import run_estimate_report

pytestmark = pytest.mark.django_db


def _planned(run) -> dict:
    spec = run.spec
    return estimate_json({"model": spec["model"], "plan": spec["plan"], "cluster": spec["cluster"]})


def _rows(answer: dict) -> dict:
    assert [row["key"] for row in answer["figures"]] == list(FIGURE_KEYS)
    return {row["key"]: row for row in answer["figures"]}


def _states(stage: dict, extra: int = 0) -> dict:
    return {"params_bytes": stage["weights"]["value"], "grads_bytes": stage["gradients"]["value"],
            "optimizer_bytes": stage["optimizer"]["value"] + extra}


def test_creating_a_run_stores_the_planners_estimate_for_its_spec(alice, plan222, corpus):
    run = new_run(alice, plan222, corpus)
    run.refresh_from_db()
    planned = _planned(run)
    assert set(run.estimate) == set(planned)
    assert run.estimate["memory"]["peak"]["value"] == planned["memory"]["peak"]["value"]
    assert run.estimate["time"]["step"]["value"] == planned["time"]["step"]["value"]
    assert run.estimate["options"] == planned["options"]


def test_a_planner_failure_is_kept_as_the_reason_and_the_run_is_created(alice, plan222, corpus, monkeypatch):
    def fails(payload):
        raise RuntimeError("no estimate today")

    monkeypatch.setattr(run_estimates, "estimate_json", fails)
    run = new_run(alice, plan222, corpus)
    run.refresh_from_db()
    assert run.spec and run.estimate == {"error": "the planner failed on this spec: RuntimeError: no estimate today"}
    answer = run_estimate_report(run)
    assert answer["estimate"] == run.estimate
    assert all(row["estimated"] is None and row["error"] is None for row in answer["figures"])


def test_a_run_made_before_estimates_were_kept_gets_its_own_on_first_read(alice, api, plan222, corpus):
    run = new_run(alice, plan222, corpus)
    models.Run.objects.filter(pk=run.pk).update(estimate={})
    answer = api(alice).get(f"/api/runs/{run.pk}/estimate/").json()
    run.refresh_from_db()
    assert run.estimate["memory"]["peak"]["value"] == _planned(run)["memory"]["peak"]["value"]
    assert answer["estimate"]["peak_memory_bytes"] == run.estimate["memory"]["peak"]["value"]
    assert answer["estimate"]["peak_rank"] == run.estimate["memory"]["peak_rank"]
    assert answer["estimate"]["step_time_s"] == run.estimate["time"]["step"]["value"]

    # one made without a stored spec (before specs were kept, and its parts no longer make one) says so
    bare = models.Run.objects.create(owner=alice, name="bare", model_config=plan222.model_config, plan=plan222,
                                     cluster=plan222.cluster, dataset=corpus)
    answer = api(alice).get(f"/api/runs/{bare.pk}/estimate/").json()
    assert answer["estimate"] == {"error": "the run has no stored spec to estimate"}
    bare.refresh_from_db()
    assert bare.estimate == answer["estimate"]


# What rank 6 holds beyond its estimate: enough to make it the fullest rank (stage 0, with the position embeddings,
# holds some 90 MB more than stage 1)
EXTRA = 2**27


def test_it_sets_each_estimate_beside_what_the_run_measured_with_the_error(alice, api, plan222, corpus):
    run = new_run(alice, plan222, corpus, steps=100)  # dp 2 × tp 2 × pp 2: ranks 4-7 are pipeline stage 1
    planned = _planned(run)
    stage0, stage1 = planned["memory"]["stages"]
    acts = round(1.1 * stage0["activations_per_microbatch"]["value"])
    per_rank = [{**_states(stage0 if rank < 4 else stage1, extra=EXTRA if rank == 6 else 0),
                 "activations_bytes": acts if rank == 0 else 1000} for rank in range(8)]
    first = {**per_rank[0], "max_allocated_bytes": 2**30, "per_rank": per_rank}
    ranks = {"step_time_s": [0.5] * 8, "tokens_per_s": [2048.0] * 8, "max_allocated_bytes": [2**30] * 7 + [2**31]}
    append_metrics(run, [step_record(1, 4.0, ranks=ranks, memory=first)]
                   + [step_record(s, 4.0 - s / 100, ranks=ranks) for s in range(2, 31)])
    write_profile(run)
    run_ingest(run.pk)

    answer = api(alice).get(f"/api/runs/{run.pk}/estimate/").json()
    assert answer["estimate"]["peak_memory_bytes"] == planned["memory"]["peak"]["value"]
    rows = _rows(answer)
    for row in rows.values():
        assert row["measured"] is not None and row["missing"] == "" and row["measured_from"], row

    states = rows["model_states_rank0"]
    assert states["estimated"] == states["measured"] == sum(_states(stage0).values()) and states["error"] == 0
    assert states["unit"] == "bytes" and "step 1" in states["measured_from"]
    fullest = rows["model_states_fullest"]  # rank 6 holds more optimizer state than its stage's estimate
    assert fullest["estimated"] == sum(_states(stage1).values()) and fullest["measured"] == fullest["estimated"] + EXTRA
    assert fullest["error"] == pytest.approx(EXTRA / fullest["estimated"]) and "rank 6 of 8" in fullest["measured_from"]
    assert rows["activations_rank0"]["measured"] == acts
    assert rows["activations_rank0"]["error"] == pytest.approx(0.1, abs=1e-6)

    assert rows["peak_memory_rank0"]["estimated"] == stage0["total"]["value"]
    assert rows["peak_memory_rank0"]["measured"] == 2**30
    assert rows["peak_memory_fullest"]["estimated"] == planned["memory"]["peak"]["value"]
    assert rows["peak_memory_fullest"]["measured"] == 2**31
    assert "rank 7" in rows["peak_memory_fullest"]["measured_from"]

    step = planned["time"]["step"]
    assert rows["step_time"]["measured"] == 0.5 and rows["step_time"]["unit"] == "s"
    assert rows["step_time"]["error"] == pytest.approx((0.5 - step["value"]) / step["value"])
    assert rows["step_time"]["measured_from"] == "median of the latest 30 steps"
    assert rows["tokens_per_s"]["measured"] == 2048.0
    assert rows["tokens_per_s"]["error"] == pytest.approx((2048 - planned["time"]["tokens_per_s"]["value"])
                                                          / planned["time"]["tokens_per_s"]["value"])
    assert rows["mfu"]["error"] == pytest.approx((0.4 - planned["time"]["mfu"]["value"])
                                                 / planned["time"]["mfu"]["value"])

    terms = step["terms"]
    bubble = rows["pipeline_bubble"]  # the mean of 20 % and 10 % idle
    assert bubble["estimated"] == pytest.approx(terms["pipeline_bubble"]["value"] / step["value"])
    assert bubble["measured"] == pytest.approx(0.15) and "profile steps-10" in bubble["measured_from"]
    assert bubble["error"] == pytest.approx((0.15 - bubble["estimated"]) / bubble["estimated"])
    comm = rows["exposed_communication"]
    exposed = sum(terms[n]["value"] for n in ("tensor_parallel", "pipeline_p2p", "data_parallel"))
    assert comm["estimated"] == pytest.approx(exposed / step["value"]) and comm["measured"] == pytest.approx(0.15)


def test_figures_not_measured_say_why(alice, api, plan222, corpus):
    fresh = new_run(alice, plan222, corpus, name="fresh")
    rows = _rows(api(alice).get(f"/api/runs/{fresh.pk}/estimate/").json())
    for key, row in rows.items():
        assert row["measured"] is None and row["error"] is None and row["measured_from"] == "", key
        assert row["estimated"] is not None, key
        assert row["missing"] == (NO_PROFILE if key in ("pipeline_bubble", "exposed_communication") else NO_STEPS)

    # a world of one on CPUs: no device memory, and records without the model states' bytes
    cluster = models.Cluster.objects.create(name="cpu1", spec=presets.cluster("cpu", 1, 1).to_dict())
    model = models.ModelConfig.objects.create(owner=alice, name="tiny", spec=presets.MODELS["tiny"].to_dict())
    plan = models.ParallelismPlan.objects.create(owner=alice, name="one", model_config=model, cluster=cluster,
                                                 spec=ParallelPlan(micro_batch=2, global_batch=4).to_dict())
    cpu = new_run(alice, plan, corpus, name="cpu")
    append_metrics(cpu, [step_record(s, 3.0, memory={}) for s in range(1, 6)])
    models.Profile.objects.create(run=cpu, name="undigested", path=str(Path(cpu.run_dir) / "profiles" / "p"))
    rows = _rows(api(alice).get(f"/api/runs/{cpu.pk}/estimate/").json())
    assert rows["model_states_rank0"]["missing"] == NO_STATES
    assert rows["model_states_fullest"]["missing"].startswith("a world of one")
    assert rows["peak_memory_rank0"]["missing"] == "the device reports no memory (a CPU does not)"
    assert rows["peak_memory_fullest"]["missing"].startswith("a world of one")
    assert rows["exposed_communication"]["missing"] == "profile undigested has no digest of its traces"
    assert rows["pipeline_bubble"]["missing"] == NO_PIPELINE  # pp 1: no bubble, whatever a profile says
    assert rows["pipeline_bubble"]["estimated"] == 0 and rows["pipeline_bubble"]["error"] is None
    assert rows["step_time"]["measured"] == 0.5 and rows["step_time"]["error"] is not None


def test_the_api_answers_only_about_runs_you_may_see(alice, bob, api, plan222, corpus):
    run = new_run(alice, plan222, corpus)
    assert api(alice).get(f"/api/runs/{run.pk}/estimate/").status_code == 200
    assert api(bob).get(f"/api/runs/{run.pk}/estimate/").status_code == 404
    assert api(alice).get("/api/runs/999999/estimate/").status_code == 404
    assert api(None).get(f"/api/runs/{run.pk}/estimate/").status_code in (401, 403)
    run.shared = True
    run.save()
    assert api(bob).get(f"/api/runs/{run.pk}/estimate/").json()["estimate"]["step_time_s"] > 0


# -- a run trained for real --------------------------------------------------------------------------------------

REAL_MODEL = ModelSpec(name="est-tiny", n_layers=2, d_model=32, n_heads=2, seq_len=32, vocab_size=320)
REAL_STEPS = 3


def test_a_real_runs_model_states_are_exactly_the_planners(alice, data_root):
    """A tiny native run trained by the real loop in this process as a world of one (fp32 on the CPU), its
    metrics.jsonl read in by the real ingestion: the planner counts its parameters, gradients and optimizer states
    to the byte, and the activations it saves within the 3 % the planner claims."""
    import torch.distributed as dist

    from trainer.engine.loop import run as train

    (data_root / "shakespeare.txt").write_bytes(presets.demo_text(40_000))
    dataset = models.Dataset.objects.create(owner=alice, name="shakespeare", path=str(data_root / "shakespeare.txt"))
    cluster = models.Cluster.objects.create(name="local1", spec=presets.local_cpu_cluster(1).to_dict())
    model = models.ModelConfig.objects.create(owner=alice, name="est-tiny", spec=REAL_MODEL.to_dict())
    plan = models.ParallelismPlan.objects.create(owner=alice, name="one", model_config=model, cluster=cluster,
                                                 spec=ParallelPlan(micro_batch=2, global_batch=4).to_dict())
    run = new_run(alice, plan, dataset, name="real", steps=REAL_STEPS)
    joined_here = not dist.is_initialized()
    try:
        assert train(run.run_spec(), Path(run.run_dir), resume=False) == "finished"
    finally:
        if joined_here and dist.is_initialized():  # the loop joined a world of one: leave none behind
            dist.destroy_process_group()
    run = run_ingest(run.pk)
    assert run.last_step == REAL_STEPS

    rows = _rows(run_estimate_report(run))
    states = rows["model_states_rank0"]
    assert states["measured"] == states["estimated"] and states["error"] == 0, states
    assert abs(rows["activations_rank0"]["error"]) <= 0.03, rows["activations_rank0"]
    assert rows["step_time"]["measured"] > 0 and rows["step_time"]["error"] is not None
