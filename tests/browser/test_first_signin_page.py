"""The first admin's way in as a newcomer takes it: the link the run command printed, one press, a password, the
dashboard. (A spent or expired link: tests/webapp/test_first_signin.py.)"""
from django.contrib.auth.models import User
from playwright.sync_api import expect

from tests.browser.conftest import check_page
from tests.webapp.test_first_signin import PASSWORD, first_signin


def test_it_signs_the_first_admin_in_from_the_printed_link_and_sets_a_password(browser_page):
    page = browser_page
    link = first_signin()
    page.goto(link)
    check_page(page, "first-signin", phone=True)
    page.get_by_role("button", name="Sign in as admin").click()
    expect(page).to_have_url("/password/")
    check_page(page, "set-password", phone=True)
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_label("The same again").fill(PASSWORD)
    page.get_by_role("button", name="Set the password").click()
    expect(page).to_have_url("/")
    expect(page.get_by_role("status")).to_contain_text("Your password is set")
    assert User.objects.get(username="admin").check_password(PASSWORD)
