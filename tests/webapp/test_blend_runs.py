"""Blended runs in the web app: a run made through the API trains on other datasets beside its own, each by its
weight and under a name, and each source's validation loss is a series of its own, charted on the run page."""
from webapp import models, services

from tests.webapp.live_runs import append_metrics, eval_record, new_run, step_record


def _create(client, plan, dataset, **extra):
    return client.post("/api/runs/", {"name": "r", "plan": plan.id, "dataset": dataset.id, "steps": 10, **extra},
                       format="json")


def _web(owner, data_root, name="web crawl, 2024", **fields):
    (data_root / "web.txt").write_text("Some other text, from the web, for the blend.\n" * 50)
    return models.Dataset.objects.create(owner=owner, name=name, path=str(data_root / "web.txt"), **fields)


def test_a_run_made_through_the_api_trains_on_its_blend_with_each_source_weighted_and_named(
        alice, api, plan222, corpus, data_root):
    web = _web(alice, data_root)
    made = _create(api(alice), plan222, corpus, dataset_weight=3, blend=[{"dataset": web.pk}])
    assert made.status_code == 201, made.data
    assert made.data["blend"] == [{"dataset": web.pk, "weight": 1.0, "name": "web-crawl-2024"}]
    spec = made.data["spec"]
    assert spec["dataset_weight"] == 3 and len(spec["blend"]) == 1
    assert spec["blend"][0]["name"] == "web-crawl-2024" and spec["blend"][0]["dataset"]["path"] == web.path
    named = _create(api(alice), plan222, corpus, blend=[{"dataset": web.pk, "name": "web", "weight": 0.5}])
    assert named.status_code == 201 and named.data["spec"]["blend"][0] | {"dataset": None} == \
        {"name": "web", "weight": 0.5, "dataset": None}


def test_it_refuses_a_blend_it_cannot_train_on_and_says_what_to_change(alice, bob, api, plan222, corpus, data_root):
    web = _web(alice, data_root)
    theirs = models.Dataset.objects.create(owner=bob, name="theirs", path=web.path)
    client = api(alice)
    twice = _create(client, plan222, corpus, blend=[{"dataset": web.pk, "name": "a"}, {"dataset": web.pk, "name": "a"}])
    assert twice.status_code == 400 and "a name of its own" in str(twice.data["blend"])
    main = _create(client, plan222, corpus, blend=[{"dataset": web.pk, "name": "main"}])
    assert main.status_code == 400 and "'main'" in str(main.data["blend"])
    assert _create(client, plan222, corpus, blend=[{"dataset": theirs.pk}]).status_code == 400  # not shared
    assert _create(client, plan222, corpus, blend=[{"dataset": web.pk, "weight": 0}]).status_code == 400
    comma = _create(client, plan222, corpus, blend=[{"dataset": web.pk, "name": "a,b"}])
    assert comma.status_code == 400 and "name" in str(comma.data["blend"])
    assert _create(client, plan222, corpus, dataset_weight=0).status_code == 400


def test_a_blend_source_no_longer_shared_stops_the_run_being_queued(alice, bob, plan222, corpus, data_root):
    theirs = _web(bob, data_root, name="shared", shared=True)
    run = new_run(alice, plan222, corpus, blend=[{"dataset": theirs.pk, "weight": 1.0, "name": "shared"}])
    models.Dataset.objects.filter(pk=theirs.pk).update(shared=False)
    problems = services.run_access_problems(models.Run.objects.get(pk=run.pk))
    assert "not shared with alice" in problems["blend"][0]


def test_each_sources_validation_loss_is_a_series_of_its_own_on_every_x_axis(alice, api, client, plan222, corpus,
                                                                             data_root):
    web = _web(alice, data_root)
    run = new_run(alice, plan222, corpus, eval_every=5, blend=[{"dataset": web.pk, "weight": 1.0, "name": "web"}])
    append_metrics(run, [step_record(s, 5.0 - s / 10) for s in range(1, 21)] +
                   [eval_record(s, 4.0 - s / 10, {"main": 4.2 - s / 10, "web": 3.4 - s / 10}) for s in (5, 10, 15)])
    assert models.SourceValLoss.objects.filter(run=run).count() == 6
    rest = api(alice)
    answer = rest.get(f"/api/runs/{run.pk}/series/", {"names": "val_loss,val_loss:main,val_loss:web"}).json()
    series = answer["series"]
    assert series["val_loss:web"]["points"] == [[5, 2.9], [10, 2.4], [15, 1.9]]
    assert [v for _, v in series["val_loss:main"]["points"]] == [3.7, 3.2, 2.7]
    assert [x for x, _ in series["val_loss"]["points"]] == [5, 10, 15]
    by_tokens = rest.get(f"/api/runs/{run.pk}/series/", {"names": "val_loss,val_loss:web", "x": "tokens"}).json()
    assert [x for x, _ in by_tokens["series"]["val_loss:web"]["points"]] == \
        [x for x, _ in by_tokens["series"]["val_loss"]["points"]]
    zoomed = rest.get(f"/api/runs/{run.pk}/series/", {"names": "val_loss:web", "start": 8, "end": 20}).json()
    assert zoomed["series"]["val_loss:web"]["points"] == [[10, 2.4], [15, 1.9]]
    # a source the run does not have is an empty series; a name that is no series is refused
    assert rest.get(f"/api/runs/{run.pk}/series/", {"names": "val_loss:books"}).json()["series"][
        "val_loss:books"]["points"] == []
    refused = rest.get(f"/api/runs/{run.pk}/series/", {"names": "val_loss:web,perplexity"})
    assert refused.status_code == 400 and "perplexity" in str(refused.json())

    client.force_login(alice)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-names="val_loss:main,val_loss:web"' in page and "Validation loss by source" in page
