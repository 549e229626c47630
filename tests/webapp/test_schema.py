"""The OpenAPI schema is valid OpenAPI 3 and documents every error answer, the Swagger page renders offline, and
generated requests pass every schemathesis check: the server does what its schema says, never a server error (a model
server that cannot answer is the documented 502 or 503 with a message, which is not one)."""
import os
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
from schemathesis.core.failures import FailureGroup, ServerError
from schemathesis.openapi.checks import RejectedPositiveData

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
# stateful phase (sequences of calls linked by the ids one answer gives the next request). Every one of schemathesis'
# checks judges each answer: no server error; only documented status codes, content types, headers and bodies;
# schema-violating data refused and schema-valid data accepted; credentials enforced (each request is sent again
# without them); methods the schema lists none for refused; and, statefully, a deleted object stays gone and a created
# one can be fetched. (max_response_time is off, as it is unless given a limit: timings are not this test's subject.)
# The suite sends about a thousand; a larger run takes its sizes from the environment (SCHEMA_FUZZ_REQUESTS=6000
# SCHEMA_FUZZ_SCENARIOS=200: about 8,000 requests, three minutes here).
FUZZED_REQUESTS = int(os.environ.get("SCHEMA_FUZZ_REQUESTS", 750))
STATEFUL_SCENARIOS, STATEFUL_STEPS = int(os.environ.get("SCHEMA_FUZZ_SCENARIOS", 30)), 10
# Triton unreachable (the populated server's URL points where nothing listens), or failing: documented, with why.
MODEL_SERVER_ANSWERS = {502, 503}
# Operations whose schema-valid requests may still be refused (400), each for a rule JSON Schema cannot state: a
# generated client learns these from the 400's message, which names the field and what to change.
RULES_BEYOND_THE_SCHEMA = {
    # a spec's fields constrain one another (heads divide the width, the batch divides into micro-batches × dp, a
    # plan fits its model and cluster, a positive count), or one of two fields must be given (a spec or a preset)
    **dict.fromkeys(["/api/model-configs/", "/api/model-configs/{id}/", "/api/plans/", "/api/plans/{id}/",
                     "/api/clusters/", "/api/clusters/{id}/", "/api/estimate/", "/api/tune/",
                     "/api/planner/advice/", "/api/runs/", "/api/runs/{id}/"], "a spec's rules"),
    # an id in the body names an object that must exist and be visible to the requester
    **dict.fromkeys(["/api/evaluations/", "/api/evaluation-sets/", "/api/evaluation-sets/{id}/",
                     "/api/datasets/{id}/prepare/", "/api/deployments/", "/api/deployments/{id}/",
                     "/api/conversions/"], "an object named by its id"),
    # a path on the server, which must exist under the requester's data roots (or the models directory), or a
    # checkpoint's folder, which must still hold it
    **dict.fromkeys(["/api/checkpoints/register/", "/api/checkpoints/import-hf/",
                     "/api/checkpoints/{id}/export-hf/", "/api/triton-servers/",
                     "/api/triton-servers/{id}/", "/api/datasets/", "/api/datasets/{id}/", "/api/datasets/upload/"],
                    "a folder on the server"),
    # the compared window's end must not lie before its start
    "/api/runs/compare/": "a window's bounds",
    # a prompt template's text holds its placeholders ({role} and {content} once each, {examples} and {input})
    **dict.fromkeys(["/api/prompt-templates/", "/api/prompt-templates/{id}/"], "a template's placeholders"),
    # sign-in: a well-formed username and password that are not a user's
    "/api/token/": "credentials",
}


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
    """What the generated requests got: how many, to how many operations, each status code's count, and the failed
    checks."""

    def __init__(self):
        self.sent, self.operations, self.statuses, self.failures = 0, set(), Counter(), []

    def check(self, case, response, as_whom: str, **context) -> None:
        """Every check on ``response``; ``context``: the request's headers (so the credentials check knows it sent
        some) and, in the stateful phase, the scenario's recorder and transport."""
        self.sent += 1
        self.operations.add(case.operation.label)
        self.statuses[response.status_code] += 1
        try:
            case.validate_response(response, **context)
        except (AssertionError, FailureGroup) as exc:
            failures = [f for f in getattr(exc, "exceptions", [exc]) if not self.beyond_the_schema(case, response, f)]
            if failures:
                self.failures.append(f"{as_whom}: {case.method} {case.formatted_path} {case.query} "
                                     f"{case.body!r:.300} -> {response.status_code}: {response.text[:300]}\n"
                                     + "\n".join(f"{type(f).__name__}: {str(f)[:300]}" for f in failures))

    @staticmethod
    def beyond_the_schema(case, response, failure) -> bool:
        """A schema-valid request refused for a rule the schema cannot state (RULES_BEYOND_THE_SCHEMA), or a model
        server that cannot answer (its documented 502 or 503 with why, which is not the API's own error)."""
        if isinstance(failure, RejectedPositiveData):
            return response.status_code == 400 and case.operation.path in RULES_BEYOND_THE_SCHEMA
        return (isinstance(failure, ServerError) and response.status_code in MODEL_SERVER_ANSWERS
                and '"detail"' in response.text)


@pytest.mark.slow
def test_it_answers_1000_generated_requests_as_its_schema_says_under_every_check(populated, keep_test_connection):
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
        tally.check(case, case.call(headers=tokens[role]), role, headers=tokens[role])

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

            def validate_response(self, response, case, additional_checks=None, **kwargs):
                tally.check(case, response, f"{role}, stateful", headers=headers, transport_kwargs=kwargs or None,
                            recorder=self.recorder)

        Workflow.run(settings=settings(max_examples=STATEFUL_SCENARIOS // 2, stateful_step_count=STATEFUL_STEPS,
                                       deadline=None, database=None, derandomize=True,
                                       suppress_health_check=list(HealthCheck)))

    print(f"generated requests: {tally.sent} ({fuzzed} fuzzed, {tally.sent - fuzzed} stateful) to "
          f"{len(tally.operations)} operations; "
          f"statuses: {dict(sorted(tally.statuses.items()))}")
    assert not tally.failures, f"{len(tally.failures)} failed:\n" + "\n".join(tally.failures[:10])
    assert tally.sent >= 1000 and tally.sent - fuzzed >= 150
    assert tally.statuses[200] + tally.statuses[201] > 100, tally.statuses  # the generator reached real objects
