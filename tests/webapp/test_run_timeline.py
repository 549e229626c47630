"""A profile's timeline picture: each rank's measured compute / communication / idle spans beside the ideal
schedule of its plan, served as SVG by the API and shown on the run page; a profile without timelines answers 404
with what to do; and one real pipeline of two ranks whose drawn spans are its trace's own."""
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.trainer.launch import launch
from tests.webapp.live_runs import new_run, write_profile
from trainer.contract import ParallelPlan, ProfileSpec, presets
from trainer.profiling.digest import summarize_trace
from trainer.profiling.timeline import write_timelines
from webapp import models
from webapp.services.ingest import run_ingest

pytestmark = pytest.mark.django_db
SVG = "{http://www.w3.org/2000/svg}"


def _url(run, name="steps-10"):
    return f"/api/runs/{run.pk}/profiles/{name}/timeline.svg"


def _svg(response) -> ET.Element:
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"].startswith("image/svg+xml")
    return ET.fromstring(response.content)


def _drawn_ms(svg: ET.Element, rank: int, kind: str) -> float:
    """The time the picture draws as ``kind`` on ``rank``'s measured row, read back from the rectangles."""
    px_per_ms = float(svg.get("data-px-per-ms"))
    group = svg.find(f".//{SVG}g[@data-rank='{rank}']/{SVG}g[@data-row='measured']")
    return sum(float(r.get("width")) for r in group.iter(f"{SVG}rect") if r.get("data-kind") == kind) / px_per_ms


def _labels(svg: ET.Element, rank: int, row: str) -> list[str]:
    group = svg.find(f".//{SVG}g[@data-rank='{rank}']/{SVG}g[@data-row='{row}']")
    return [g.get("data-label") for g in group.iter(f"{SVG}g") if g.get("data-label")]


def test_a_profile_without_timelines_answers_404_saying_how_to_write_them_then_draws_each_rank(
        alice, api, client, plan222, corpus):
    run = new_run(alice, plan222, corpus)
    write_profile(run)  # two ranks' traces and summaries, as a trainer before timelines wrote them
    run_ingest(run.pk)
    missing = api(alice).get(_url(run))
    assert missing.status_code == 404 and "python -m trainer.profiling.timeline" in missing.json()["detail"]
    client.force_login(alice)
    page = client.get(f"/runs/{run.pk}/part/measure/")
    assert b'data-testid="timeline-missing"' in page.content

    write_timelines(Path(run.run_dir) / "profiles" / "steps-10")
    svg = _svg(api(alice).get(_url(run)))
    assert svg.get("role") == "img" and "rank 0: not computing 40.0%" in svg.get("aria-label")
    assert svg.find(f"{SVG}title").text.startswith(f"Run {run.pk}, profile steps-10")
    assert sorted(g.get("data-rank") for g in svg.iter(f"{SVG}g") if g.get("data-rank")) == ["0", "1"]
    for rank, compute_ms in ((0, 0.6), (1, 0.8)):  # write_profile: 60 % and 80 % of a 1 ms step
        assert _drawn_ms(svg, rank, "compute") == pytest.approx(compute_ms, abs=1e-3)
    # plan222 is dp 2 × tp 2 × pp 2 with 4 micro-batches: ranks 0 and 1 are pipeline rank 0 of 1F1B
    assert _labels(svg, 0, "ideal") == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    text = "".join(svg.itertext())
    assert "ideal bubble 20.0%" in text and "not computing 40.0% (idle 20.0%)" in text and "0.4 ms" in text
    for key in ("compute", "exposed communication", "idle", "forward", "backward"):
        assert key in text

    page = client.get(f"/runs/{run.pk}/part/measure/")
    assert f'src="{_url(run)}"'.encode() in page.content and b"alt=\"Timeline of profile steps-10" in page.content


def test_only_those_who_may_see_the_run_get_its_timeline_and_an_unknown_profile_says_where_they_are(
        alice, bob, api, plan222, corpus):
    run = new_run(alice, plan222, corpus)
    write_profile(run)
    run_ingest(run.pk)
    write_timelines(Path(run.run_dir) / "profiles" / "steps-10")
    assert api(bob).get(_url(run)).status_code == 404
    assert api(None).get(_url(run)).status_code in (401, 403)
    unknown = api(alice).get(_url(run, "nope"), HTTP_ACCEPT="image/svg+xml")  # an <img>'s Accept: still JSON
    assert unknown.status_code == 404 and f"/api/profiles/?run={run.pk}" in unknown.json()["detail"]
    assert api(alice).get(_url(run, "a%00b")).status_code == 404  # no profile has such a name: not asked for
    run.shared = True
    run.save()
    _svg(api(bob).get(_url(run)))


