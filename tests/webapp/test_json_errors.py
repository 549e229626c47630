"""Every error under /api/ and /v1 is JSON: the API's ``{"detail": …}`` under /api/, OpenAI's ``{"error": {…}}``
under /v1, whoever made it (a view, Django's URL resolution, a method check, CSRF, a crash) and in DEBUG too.

The walk reads the routes from the URL resolver, so a route added later is walked without changing this file."""
import json

import pytest
from django.http import HttpResponse
from django.test import Client
from django.urls import get_resolver, path
from django.urls.resolvers import URLResolver
from django.utils.regex_helper import normalize
from rest_framework.views import APIView

from webapp import urls as product_urls
from webapp.api.openai import OpenAIView

# What a fuzzer puts where an id goes: a word, an id that does not exist, one beyond a 64-bit integer, letters
# outside ASCII, a decimal (whose dot a format suffix could take).
BAD_IDS = ["abc", "999999", "99999999999999999999", "ünï漢", "1.5"]
METHODS = ["get", "post", "put", "patch", "delete", "options"]


def _routes(patterns, prefix: str = ""):
    """Every route as (path format, parameter names), as Django's own reversing reads them."""
    for pattern in patterns:
        regex = prefix + pattern.pattern.regex.pattern.removeprefix("^")
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, regex)
        else:
            yield from normalize(regex)


def api_paths() -> list[str]:
    """Every route under /api/ and /v1 with each bad id in each of its parameters (a format suffix as json)."""
    found = set()
    for form, params in _routes(get_resolver().url_patterns):
        if not (form.startswith("api/") or form == "v1" or form.startswith("v1/")):
            continue
        for bad in BAD_IDS if params else [""]:
            found.add("/" + form % {p: "json" if p == "format" else bad for p in params})
    return sorted(found)


def _assert_json_error(answer, method: str, url: str) -> None:
    where = f"{method.upper()} {url} → {answer.status_code}"
    assert answer.status_code < 500, f"{where}: a client's request made a server error"
    if answer.status_code < 400:
        return
    assert answer["Content-Type"].startswith("application/json"), f"{where}: {answer['Content-Type']}"
    body = json.loads(answer.content)
    if url.startswith("/v1"):
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, (where, body)
        assert body["error"]["message"], where
    else:
        assert isinstance(body, (dict, list)) and body, (where, body)


def test_the_walk_finds_the_routes_with_ids_and_the_openai_ones():
    paths = api_paths()
    assert "/api/runs/abc/" in paths and "/api/runs/abc/updates/" in paths and "/v1/models/abc" in paths
    assert "/api/deployments/ünï漢/generate/" in paths and "/v1/chat/completions" in paths
    assert len({p for p in paths if p.startswith("/api/")}) > 100


@pytest.mark.django_db
@pytest.mark.parametrize("signed_in", [False, True], ids=["anonymous", "signed-in"])
def test_every_error_of_every_api_route_is_json(alice, signed_in):
    client = Client()
    if signed_in:
        client.force_login(alice)
    for url in api_paths():
        for method in METHODS:
            _assert_json_error(getattr(client, method)(url), method, url)


@pytest.mark.django_db
def test_every_openai_route_answers_a_bearer_key_with_openais_errors(alice):
    client = Client(headers={"Authorization": f"Bearer {alice.auth_token.key}"})
    for url in [p for p in api_paths() if p.startswith("/v1")]:
        for method in METHODS:
            answer = client.generic(method.upper(), url, "{}", content_type="application/json")
            _assert_json_error(answer, method, url)


@pytest.mark.django_db
@pytest.mark.parametrize("debug", [False, True], ids=["production", "debug"])
def test_a_route_nothing_matches_is_a_json_404_also_in_debug(settings, debug):
    settings.DEBUG = debug
    answer = Client().get("/api/runs/abc/updates/")
    assert answer.status_code == 404 and answer["Content-Type"] == "application/json"
    assert "GET /api/runs/abc/updates/" in answer.json()["detail"]


