"""Production settings: DEBUG off by default, no built-in secret key outside development, a deploy check without
warnings, error pages that show no settings, and sign-in attempts limited."""
import os
import secrets
import subprocess
import sys

import pytest
from django.db import connection
from django.test import Client

from tests.conftest import REPO
from webapp.api import views
from webapp.pages import dashboard


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    """manage.py in a fresh process with only ``env`` (and PATH): what a server started in production sees."""
    clean = {"PATH": os.environ["PATH"], "WORKBENCH_VAR": env.pop("WORKBENCH_VAR"), **env}
    quiet = ["-v", "0"] if args[0] == "shell" else []
    return subprocess.run([sys.executable, "manage.py", *args, *quiet], cwd=REPO, env=clean, capture_output=True,
                          text=True, timeout=120)


def test_it_refuses_to_start_outside_development_with_the_built_in_secret_key(tmp_path):
    refused = _manage("check", WORKBENCH_VAR=str(tmp_path))
    assert refused.returncode != 0
    assert "ImproperlyConfigured: DJANGO_SECRET_KEY is not set" in refused.stderr
    assert "set DJANGO_SECRET_KEY to a random value of 50 characters or more" in refused.stderr
    development = _manage("check", WORKBENCH_VAR=str(tmp_path), DJANGO_DEBUG="1")
    assert development.returncode == 0, development.stderr


def test_it_passes_the_deploy_check_without_a_warning_under_production_settings(tmp_path):
    checked = _manage("check", "--deploy", "--fail-level", "WARNING", WORKBENCH_VAR=str(tmp_path),
                      DJANGO_SECRET_KEY=secrets.token_urlsafe(50))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "System check identified no issues (0 silenced)." in checked.stdout


def test_it_keeps_debug_off_and_https_on_unless_told(tmp_path):
    script = ("from django.conf import settings as s; print(s.DEBUG, s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, "
              "s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, getattr(s, 'SECURE_PROXY_SSL_HEADER', None))")
    key = secrets.token_urlsafe(50)
    production = _manage("shell", "-c", script, WORKBENCH_VAR=str(tmp_path), DJANGO_SECRET_KEY=key)
    assert production.stdout.split() == ["False", "True", "True", "True", "31536000", "None"], production.stderr
    proxied = _manage("shell", "-c", script, WORKBENCH_VAR=str(tmp_path), DJANGO_SECRET_KEY=key,
                      DJANGO_BEHIND_TLS_PROXY="1", DJANGO_SSL_REDIRECT="0")
    assert proxied.stdout.split()[1] == "False" and "HTTP_X_FORWARDED_PROTO" in proxied.stdout
    development = _manage("shell", "-c", script, WORKBENCH_VAR=str(tmp_path), DJANGO_DEBUG="1")
    assert development.stdout.split()[:2] == ["True", "False"]
    bad = _manage("shell", "-c", script, WORKBENCH_VAR=str(tmp_path), DJANGO_DEBUG="yes")
    assert "DJANGO_DEBUG='yes': set it to 1 (on) or 0 (off)" in bad.stderr


SECRET_BROKER = "redis://:broker-password-42@redis.internal.example:6379/0"


@pytest.fixture
def failing_run_list(monkeypatch, settings, alice):
    """GET /api/runs/ fails with an error of the server's own, with credentials in the broker's URL."""
    settings.CELERY_BROKER_URL = settings.CELERY_RESULT_BACKEND = SECRET_BROKER

    def broken(self, request, *args, **kwargs):
        raise RuntimeError("a bug of the server")
    monkeypatch.setattr(views.RunViewSet, "list", broken)
    client = Client(raise_request_exception=False)
    client.force_login(alice)
    return client


def _secrets() -> list[str]:
    database = connection.settings_dict
    return [SECRET_BROKER, "broker-password-42", str(database["NAME"]), os.environ.get("DATABASE_URL") or "",
            os.environ.get("REDIS_URL") or SECRET_BROKER]


def test_it_answers_a_server_error_with_debug_off_without_any_setting(failing_run_list, settings):
    settings.DEBUG = False
    page = failing_run_list.get("/api/runs/")
    assert page.status_code == 500 and page["Content-Type"] == "application/json"  # an error under /api/: JSON
    body = page.content.decode()
    assert "the server failed" in page.json()["detail"]
    for secret in filter(None, _secrets()):
        assert secret not in body
    assert "SECRET_KEY" not in body and "a bug of the server" not in body


def test_it_hides_database_and_broker_urls_even_on_the_debug_page(failing_run_list, settings, monkeypatch):
    settings.DEBUG = True
    def broken(*args, **kwargs):
        raise RuntimeError("a bug of the server")
    monkeypatch.setattr(dashboard, "dashboard_runs", broken)  # a page's error: the API's would be answered as JSON
    page = failing_run_list.get("/", HTTP_ACCEPT="text/html")
    body = page.content.decode()
    assert page.status_code == 500 and "CELERY_BROKER_URL" in body  # the technical page, with its settings table
    for secret in filter(None, _secrets()):
        assert secret not in body


# Sign-in attempts: ten a minute per address and per username, then 429 whatever the password.

def _wrong(client, url: str, **extra):
    return client.post(url, {"username": "alice", "password": "wrong-horse", **extra}, **(
        {"content_type": "application/json"} if url == "/api/token/" else {}))


@pytest.mark.parametrize("url", ["/api/token/", "/api/auth/login/", "/admin/login/"])
def test_it_refuses_the_eleventh_wrong_password_in_a_minute(alice, url):
    client = Client(enforce_csrf_checks=False)
    for attempt in range(10):
        answer = _wrong(client, url)
        assert answer.status_code in (200, 400), (attempt, answer.status_code)  # a form again, or a 400: not yet
    refused = _wrong(client, url)
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert "try again in" in refused.json()["detail"] or "throttled" in refused.json()["detail"]
    # the right password does not get past the limit either
    right = client.post(url, {"username": "alice", "password": "correct-horse-battery"},
                        **({"content_type": "application/json"} if url == "/api/token/" else {}))
    assert right.status_code == 429


def test_it_counts_attempts_per_username_across_addresses(alice):
    for n in range(10):
        assert _wrong(Client(REMOTE_ADDR=f"10.0.0.{n}"), "/api/token/").status_code == 400
    assert _wrong(Client(REMOTE_ADDR="10.0.1.1"), "/api/token/").status_code == 429
    # and ignores a client's own X-Forwarded-For: no proxy is configured in front of this server
    client = Client(REMOTE_ADDR="10.0.2.1")
    for n in range(10):
        client.post("/api/token/", {"username": f"nobody{n}", "password": "x"}, content_type="application/json",
                    HTTP_X_FORWARDED_FOR=f"192.0.2.{n}")
    assert client.post("/api/token/", {"username": "nobody-else", "password": "x"}, content_type="application/json",
                       HTTP_X_FORWARDED_FOR="192.0.2.99").status_code == 429


def test_it_gives_a_token_for_a_username_and_password(alice, api):
    answer = Client().post("/api/token/", {"username": "alice", "password": "correct-horse-battery"},
                           content_type="application/json")
    assert answer.status_code == 200 and answer.json()["token"] == alice.auth_token.key
    wrong = Client().post("/api/token/", {"username": "alice", "password": "nope"}, content_type="application/json")
    assert wrong.status_code == 400 and "Unable to log in" in wrong.json()["non_field_errors"][0]
    assert api(alice).get("/api/runs/").status_code == 200
