"""The browser tests: Debian's Chromium, headless, driven by Playwright against the live test server.

Every page a test opens is held to two rules when the test calls ``check_page``: no console error (nor uncaught
exception) and no serious or critical violation found by axe-core, the accessibility engine from the pages' npm
packages. ``check_page`` also saves a screenshot, under ``<WORKBENCH_VAR>/screenshots/``, one a call.
"""
import os
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from tests.conftest import REPO


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--no-first-run", "--disable-dev-shm-usage"]
AXE = REPO / "webapp" / "frontend" / "node_modules" / "axe-core" / "axe.min.js"
SCREENSHOTS = Path(settings.VAR_DIR) / "screenshots"
BLOCKING_IMPACTS = ("serious", "critical")
LAPTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}
PASSWORD = "correct-horse-battery"


@pytest.fixture(scope="package")
def chromium():
    """One browser for the browser tests, gone when they are done (with the event loop Playwright runs)."""
    if not CHROMIUM.exists():
        pytest.fail(f"the browser tests drive {CHROMIUM}: scripts/test.sh installs it (as root), or "
                    f"`apt-get install chromium`")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread, which Django takes for an async context; the
    # tests' own ORM calls are synchronous all the same.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS,
                                                 headless=True)
            yield browser
            browser.close()
    finally:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


@pytest.fixture
def browser_user(transactional_db):
    return User.objects.create_user("ada", "ada@example.org", PASSWORD)


class PageProblems:
    """What a page said was wrong while a test drove it: console errors and uncaught exceptions."""

    def __init__(self, page):
        self.messages: list[str] = []
        page.on("console", lambda m: self.messages.append(f"console {m.type}: {m.text} ({page.url})")
                if m.type == "error" else None)
        page.on("pageerror", lambda e: self.messages.append(f"uncaught: {e} ({page.url})"))


def _wait_for_other_transactions(timeout_s: float = 15.0) -> None:
    """Wait until no other connection to the test database is inside a transaction.

    A page that has left may still have a request running on the live server (a chart's series, read in the
    request's transaction): emptying the database then would lock the tables in another order than that request
    and PostgreSQL would end one of the two as a deadlock, leaving either a failed request or a database that the
    next test finds full. Long polls wait outside any transaction and are not waited for.
    """
    if connection.vendor != "postgresql":
        return
    deadline = time.monotonic() + timeout_s
    quiet = 0
    with connection.cursor() as cursor:
        while quiet < 2 and time.monotonic() < deadline:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL")
            quiet = quiet + 1 if cursor.fetchone()[0] == 0 else 0
            time.sleep(0.05)


@pytest.fixture
def browser_page(transactional_db, chromium, live_server):
    """A fresh browser context on the live server, signed in as nobody; its console errors fail the test.

    It asks for the database first so that it closes first: the test database is emptied only once the page has
    left and the requests it left running have ended their transactions.
    """
    context = chromium.new_context(base_url=live_server.url, viewport=LAPTOP)
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.problems = PageProblems(page)
    yield page
    page.goto("about:blank")
    context.close()
    _wait_for_other_transactions()
    assert not page.problems.messages, "\n".join(page.problems.messages)


@pytest.fixture
def signed_in_page(browser_page, browser_user, live_server):
    """``browser_page`` signed in as ``browser_user``."""
    client = Client()
    client.force_login(browser_user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME]
    browser_page.context.add_cookies([{"name": cookie.key, "value": cookie.value, "url": live_server.url}])
    browser_page.user = browser_user
    return browser_page


def _axe_violations(page) -> list[dict]:
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    return page.evaluate("""async () => (await axe.run(document, {resultTypes: ["violations"]})).violations.map(
        v => ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 5).map(n => n.target.join(" "))}))""")


def check_page(page, name: str, phone: bool = False) -> None:
    """Hold the page as it is now to the rules above and save its screenshot as ``<name>.png``; with ``phone``,
    also at a phone's width (``<name>-phone.png``), where the page must not scroll sideways."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    blocking = [v for v in _axe_violations(page) if v["impact"] in BLOCKING_IMPACTS]
    assert not blocking, f"axe-core on {page.url}:\n" + "\n".join(
        f"{v['impact']} {v['id']}: {v['help']} at {v['nodes']}" for v in blocking)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
    if phone:
        page.set_viewport_size(PHONE)
        overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        page.screenshot(path=str(SCREENSHOTS / f"{name}-phone.png"), full_page=True)
        page.set_viewport_size(LAPTOP)
        assert overflow <= 1, f"{page.url} is {overflow} px wider than a phone's screen"
    assert not page.problems.messages, "\n".join(page.problems.messages)
