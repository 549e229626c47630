"""The first admin's one-time sign-in link (manage.py first_signin, which the run command calls on every start):
made only while no admin can sign in with a password, good for one sign-in within the hour, then a password."""
import io
import time
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.core import signing
from django.core.management import call_command
from django.test import Client

from webapp.services.first_signin import LINK_HOURS

pytestmark = pytest.mark.django_db
PASSWORD = "a long new password, 7 words"


def first_signin() -> str:
    """The run command's call: the link's path, or '' when it prints none."""
    out = io.StringIO()
    call_command("first_signin", "--url", "http://127.0.0.1:8000", stdout=out)
    printed = out.getvalue().strip()
    assert printed == "" or printed.startswith("http://127.0.0.1:8000/signin/"), printed
    return urlsplit(printed).path if printed else ""


def _signed_in_as(client: Client) -> str:
    answer = client.get("/")
    return "" if answer.status_code == 302 else answer.wsgi_request.user.username


def test_it_prints_a_link_for_a_new_admin_only_while_no_admin_has_a_password():
    assert first_signin()
    admin = User.objects.get()
    assert (admin.username, admin.is_superuser, admin.is_staff, admin.has_usable_password()) == (
        "admin", True, True, False)
    # started again before the link was used: a new link, for the same admin
    assert first_signin() and User.objects.count() == 1
    admin.set_password(PASSWORD)
    admin.save()
    assert first_signin() == ""


def test_it_prints_no_link_where_createsuperuser_made_an_admin():
    User.objects.create_superuser("root", "root@example.org", PASSWORD)
    assert first_signin() == "" and User.objects.count() == 1


def test_it_signs_in_once_and_then_asks_for_a_password():
    link, browser = first_signin(), Client()
    # opening the link (or a preview of it) spends nothing
    assert browser.get(link).status_code == 200 and browser.get(link).status_code == 200
    assert _signed_in_as(browser) == ""
    signed_in = browser.post(link)
    assert signed_in.status_code == 302 and signed_in["Location"] == "/password/"
    assert _signed_in_as(browser) == "admin"
    # the second use, from anywhere, is refused
    again = Client()
    other = again.post(link)
    assert other.status_code == 403 and "used already" in other.content.decode()
    assert _signed_in_as(again) == "" and again.get(link).status_code == 403
    # the password, then signing in as anyone does
    assert browser.get("/password/").status_code == 200
    assert browser.post("/password/", {"new_password1": PASSWORD, "new_password2": PASSWORD})["Location"] == "/"
    assert User.objects.get().check_password(PASSWORD) and _signed_in_as(browser) == "admin"
    assert browser.get("/password/")["Location"] == "/"  # offered only to a user without a password
    assert Client().login(username="admin", password=PASSWORD) and first_signin() == ""


def test_it_refuses_an_expired_link_and_one_it_did_not_sign(monkeypatch):
    made_at = int(time.time()) - LINK_HOURS * 3600 - 60
    with monkeypatch.context() as past:
        past.setattr(signing.TimestampSigner, "timestamp", lambda self: signing.b62_encode(made_at))
        expired = first_signin()
    refused = Client().post(expired)
    assert refused.status_code == 403 and "expired" in refused.content.decode()
    forged = first_signin().replace("/signin/", "/signin/x")
    assert "not a sign-in link" in Client().post(forged).content.decode()
    assert not User.objects.get().last_login  # nobody got in
