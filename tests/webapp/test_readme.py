"""Every request the README shows works as written, in its order, on a fresh database: a newcomer can copy them."""
import json
import re

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from tests.conftest import REPO

REQUEST = re.compile(r"^    (GET|POST|PUT|PATCH|DELETE)\s+(/\S+)\s*(.*)$")


def readme_requests() -> list[tuple[str, str, object]]:
    """(method, path, JSON body or None) of each request line of the README's "Using it" section; a body may go on
    over indented lines."""
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
        body = body.replace("<checkout>", str(REPO)).replace("<your password>", "correct-horse-battery")
        found.append((method, path, json.loads(body) if body else None))
    return found


def test_it_finds_the_readmes_requests():
    requests = readme_requests()
    assert len(requests) >= 10 and requests[0][1] == "/api/token/" and requests[-1] == ("POST", "/api/runs/1/cancel/",
                                                                                      None)


@pytest.mark.django_db(reset_sequences=True)  # the README's ids are those of a fresh install
def test_it_answers_every_readme_request_as_written(settings, tmp_path, quiet_broker):
    settings.WORKBENCH = {**settings.WORKBENCH, "RUNS_ROOT": tmp_path / "runs"}
    User.objects.create_superuser("admin", "admin@example.org", "correct-horse-battery")
    client = APIClient()
    for method, path, body in readme_requests():
        answer = getattr(client, method.lower())(path, body, format="json")
        assert 200 <= answer.status_code < 300, (method, path, answer.status_code, answer.content[:2000])
        if path == "/api/token/":
            client.credentials(HTTP_AUTHORIZATION=f"Token {answer.json()['token']}")
