"""The dashboard: who sees which runs, the filters, progress and time to go, and loss sparklines read from the
rollups in a fixed number of queries."""
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.webapp.live_runs import append_metrics, new_run, step_record
from trainer.contract import ParallelPlan, presets
from webapp import models
from webapp.selectors.runs import SPARK_POINTS, dashboard_rows
from webapp.services.demo import DEMO_DATASET, LOCAL_CLUSTER, demo_ready

pytestmark = pytest.mark.django_db


@pytest.fixture
def parts(alice, settings, tmp_path):
    settings.WORKBENCH = {**settings.WORKBENCH, "RUNS_ROOT": tmp_path / "runs"}
    cluster, dataset = demo_ready(alice)
    model = models.ModelConfig.objects.create(owner=alice, name="tiny", spec=presets.MODELS["tiny"].to_dict())
    plan = models.ParallelismPlan.objects.create(owner=alice, name="dp2", model_config=model, cluster=cluster,
                                                 spec=ParallelPlan(dp=2, micro_batch=2, global_batch=4).to_dict())
    return plan, dataset


def page(client, user, **query):
    client.force_login(user)
    return client.get("/", query)


def test_it_sends_a_visitor_who_is_not_signed_in_to_the_sign_in_page(client):
    answer = client.get("/")
    assert answer.status_code == 302 and answer["Location"] == "/login/?next=/"


def test_it_makes_the_local_cluster_once_and_a_demo_dataset_for_each_user(client, alice, bob):
    page(client, alice)
    page(client, bob)
    page(client, alice)
    assert models.Cluster.objects.filter(name=LOCAL_CLUSTER).count() == 1
    assert sorted(models.Dataset.objects.filter(name=DEMO_DATASET).values_list("owner__username", flat=True)) == [
        "alice", "bob"]
    assert "Your first run" in page(client, alice).content.decode()


def test_it_lists_only_the_runs_the_user_may_see(client, alice, bob, parts):
    plan, dataset = parts
    new_run(alice, plan, dataset, name="private-one")
    shared = new_run(alice, plan, dataset, name="shared-one")
    models.Run.objects.filter(pk=shared.pk).update(shared=True)
    text = page(client, bob).content.decode()
    assert "shared-one" in text and "private-one" not in text
    assert "private-one" in page(client, alice).content.decode()


def test_it_filters_by_status_owner_and_search_and_sorts_by_name(client, alice, parts):
    plan, dataset = parts
    for name in ("beta", "alpha", "gamma"):
        new_run(alice, plan, dataset, name=name)
    models.Run.objects.filter(name="gamma").update(status=models.RunStatus.FAILED)
    text = page(client, alice, status="failed").content.decode()
    assert "gamma" in text and "alpha" not in text
    assert "gamma" not in page(client, alice, q="alp").content.decode()
    text = page(client, alice, sort="name", owner="me").content.decode()
    assert text.index(">alpha<") < text.index(">beta<") < text.index(">gamma<")


def test_it_answers_htmx_with_the_table_alone(client, alice, parts):
    client.force_login(alice)
    answer = client.get("/", HTTP_HX_REQUEST="true")
    assert b"<table" in answer.content or b"Your first run" in answer.content
    assert b"<html" not in answer.content


def test_it_shows_progress_and_the_time_to_go_at_the_pace_so_far(alice, parts):
    plan, dataset = parts
    run = new_run(alice, plan, dataset, name="half", steps=200)
    models.Run.objects.filter(pk=run.pk).update(status=models.RunStatus.RUNNING, last_step=50,
                                                started_at=timezone.now() - timedelta(minutes=10))
    row, = dashboard_rows([models.Run.objects.get(pk=run.pk)])
    assert row.percent == 25
    assert timedelta(minutes=29) < row.eta <= timedelta(minutes=30, seconds=1)  # 150 steps at 12 s a step


def test_it_draws_short_runs_from_their_steps_and_long_ones_from_rollups_in_three_queries(alice, parts):
    plan, dataset = parts
    short, long = new_run(alice, plan, dataset, name="short"), new_run(alice, plan, dataset, name="long", steps=5000)
    append_metrics(short, [step_record(s, 5.0 - s / 10) for s in range(1, 21)])
    append_metrics(long, [step_record(s, 5.0 - s / 1000) for s in range(1, 4001)])
    runs = list(models.Run.objects.filter(pk__in=[short.pk, long.pk]).order_by("pk"))
    with CaptureQueriesContext(connection) as queries:
        rows = dashboard_rows(runs)
    assert len(queries) == 2  # the short runs' steps, the long runs' blocks (the runs are given)
    short_points, long_points = (len(row.spark.split()) for row in rows)
    assert short_points == 20
    assert SPARK_POINTS / 4 < long_points <= SPARK_POINTS  # 4,000 steps at 256-step blocks: 16 points
    # falling loss draws a falling line: y grows downwards in SVG
    ys = [float(p.split(",")[1]) for p in rows[1].spark.split()]
    assert ys[0] < ys[-1]