@pytest.mark.django_db
def test_a_method_a_plain_django_view_refuses_is_a_json_405_that_keeps_allow():
    answer = Client().get("/api/auth/logout/")  # Django's LogoutView takes POST only
    assert answer.status_code == 405 and answer["Content-Type"] == "application/json"
    assert "POST" in answer["Allow"] and "GET" in answer.json()["detail"]


@pytest.mark.django_db
def test_a_sign_in_form_without_its_csrf_token_is_a_json_403():
    answer = Client(enforce_csrf_checks=True).post("/api/auth/login/", {"username": "a", "password": "b"})
    assert answer.status_code == 403 and answer["Content-Type"] == "application/json"
    assert "CSRF" in answer.json()["detail"]


@pytest.mark.django_db
def test_a_disallowed_host_is_a_json_400(settings):
    settings.ALLOWED_HOSTS = ["workbench.example"]
    answer = Client(HTTP_HOST="elsewhere.example").get("/api/runs/")
    assert answer.status_code == 400 and answer["Content-Type"] == "application/json"
    answer = Client(HTTP_HOST="elsewhere.example").get("/v1/models")
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.django_db
def test_the_browsable_apis_error_page_is_answered_as_json_too(alice):
    answer = Client(headers={"Accept": "text/html"}).get("/api/runs/999999/")
    assert answer.status_code in (401, 403) and answer["Content-Type"] == "application/json"
    assert answer.json()["detail"]


def test_an_error_the_event_stream_carries_stays_an_event(alice, db):
    client = Client(headers={"Accept": "text/event-stream"})
    client.force_login(alice)
    answer = client.post("/api/deployments/999999/generate/", "{}", content_type="application/json")
    assert answer.status_code == 404 and answer["Content-Type"].startswith("text/event-stream")
    assert answer.content.startswith(b"event: error\ndata: {")


# -- a crash inside a view: this module is also the URLconf of the tests below, the product's routes after its own

def _crash(request, *args, **kwargs):
    raise RuntimeError("a bug in a view")


class CrashingAPIView(APIView):
    authentication_classes, permission_classes = [], []
    get = _crash


class CrashingOpenAIView(OpenAIView):
    authentication_classes, permission_classes = [], []
    get = _crash


urlpatterns = [
    path("api/test-crash/plain/", _crash),
    path("api/test-crash/drf/", CrashingAPIView.as_view()),
    path("v1/test-crash", CrashingOpenAIView.as_view()),
    path("page-crash/", _crash),
    *product_urls.urlpatterns,
]


@pytest.mark.urls(__name__)
@pytest.mark.parametrize("debug", [False, True], ids=["production", "debug"])
@pytest.mark.parametrize("url", ["/api/test-crash/plain/", "/api/test-crash/drf/"])
def test_a_crash_under_api_is_a_json_500_also_in_debug(settings, url, debug):
    settings.DEBUG = debug
    answer = Client(raise_request_exception=False).get(url)
    assert answer.status_code == 500 and answer["Content-Type"] == "application/json"
    assert "server failed" in answer.json()["detail"] and "a bug in a view" not in answer.content.decode()


@pytest.mark.urls(__name__)
@pytest.mark.parametrize("debug", [False, True], ids=["production", "debug"])
def test_a_crash_under_v1_is_openais_500_also_in_debug(settings, debug):
    settings.DEBUG = debug
    answer = Client(raise_request_exception=False).get("/v1/test-crash")
    assert answer.status_code == 500 and answer["Content-Type"] == "application/json"
    error = answer.json()["error"]
    assert error["type"] == "server_error" and error["message"]


@pytest.mark.urls(__name__)
def test_a_crash_of_a_page_stays_djangos_page(settings):
    answer = Client(raise_request_exception=False).get("/page-crash/")
    assert answer.status_code == 500 and answer["Content-Type"].startswith("text/html")
