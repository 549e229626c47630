"""Every request the README shows works as written, in its order, with the ids the answers give: on a fresh
database, and after a first sign-in to the pages and a launch from New run have made their own objects. A newcomer
can copy them."""
import json
import re
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from tests.conftest import REPO
from webapp import models
from webapp.pages.wizard_forms import default_data
from webapp.services.demo import DEMO_DATASET, LOCAL_CLUSTER

REQUEST = re.compile(r"^    (GET|POST|PUT|PATCH|DELETE)\s+(/\S+)\s*(.*)$")
GIVES = re.compile(r"(?:^|\s+)→ <([^>]+)>$")  # "→ <plan>": the id the answer gives, for later requests' <plan>
PLACEHOLDER = re.compile(r"<([a-z ]+)>")
PASSWORD = "correct-horse-battery"


@dataclass(frozen=True)
class ReadmeRequest:
    method: str
    path: str
    body: str    # JSON with placeholders, or ""
    gives: str   # the placeholder the answer's id fills, or ""

    def uses(self) -> set[str]:
        return set(PLACEHOLDER.findall(self.path + self.body))


def readme_requests() -> list[ReadmeRequest]:
    """Each request line of the README's "Using it" section; a body may go on over indented lines, and the last of
    them may end with the placeholder its answer's id fills."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Using it"):]
    section = section[:section.index("\n## ", 3)]
    found, lines = [], section.splitlines()
    for i, line in enumerate(lines):
        match = REQUEST.match(line)
        if not match:
            continue
        method, path, body = match.groups()
        for more in lines[i + 1:]:
            if not more.startswith(" " * 8) or REQUEST.match(more):
                break
            body += " " + more.strip()
        gives = GIVES.search(body)
        if gives:
            body = body[:gives.start()]
        found.append(ReadmeRequest(method, path, body.strip(), gives.group(1) if gives else ""))
    return found


def _filled(text: str, values: dict[str, object]) -> str:
    for name in PLACEHOLDER.findall(text):
        assert name in values, f"the README uses <{name}> before a request gives it"
        text = text.replace(f"<{name}>", str(values[name]))
    return text


def walk_readme() -> dict[str, int]:
    """Send the README's requests in order as admin; the ids their answers gave, by placeholder."""
    client, values = APIClient(), {"your password": PASSWORD}
    for request in readme_requests():
        path, body = _filled(request.path, values), _filled(request.body, values)
        answer = getattr(client, request.method.lower())(path, json.loads(body) if body else None, format="json")
        assert 200 <= answer.status_code < 300, (request.method, path, answer.status_code, answer.content[:2000])
        if request.path == "/api/token/":
            client.credentials(HTTP_AUTHORIZATION=f"Token {answer.json()['token']}")
        if request.gives:
            data = answer.json()
            if "results" in data:  # a list: it must find exactly the one object the README means
                assert data["count"] == 1, (path, data)
                data = data["results"][0]
            values[request.gives] = data["id"]
    return {name: value for name, value in values.items() if name != "your password"}


@pytest.fixture
def admin(db, settings, tmp_path, quiet_broker):
    settings.WORKBENCH = {**settings.WORKBENCH, "RUNS_ROOT": tmp_path / "runs"}
    return User.objects.create_superuser("admin", "admin@example.org", PASSWORD)


def test_it_finds_the_readmes_requests_and_each_id_before_its_use():
    requests = readme_requests()
    assert len(requests) >= 10 and requests[0].path == "/api/token/"
    assert (requests[-1].method, requests[-1].path) == ("POST", "/api/runs/<run>/cancel/")
    given = {"your password"}
    for request in requests:
        assert request.uses() <= given, (request, given)
        given.add(request.gives)
    assert {"cluster", "dataset", "model config", "plan", "run"} <= given


def _demo_objects(owner):
    return (models.Cluster.objects.filter(name=LOCAL_CLUSTER).count(),
            models.Dataset.objects.filter(owner=owner, name=DEMO_DATASET).count())


def test_it_answers_every_readme_request_on_a_fresh_database(admin):
    ids = walk_readme()
    run = models.Run.objects.get(pk=ids["run"])
    assert (run.cluster.name, run.dataset.name, run.status) == (LOCAL_CLUSTER, DEMO_DATASET, "cancelled")
    assert _demo_objects(admin) == (1, 1)  # the token's first sign-in made them; the README made no copy


def test_it_answers_every_readme_request_after_the_pages_made_their_own(admin):
    pages = Client()
    signed_in = pages.post("/login/", {"username": "admin", "password": PASSWORD})
    assert signed_in.status_code == 302 and pages.get("/").status_code == 200  # the first sign-in: the dashboard
    launched = pages.post("/runs/new/", default_data(admin))  # New run → Launch, with the wizard's defaults
    assert launched.status_code == 302, launched.content.decode()[-3000:]
    wizard_run = models.Run.objects.get()
    ids = walk_readme()
    run = models.Run.objects.get(pk=ids["run"])
    assert run.pk != wizard_run.pk and run.plan_id != wizard_run.plan_id
    assert run.model_config_id != wizard_run.model_config_id
    assert (run.cluster_id, run.dataset_id) == (wizard_run.cluster_id, wizard_run.dataset_id)
    assert _demo_objects(admin) == (1, 1)
