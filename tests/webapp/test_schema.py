"""The OpenAPI schema is valid OpenAPI 3 and documents every error answer, the Swagger page renders offline, and
generated requests get only documented status codes, never a server error (a model server that cannot answer is
the documented 502 or 503 with a message, which is not one)."""
from collections import Counter
from typing import get_args

import pytest
import schemathesis
from django.core import signals
from django.core.cache import cache
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, given, settings, strategies as st
from openapi_spec_validator import validate

from trainer.contract import presets
from trainer.contract.schedules import Schedule
from webapp import models
from webapp.selectors import run_updates
from webapp.services.series import series_write


def test_it_serves_a_valid_openapi_3_schema(db, client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    validate(schema)
    assert schema["openapi"].startswith("3.")
    assert {"/api/runs/", "/api/plans/", "/api/runs/{id}/cancel/"} <= set(schema["paths"])
    plan_spec = schema["components"]["schemas"]["ParallelismPlanRequest"]["properties"]["spec"]
    assert plan_spec["properties"]["pipeline_schedule"]["enum"] == list(get_args(Schedule))


def test_it_serves_the_swagger_page_with_local_assets(db, client):
    page = client.get("/api/docs/")
    assert page.status_code == 200 and b"swagger-ui" in page.content
    assert b"cdn.jsdelivr" not in page.content and b"unpkg" not in page.content


def test_it_documents_each_operations_error_answers_with_their_bodies(db, client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert schema["components"]["schemas"]["Error"]["required"] == ["detail"]
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            assert {"400", "401", "403", "404"} <= codes, (method, path)
            if method in ("post", "put", "patch", "delete"):
                assert "409" in codes, (method, path)
            if "requestBody" in operation:
                assert {"413", "415"} <= codes, (method, path)
    bad_request = schema["paths"]["/api/runs/"]["post"]["responses"]["400"]
    assert bad_request["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/ValidationError"
    token = schema["paths"]["/api/token/"]["post"]
    assert not any(token.get("security", [])) and "429" in token["responses"]  # needs no credentials
    assert set(token["requestBody"]["content"]) == {"application/json"}
    upload = schema["paths"]["/api/datasets/upload/"]["post"]
    assert set(upload["requestBody"]["content"]) == {"multipart/form-data"}


# Generated requests: every operation of the schema, as an ordinary user and as staff, against a database holding
# objects for the generated ids to hit. First the fuzzing phase (schema-valid and schema-violating data), then the
# stateful phase (sequences of calls linked by the ids one answer gives the next request). Every answer must be
# documented by the schema and none may be a server error.
FUZZED_REQUESTS = 1500
STATEFUL_SCENARIOS, STATEFUL_STEPS = 60, 10
CHECKS = [schemathesis.checks.not_a_server_error, schemathesis.checks.status_code_conformance]
# Triton unreachable (the populated server's URL points where nothing listens), or failing: documented, with why.
MODEL_SERVER_ANSWERS = {502, 503}


@pytest.fixture
def populated(alice, bob, staff, cluster8, data_root, plan222, corpus, nowhere, small_checkpoint, monkeypatch):
    models.ModelConfig.objects.create(owner=bob, name="tiny", spec=presets.MODELS["tiny"].to_dict(), shared=True)
    run = models.Run.objects.create(owner=alice, name="r", model_config=plan222.model_config, plan=plan222,
                                    cluster=cluster8, dataset=corpus)
    models.Metric.objects.create(run=run, step=1, loss=3.0, values={"loss": 3.0})
    series_write(run, [{"step": s, "loss": 3.0 - s / 100, "tokens_seen": 64 * s, "time": 1e9 + s}
                       for s in range(1, 50)])
    # A long poll with cursors at the newest waits out its time: in this test, a tenth of a second
    monkeypatch.setattr(run_updates, "MAX_WAIT_S", 0.1)
    models.Checkpoint.objects.create(run=run, step=1, path=str(data_root / "ckpt"))
    models.Profile.objects.create(run=run, name="p", path=str(data_root / "prof"))
    models.TuneJob.objects.create(owner=alice, request={"model": "tiny"}, dataset=corpus)
    # serving: a ready deployment on a server nothing listens at (generation and status answer 503 at once)
    template = models.PromptTemplate.objects.create(owner=alice, name="chat")
    models.Deployment.objects.create(owner=alice, checkpoint=small_checkpoint, server=nowhere, model_name="small",
                                     status="ready", prompt_template=template)
    return {"user": alice, "staff": staff}


@pytest.fixture
def keep_test_connection():
    """Calls through the WSGI app fire Django's request signals, whose handler would close the connection holding
    the test's transaction; Django's own test client disconnects it the same way."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


class Tally:
    """What the generated requests got: how many, each status code's count, and the failed checks."""

    def __init__(self):
        self.sent, self.statuses, self.failures = 0, Counter(), []

    def check(self, case, response, as_whom: str) -> None:
        self.sent += 1
        self.statuses[response.status_code] += 1
        checks = CHECKS
        if response.status_code in MODEL_SERVER_ANSWERS and '"detail"' in response.text:
            checks = [schemathesis.checks.status_code_conformance]
        try:
            case.validate_response(response, checks=checks)
        except AssertionError as exc:  # schemathesis' failures are AssertionErrors, grouped
            self.failures.append(f"{as_whom}: {case.method} {case.formatted_path} {case.body!r:.300} -> "
                                 f"{response.status_code}: {response.text[:300]}\n{str(exc)[:500]}")


@pytest.mark.slow
def test_it_answers_2000_generated_requests_with_documented_codes_and_no_server_error(populated,
                                                                                      keep_test_connection):
    schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application(),
                                            headers={"Accept": "application/vnd.oai.openapi+json"})
    tokens = {role: {"Authorization": f"Token {user.auth_token.key}"} for role, user in populated.items()}
    tally = Tally()

    positive = schema.as_strategy()
    negative = schema.as_strategy(generation_mode=schemathesis.GenerationMode.NEGATIVE)

    @settings(max_examples=FUZZED_REQUESTS, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(positive, positive, negative), role=st.sampled_from(sorted(tokens)))
    def fuzz(case, role):
        tally.check(case, case.call(headers=tokens[role]), role)

    fuzz()
    fuzzed = tally.sent

    for role, headers in sorted(tokens.items()):
        class Workflow(schema.as_state_machine()):
            """Each scenario starts from the same database and no sign-in attempts: Hypothesis replays scenarios
            and needs the same answers to the same calls."""

            def setup(self):
                cache.clear()
                self.savepoint = transaction.savepoint()

            def teardown(self):
                transaction.savepoint_rollback(self.savepoint)

            def get_call_kwargs(self, case):
                return {"headers": headers}

            def validate_response(self, response, case, **kwargs):
                tally.check(case, response, f"{role}, stateful")

        Workflow.run(settings=settings(max_examples=STATEFUL_SCENARIOS // 2, stateful_step_count=STATEFUL_STEPS,
                                       deadline=None, database=None, derandomize=True,
                                       suppress_health_check=list(HealthCheck)))

    print(f"generated requests: {tally.sent} ({fuzzed} fuzzed, {tally.sent - fuzzed} stateful); "
          f"statuses: {dict(sorted(tally.statuses.items()))}")
    assert not tally.failures, f"{len(tally.failures)} failed:\n" + "\n".join(tally.failures[:10])
    assert tally.sent >= 2000 and tally.sent - fuzzed >= 300
    assert tally.statuses[200] + tally.statuses[201] > 100, tally.statuses  # the generator reached real objects
