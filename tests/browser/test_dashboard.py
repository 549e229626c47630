"""Signing in, and the dashboard: the runs with their progress and loss sparklines, filtered in place."""
from playwright.sync_api import expect

from tests.browser.conftest import PASSWORD, check_page
from tests.webapp.live_runs import append_metrics, new_run, step_record
from trainer.contract import ParallelPlan, presets
from webapp import models
from webapp.services.demo import demo_ready


def test_it_signs_in_through_the_sign_in_page_and_lands_on_the_dashboard(browser_page, browser_user):
    page = browser_page
    page.goto("/")
    expect(page).to_have_url("/login/?next=/")
    check_page(page, "sign-in")
    page.get_by_label("Username").fill("ada")
    page.get_by_label("Password").fill("wrong password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("enter a correct username and password")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    expect(page.get_by_text("Your first run")).to_be_visible()  # nothing yet: the way to a first run
    check_page(page, "dashboard-empty", phone=True)


def _runs(owner, settings, tmp_path):
    settings.WORKBENCH = {**settings.WORKBENCH, "RUNS_ROOT": tmp_path / "runs"}
    cluster, dataset = demo_ready(owner)
    model = models.ModelConfig.objects.create(owner=owner, name="tiny", spec=presets.MODELS["tiny"].to_dict())
    plan = models.ParallelismPlan.objects.create(owner=owner, name="one", model_config=model, cluster=cluster,
                                                 spec=ParallelPlan(dp=2, micro_batch=2, global_batch=4).to_dict())
    learning = new_run(owner, plan, dataset, name="learning", steps=400)
    append_metrics(learning, [step_record(s, 5.0 - s / 100) for s in range(1, 301)])
    models.Run.objects.filter(pk=learning.pk).update(status=models.RunStatus.COMPLETED)
    named = models.ParallelismPlan.objects.create(owner=owner, name="tiny dp2 tp1 pp1 on local", model_config=model,
                                                  cluster=cluster, spec=plan.spec)  # as the wizard names a plan
    new_run(owner, named, dataset, name="waiting")
    return learning


def test_it_lists_runs_with_progress_and_a_loss_sparkline_and_filters_them_in_place(signed_in_page, settings,
                                                                                      tmp_path):
    page = signed_in_page
    learning = _runs(page.user, settings, tmp_path)
    page.goto("/")
    table = page.get_by_role("table")
    expect(table).to_contain_text("2 runs")
    row = page.get_by_role("row").filter(has_text="learning")
    expect(row).to_contain_text("300 / 400")
    expect(row.get_by_role("img", name=f"loss of run {learning.pk}")).to_be_visible()
    expect(row.get_by_role("cell", name="one on local")).to_be_visible()
    # a plan named for its cluster is not told its cluster again
    expect(page.get_by_role("row").filter(has_text="waiting").get_by_role("cell", name="on local")).to_have_text(
        "tiny dp2 tp1 pp1 on local")
    check_page(page, "dashboard", phone=True)

    page.get_by_label("Status").select_option("completed")
    expect(table).to_contain_text("1 run")
    expect(page).to_have_url("/?q=&status=completed&owner=&sort=newest")
    page.get_by_label("Status").select_option("")
    page.get_by_label("Search").fill("wait")
    expect(table).to_contain_text("1 run")
    expect(page.get_by_role("row").filter(has_text="waiting")).to_be_visible()
