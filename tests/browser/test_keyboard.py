"""The pages work with the keyboard alone: a skip link to the content, every control reached by Tab, a run
launched with Enter from the dashboard."""
import re

from playwright.sync_api import expect

from tests.browser.conftest import check_page
from webapp import models

MAX_TABS = 150


def tab_to(page, selector: str) -> None:
    """Press Tab until the focus is on ``selector``; fail if it never gets there."""
    for _ in range(MAX_TABS):
        page.keyboard.press("Tab")
        if page.evaluate("s => document.activeElement?.matches(s) ?? false", selector):
            return
    raise AssertionError(f"{MAX_TABS} presses of Tab never reached {selector} on {page.url}")


def test_it_launches_a_first_run_from_the_dashboard_with_the_keyboard_alone(signed_in_page, sent):
    page = signed_in_page
    page.goto("/")
    page.keyboard.press("Tab")
    skip = page.get_by_role("link", name="Skip to content")
    expect(skip).to_be_focused()
    expect(skip).to_be_in_viewport()  # shown when focused
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()
    tab_to(page, "main a.button")  # the first run's New run
    page.keyboard.press("Enter")
    expect(page).to_have_url("/runs/new/")
    tab_to(page, "[data-testid=launch]")
    check_page(page, "keyboard-launch-focused")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = models.Run.objects.get()
    assert run.status == models.RunStatus.QUEUED and ("workbench.runs.launch", run.pk) in sent
