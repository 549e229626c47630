"""The OpenAPI schema is valid OpenAPI 3, the Swagger page renders offline, and generated requests never get a 5xx."""
import itertools

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings, strategies as st
from django.core import signals
from django.db import close_old_connections
from openapi_spec_validator import validate

from trainer.contract import presets
from webapp import models
from webapp.wsgi import application


def test_it_serves_a_valid_openapi_3_schema(db, client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    validate(schema)
    assert schema["openapi"].startswith("3.")
    assert {"/api/runs/", "/api/plans/", "/api/runs/{id}/cancel/"} <= set(schema["paths"])
    plan_spec = schema["components"]["schemas"]["ParallelismPlanRequest"]["properties"]["spec"]
    assert plan_spec["properties"]["pipeline_schedule"]["enum"] == ["gpipe", "1f1b", "interleaved"]


def test_it_serves_the_swagger_page_with_local_assets(db, client):
    page = client.get("/api/docs/")
    assert page.status_code == 200 and b"swagger-ui" in page.content
    assert b"cdn.jsdelivr" not in page.content and b"unpkg" not in page.content


# Generated requests: every operation of the schema, positive (schema-valid) and negative (schema-violating) data,
# as two ordinary users and staff, against a database holding objects for the generated ids to hit.
GENERATED_REQUESTS = 600


@pytest.fixture
def populated(alice, bob, staff, cluster8, data_root, plan222, corpus):
    models.ModelConfig.objects.create(owner=bob, name="tiny", spec=presets.MODELS["tiny"].to_dict(), shared=True)
    run = models.Run.objects.create(owner=alice, name="r", model_config=plan222.model_config, plan=plan222,
                                    cluster=cluster8, dataset=corpus)
    models.Metric.objects.create(run=run, step=1, loss=3.0, values={"loss": 3.0})
    return [alice, bob, staff]


@pytest.fixture
def keep_test_connection():
    """Calls through the WSGI app fire Django's request signals, whose handler would close the connection holding
    the test's transaction; Django's own test client disconnects it the same way."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


def test_it_answers_600_generated_requests_without_a_server_error(populated, keep_test_connection):
    schema = schemathesis.openapi.from_wsgi("/api/schema/", application,
                                            headers={"Accept": "application/vnd.oai.openapi+json"})
    tokens = [f"Token {user.auth_token.key}" for user in populated]
    positive = schema.as_strategy()
    negative = schema.as_strategy(generation_mode=schemathesis.GenerationMode.NEGATIVE)
    sent, statuses, failures = itertools.count(), {}, []

    @settings(max_examples=GENERATED_REQUESTS, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(positive, positive, negative), token=st.sampled_from(tokens))
    def send(case, token):
        response = case.call(headers={"Authorization": token})
        next(sent)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        if response.status_code >= 500:
            failures.append(f"{case.method} {case.formatted_path} {case.body!r} -> {response.status_code}: "
                            f"{response.text[:300]}")

    send()
    count = next(sent)
    print(f"generated requests: {count}; statuses: {dict(sorted(statuses.items()))}")
    assert count >= 500
    assert not failures, "\n".join(failures[:10])
    assert statuses.get(200, 0) + statuses.get(201, 0) > 20, statuses  # the generator reached real objects