# -- a real pipeline ----------------------------------------------------------------------------------------------

MICROBATCHES = 4


@pytest.mark.slow
@pytest.mark.once
def test_a_real_two_stage_1f1b_run_is_drawn_with_its_traces_own_spans_beside_the_ideal_rows(alice, api, data_root,
                                                                                           tmp_path):
    """The tiny model on two CPU ranks, pp = 2 with 1F1B over 4 micro-batches, profiled for 2 steps by the real
    trainer, its folder read in by the real ingestion: each rank's drawn compute is its digest's, both ranks' four
    forwards and backwards are labelled from their operators (1F1B names none), gaps show, and the ideal rows are
    1F1B's."""
    (data_root / "shakespeare.txt").write_bytes(presets.demo_text(60_000))
    dataset = models.Dataset.objects.create(owner=alice, name="shakespeare", path=str(data_root / "shakespeare.txt"))
    cluster = models.Cluster.objects.create(name="local2", spec=presets.local_cpu_cluster(2).to_dict())
    model = models.ModelConfig.objects.create(owner=alice, name="tiny", spec=presets.MODELS["tiny"].to_dict())
    plan = models.ParallelismPlan.objects.create(
        owner=alice, name="pp2", model_config=model, cluster=cluster,
        spec=ParallelPlan(pp=2, micro_batch=1, global_batch=MICROBATCHES, pipeline_schedule="1f1b").to_dict())
    run = new_run(alice, plan, dataset, name="pp2", steps=4,
                  profile=ProfileSpec(start_step=1, steps=2, warmup=1, name="pp").to_dict())
    launch(2, [{"spec": run.run_spec(), "run_dir": run.run_dir, "resume": False, "stop_at": 0}], tmp_path / "jobs")
    run = run_ingest(run.pk)
    folder = Path(run.run_dir) / "profiles" / "pp"
    assert run.profiles.filter(name="pp").exists()

    svg = _svg(api(alice).get(_url(run, "pp")))
    expected = [f"{kind}{i}" for kind in "FB" for i in range(MICROBATCHES)]
    for rank in (0, 1):
        digest = summarize_trace(folder / f"rank-{rank}.trace.json.gz", steps=2)
        assert _drawn_ms(svg, rank, "compute") == pytest.approx(digest["compute_ms"], rel=1e-3, abs=0.01)
        assert _drawn_ms(svg, rank, "comm") == pytest.approx(digest["comm_exposed_ms"], rel=1e-3, abs=0.01)
        assert _drawn_ms(svg, rank, "idle") == pytest.approx(digest["idle_ms"], rel=1e-3, abs=0.01)
        assert digest["idle_ms"] + digest["comm_exposed_ms"] > 0.05 * digest["wall_ms"]  # the gaps a stage waits
        measured = _labels(svg, rank, "actions")
        assert len(measured) == 2 * len(expected) and sorted(measured[:len(expected)]) == sorted(expected)
        ideal = _labels(svg, rank, "ideal")
        assert sorted(ideal) == sorted(expected * 2)  # 1F1B's ideal step, once a profiled step
        # torch's 1F1B order: pp − r forwards of warm-up, then backward and forward in turn
        assert ideal[:MICROBATCHES * 2] == (["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"] if rank == 0 else
                                            ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"])
        assert measured[:len(expected)] == ideal[:len(expected)]
    assert "ideal bubble 20.0%" in "".join(svg.itertext())


def test_the_ideal_schedule_of_uneven_stages_costs_each_stage_by_its_layers(tmp_path):
    from trainer.contract import ParallelPlan
    from webapp.selectors.timeline import ideal_schedule

    plan = ParallelPlan(pp=2, micro_batch=1, global_batch=4, pipeline_schedule="1f1b", stage_layers=(2, 1))
    ideal, why = ideal_schedule(plan, tmp_path, [0, 1], n_layers=3)
    assert why == "" and "stages costed by their layers" in ideal.source
    # 4 micro-batches of F (1) and B (2) per stage, scaled by 2/1.5 and 1/1.5 of an equal stage's layers
    assert ideal.simulation.rank(0).busy == pytest.approx(16.0)
    assert ideal.simulation.rank(1).busy == pytest.approx(8.0)
    even, _ = ideal_schedule(plan.replace(stage_layers=()), tmp_path, [0, 1], n_layers=4)
    assert even.simulation.rank(0).busy == even.simulation.rank(1).busy == pytest.approx(12.0)
