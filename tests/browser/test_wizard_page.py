"""The New-run wizard in a browser: the estimate follows the plan as it is typed, the tuner fills the plan, a preset
fills the model, and a blend of two datasets is launched."""
import re

from playwright.sync_api import expect

from tests.browser.conftest import LAPTOP, PHONE, check_page
from tests.browser.wrapping import broken_words
from webapp import models
from webapp.services.demo import demo_ready


def test_the_estimate_follows_tp_and_a_tuned_plan_fills_the_fields(signed_in_page):
    page = signed_in_page
    page.goto("/runs/new/")
    expect(page.get_by_role("heading", name="New run")).to_be_visible()
    step_time, memory = page.get_by_test_id("estimate-step-time"), page.get_by_test_id("estimate-memory")
    expect(step_time).to_have_text(re.compile(r"\d.* ms"))
    before, before_memory = step_time.inner_text(), memory.inner_text()
    expect(page.locator("#id_plan-dp")).to_have_value("2")
    check_page(page, "wizard", phone=True)
    for viewport in (PHONE, LAPTOP):  # long field names wrap between their words (at "_"), not inside one
        page.set_viewport_size(viewport)
        assert not broken_words(page), f"words broken at {viewport['width']} px: {broken_words(page)}"

    # On CPU ranks: a process's memory against what the cpu preset plans for it; a cost only with a rate, in USD
    expect(page.get_by_test_id("estimate-capacity")).to_contain_text(
        "the memory the cpu preset plans for each process (not this machine's memory)")
    expect(page.get_by_test_id("estimate-cost")).to_contain_text("give a cost per GPU-hour")
    page.locator("#id_run-gpu_hour_cost").fill("2")
    expect(page.get_by_test_id("estimate-cost")).to_contain_text("USD (at 2 USD per process-hour)")

    page.locator("#id_plan-tp").fill("2")  # two CPU ranks: dp follows to 1
    expect(page.locator("#id_plan-dp")).to_have_value("1")
    expect(step_time).not_to_have_text(before)
    assert memory.inner_text() != before_memory
    expect(page.locator("#errors-plan-tp")).to_be_empty()

    page.locator("#id_plan-tp").fill("3")  # the heads refuse it, next to the field
    expect(page.locator("#errors-plan-tp")).to_contain_text("tp=3 does not divide n_heads=4")
    expect(page.locator("#id_plan-tp")).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_test_id("estimate-none")).to_be_visible()

    page.get_by_role("button", name="Auto-tune").click()
    ranked = page.get_by_test_id("tune-ranked")
    expect(ranked).to_be_visible()
    expect(page.get_by_test_id("tune-excluded")).to_be_visible()
    summary = page.get_by_test_id("tune-summary").inner_text()  # the plans estimated are those that fit and those not
    counts = re.search(r"([\d,]+) plans? estimated.*?([\d,]+) fits? in memory, ([\d,]+) do(?:es)? not", summary, re.S)
    assert counts, summary
    estimated, fit, too_large = (int(n.replace(",", "")) for n in counts.groups())
    assert fit + too_large == estimated, summary
    ranked.get_by_role("button", name="Use this plan (#1)").click()
    expect(page.locator("#id_plan-tp")).not_to_have_value("3")
    expect(page.locator("#errors-plan-tp")).to_be_empty()
    expect(page.get_by_test_id("estimate-step-time")).to_be_visible()
    check_page(page, "wizard-tuned")
    assert not broken_words(page), broken_words(page)

    tuned_memory = memory.inner_text()
    page.get_by_label("Start from").select_option("preset:gpt2-small")  # its figures fill the model's fields
    expect(page.locator("#id_model-n_layers")).to_have_value("12")
    expect(page.locator("#id_model-vocab_size")).to_have_value("50257")
    expect(memory).not_to_have_text(tuned_memory)


def test_a_blend_launched_from_the_wizard_opens_on_a_page_that_charts_each_source(signed_in_page, settings, tmp_path):
    page = signed_in_page
    settings.WORKBENCH = {**settings.WORKBENCH, "RUNS_ROOT": tmp_path / "runs"}
    _, dataset = demo_ready(page.user)
    models.Dataset.objects.create(owner=page.user, name="web", path=dataset.path)
    page.goto("/runs/new/")
    page.get_by_label("Blend with").select_option(label="web")
    page.get_by_label("Its weight").fill("0.5")
    page.get_by_test_id("launch").click()
    expect(page.get_by_test_id("chart-val_by_source")).to_be_visible()
    run = models.Run.objects.get()
    assert [(s["name"], s["weight"]) for s in run.spec["blend"]] == [("web", 0.5)] and run.eval_every > 0
