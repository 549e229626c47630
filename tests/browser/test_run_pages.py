"""The run page and the compare page in the browser: charts drawn from really ingested metrics, the x axis and log
scale switched, a dragged zoom, the log tail, the status following the run to its end without a reload, what the
page says of a CPU run without a pipeline and of a run resumed after a cancel, a blended run's validation loss on
each of its sources, a checkpoint evaluated from the page and scored beside the loss, and two runs overlaid with what
differs between them."""
import json
from pathlib import Path

from playwright.sync_api import expect

from tests.browser.conftest import check_page
from tests.xdist_groups import run_temp_root
from tests.webapp.live_runs import append_metrics, eval_record, new_run, step_record, write_profile
from trainer.contract import ParallelPlan, presets
from trainer.contract.records import Event, event
from trainer.contract.runfolder import EVENTS, append_jsonl
from webapp import models, services
from webapp.pages.run_detail import NO_CPU_MEMORY
from webapp.services.demo import demo_ready
from webapp.services.ingest import run_ingest
from webapp.selectors.run_estimates import NO_PIPELINE


def _plans(owner, settings, tmp_path):
    settings.WORKBENCH = {**settings.WORKBENCH, "RUNS_ROOT": tmp_path / "runs"}
    cluster, dataset = demo_ready(owner)
    model = models.ModelConfig.objects.create(owner=owner, name="tiny", spec=presets.MODELS["tiny"].to_dict())
    plans = [models.ParallelismPlan.objects.create(owner=owner, name=name, model_config=model, cluster=cluster,
                                                   spec=ParallelPlan(dp=2, micro_batch=mb, global_batch=4).to_dict())
             for name, mb in (("dp2", 2), ("dp2-mb1", 1))]
    return plans, dataset


def _running(run):
    for status in ("queued", "submitted", "running"):
        run.transition(status)
    run.save()
    return run


def test_the_run_page_draws_its_charts_zooms_tails_a_log_and_follows_the_run_to_its_end(signed_in_page, settings,
                                                                                        tmp_path):
    page = signed_in_page
    (plan, _), dataset = _plans(page.user, settings, tmp_path)
    run = _running(new_run(page.user, plan, dataset, name="learning", steps=400))
    append_metrics(run, [step_record(s, 5.0 - s / 100) for s in range(1, 301)] + [eval_record(150, 3.6)])
    logs = Path(run.run_dir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "rank-0.log").write_text("".join(f"step {s} loss {5.0 - s / 100:.2f}\n" for s in range(1, 301)))

    page.goto(f"/runs/{run.pk}/")
    loss = page.get_by_test_id("chart-loss")
    expect(loss).not_to_have_attribute("data-points", "0")
    assert int(loss.get_attribute("data-points")) > 300  # every step and the evaluation
    expect(page.get_by_test_id("chart-memory")).not_to_have_attribute("data-points", "0")
    expect(page.get_by_test_id("log-text")).to_contain_text("step 300 loss 2.00")

    page.get_by_label("X axis").select_option("tokens")
    expect(page.locator("#chart-loss-summary")).to_contain_text("tokens seen")
    expect(page.get_by_text("Smoothing window (tokens)")).to_be_visible()
    page.get_by_label("Log scale (y)").check()
    page.get_by_label("Smoothing window (tokens)").fill("20000")
    expect(page.locator("#chart-loss-summary")).to_contain_text("Smoothed over")
    check_page(page, "run", phone=True)

    box = loss.locator(".u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()
    expect(page.locator("#chart-state")).to_contain_text("Zoomed to")
    points = int(loss.get_attribute("data-points"))
    assert 0 < points < 300
    page.get_by_role("button", name="Reset zoom").click()
    expect(page.locator("#chart-state")).to_contain_text("Whole run")

    expect(page.get_by_test_id("run-status")).to_have_text("running")
    append_metrics(run, [step_record(s, 5.0 - s / 100) for s in range(301, 401)])
    append_jsonl(Path(run.run_dir) / EVENTS, event(Event.FINISHED, 0, step=400))
    run_ingest(run.pk)
    expect(page.get_by_test_id("run-status")).to_have_text("completed", timeout=40_000)
    expect(page.get_by_test_id("run-step")).to_have_text("400")
    expect(page.get_by_test_id("events")).to_contain_text("finished")
    expect(page.get_by_role("button", name="Cancel run")).to_have_count(0)
    check_page(page, "run-completed")


def test_the_run_page_shows_the_present_state_alone_and_what_a_cpu_run_without_a_pipeline_measures(
        signed_in_page, settings, tmp_path, sent):
    page = signed_in_page
    (plan, _), dataset = _plans(page.user, settings, tmp_path)  # dp 2, pp 1, on the local CPUs
    run = _running(new_run(page.user, plan, dataset, name="on-cpus", steps=5))
    write_profile(run)  # its trainer events happen now; they are read in after the cancel below
    services.run_cancel(run, "cancelled by admin")
    append_metrics(run, [step_record(s, 4.0 - s / 10, memory={}) for s in range(1, 4)])  # a CPU reports no memory

    page.goto(f"/runs/{run.pk}/")
    header = page.locator("#run-header")
    expect(header).to_contain_text("cancelled by admin")
    kinds = page.get_by_test_id("events").locator("tbody tr td:nth-child(3)")
    expect(kinds).to_have_text(["cancelled", "profile_written", "started"])  # newest first, by when they happened
    expect(page.locator("#chart-memory-summary")).to_have_text(NO_CPU_MEMORY)
    expect(page.locator("#chart-loss-summary")).to_contain_text("loss: 3 points")
    # the profile's figure says what it measures; the planner's pipeline bubble is 0 and nothing measures one
    digest = page.get_by_test_id("profile-digest")
    expect(digest).to_contain_text("Not computing (exposed communication + idle) 30.0% on average, 40.0% on the "
                                   "worst rank")
    expect(digest).not_to_contain_text("Bubble")
    bubble = page.get_by_test_id("estimate-vs-measured").locator("tr").filter(has_text="Pipeline bubble")
    expect(bubble.locator("td")).to_have_text(["0.0%", "not measured", "–", NO_PIPELINE])
    check_page(page, "run-cpu-cancelled")

    page.get_by_role("button", name="Resume from the newest checkpoint").click()
    expect(page.get_by_test_id("run-status")).to_have_text("queued")
    expect(page.get_by_role("status").filter(has_text="is queued")).to_be_visible()
    expect(header).not_to_contain_text("cancelled by admin")
    expect(header).to_contain_text("resumed: queued to go on from its newest checkpoint")
    assert ("workbench.runs.launch", run.pk) in sent

    run.refresh_from_db()  # a worker's launch, then the trainer's last lines
    run.transition("submitted", "attempt 1 submitted as job 1:test")
    run.save()
    expect(page.get_by_test_id("run-status")).to_have_text("submitted", timeout=40_000)
    expect(header).to_contain_text("submitted as job 1:test")
    append_jsonl(Path(run.run_dir) / EVENTS, event(Event.STARTED, 0, step=3))
    run_ingest(run.pk)
    expect(page.get_by_test_id("run-status")).to_have_text("running", timeout=40_000)
    expect(header).not_to_contain_text("submitted as job")
    append_metrics(run, [step_record(s, 4.0 - s / 10, memory={}) for s in range(4, 6)])
    append_jsonl(Path(run.run_dir) / EVENTS, event(Event.FINISHED, 0, step=5))
    run_ingest(run.pk)
    expect(page.get_by_test_id("run-status")).to_have_text("completed", timeout=40_000)
    expect(header).to_contain_text("finished at step 5")
    expect(page.locator("main .messages")).to_have_count(0)  # "is queued" was true only while it was
    expect(kinds.first).to_have_text("finished")
    check_page(page, "run-cpu-completed")


def test_the_compare_page_overlays_two_runs_and_lists_what_differs(signed_in_page, settings, tmp_path):
    page = signed_in_page
    plans, dataset = _plans(page.user, settings, tmp_path)
    runs = [new_run(page.user, plan, dataset, name=plan.name, steps=200) for plan in plans]
    append_metrics(runs[0], [step_record(s, 5.0 - s / 100) for s in range(1, 201)])
    append_metrics(runs[1], [step_record(s, 4.5 - s / 100, tokens_per_step=512) for s in range(1, 151)])

    page.goto(f"/compare/?ids={runs[0].pk},{runs[1].pk}")
    chart = page.get_by_test_id("compare-chart")
    expect(chart).to_have_attribute("data-series", "2")
    expect(page.get_by_test_id("differences")).to_contain_text("plan.micro_batch")
    page.get_by_label("Align by").select_option("tokens")
    expect(page.locator("#compare-caption")).to_contain_text("by tokens seen")
    expect(chart).to_have_attribute("data-series", "2")
    check_page(page, "compare", phone=True)

    page.get_by_label("dp2-mb1").uncheck()
    page.get_by_role("button", name="Compare").click()
    expect(page.get_by_test_id("differences")).to_contain_text("Choose at least two runs")
    expect(chart).to_have_attribute("data-series", "1")


def test_a_blended_runs_page_charts_each_sources_validation_loss(signed_in_page, settings, tmp_path):
    page = signed_in_page
    (plan, _), dataset = _plans(page.user, settings, tmp_path)
    web = models.Dataset.objects.create(owner=page.user, name="web", path=dataset.path)
    run = _running(new_run(page.user, plan, dataset, name="blended", steps=40, eval_every=10,
                           blend=[{"dataset": web.pk, "weight": 1.0, "name": "web"}]))
    append_metrics(run, [step_record(s, 5.0 - s / 20) for s in range(1, 31)] +
                   [eval_record(s, 4.5 - s / 20, {"main": 4.8 - s / 20, "web": 4.2 - s / 20}) for s in (10, 20, 30)])

    page.goto(f"/runs/{run.pk}/")
    by_source = page.get_by_test_id("chart-val_by_source")
    expect(by_source).to_have_attribute("data-points", "6")
    summary = page.locator("#chart-val_by_source-summary")
    expect(summary).to_contain_text("main: 3 points from step 10 to 30, lowest 3.3, highest 4.3")
    expect(summary).to_contain_text("web: 3 points from step 10 to 30, lowest 2.7, highest 3.7, last 2.7")


def test_a_checkpoint_evaluated_from_the_run_page_is_scored_beside_the_loss(
        signed_in_page, settings, tmp_path, tmp_path_factory, broker, shakespeare_checkpoint):
    page = signed_in_page
    (plan, _), dataset = _plans(page.user, settings, tmp_path)
    run = new_run(page.user, plan, dataset, name="evaluated", steps=30)
    append_metrics(run, [step_record(s, 5.0 - s / 20) for s in range(1, 31)])
    models.Checkpoint.objects.create(run=run, step=30, path=str(shakespeare_checkpoint))
    # a set in a folder the session's worker reads as a data root too: first halves of lines against their ends
    sets = Path(run_temp_root(tmp_path_factory)) / "sets"
    sets.mkdir(exist_ok=True)
    lines = [line for line in presets.demo_text(60_000).decode().split("\n")[-40:] if len(line) >= 20][:6]
    (sets / "ends.jsonl").write_text("".join(json.dumps(
        {"question": line[:10], "choices": [line[10:], line[10:][::-1]], "answer": 0}) + "\n" for line in lines))
    settings.WORKBENCH = {**settings.WORKBENCH, "DATA_ROOTS": [sets]}
    models.EvaluationSet.objects.create(owner=page.user, name="ends", kind="choice", path=str(sets / "ends.jsonl"))

    page.goto(f"/runs/{run.pk}/")
    page.get_by_label("Evaluation set").select_option(label="ends (choice)")
    page.get_by_label("Checkpoint", exact=True).select_option(label="step 30")
    page.get_by_role("button", name="Evaluate").click()
    expect(page.get_by_text("Step 30 is queued for evaluation on ends")).to_be_visible()
    scores = page.get_by_test_id("checkpoint-scores-30")
    expect(scores).to_contain_text("ends: acc ", timeout=120_000)  # the table follows it without a reload
    acc = models.Evaluation.objects.get().scores["metrics"]["acc"]
    expect(scores).to_contain_text(f"ends: acc {acc:.3f}, acc_norm")
    page.reload()
    chart = page.get_by_test_id("chart-scores")
    expect(chart).to_have_attribute("data-points", "1")
    expect(page.locator("#chart-scores-title")).to_have_text("Evaluation scores by checkpoint")
    expect(page.locator("#chart-scores-summary")).to_contain_text("ends (acc): 1 point")
    check_page(page, "run-evaluated")
