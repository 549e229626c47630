"""The run page: who sees it, its parts rendered from really ingested data, cancel and resume, the profile's trace
download (only inside the run's folder), and the planner's estimate beside what the run measured."""
import os
import re
from pathlib import Path

import pytest

from tests.webapp import serving
from tests.webapp.live_runs import (append_metrics, eval_record, new_run, queued_tasks, step_record, trace_file,
                                    write_profile)
from trainer.contract import presets
from trainer.planner.estimate.api import estimate_json
from webapp import models
from webapp.services.ingest import run_ingest

pytestmark = pytest.mark.django_db


def _running(run):
    for status in ("queued", "submitted", "running"):
        run.transition(status)
    run.save()
    return run


@pytest.fixture
def trained(alice, plan222, corpus):
    """Alice's running run of 60 steps (each rank's figures in every record, rank 7 the fullest) and two
    evaluations, read in by the real ingestion, with a profile of two ranks digested by the trainer's own digest."""
    run = _running(new_run(alice, plan222, corpus, name="trained", steps=100))
    ranks = {"step_time_s": [0.5] * 8, "tokens_per_s": [2048.0] * 8, "max_allocated_bytes": [2**30] * 7 + [2**31]}
    append_metrics(run, [step_record(s, 4.0 - s / 100, ranks=ranks) for s in range(1, 61)]
                   + [eval_record(30, 3.8), eval_record(60, 3.5)])
    write_profile(run)
    return run_ingest(run.pk)


def _page(client, user, path):
    client.force_login(user)
    return client.get(path)


def test_it_renders_every_part_for_the_owner_from_ingested_data(client, alice, trained):
    answer = _page(client, alice, f"/runs/{trained.pk}/")
    assert answer.status_code == 200
    html = answer.content.decode()
    assert 'data-testid="run-status"' in html and ">running</span>" in html
    assert "trained" in html and "gpt2-small" in html and "2x2x2" in html and "a100x8" in html and "corpus" in html
    assert '<span data-testid="run-step">60</span> of 100' in html
    for chart in ("loss", "lr", "tokens_per_s", "mfu", "memory"):
        assert f'data-testid="chart-{chart}"' in html
    assert 'data-names="loss,val_loss"' in html
    assert 'data-last-step="60"' in html and 'data-finished="0"' in html
    assert '<option value="rank-7.log">' in html  # a rank of the eight to pick before any log is written
    assert 'data-testid="profile-digest"' in html and "c10d::allreduce_" in html and "aten::mm" in html
    profile = trained.profiles.get()
    assert f"/runs/{trained.pk}/profiles/{profile.pk}/trace/1/" in html
    assert "60.0%" in html and "80.0%" in html  # rank 0's and rank 1's compute shares
    assert "profile_written" in html  # the events table


def test_it_shows_checkpoints_with_a_link_to_deploy_them(client, alice, trained):
    checkpoint = models.Checkpoint.objects.create(run=trained, step=50, path=str(Path(trained.run_dir) / "ck"),
                                                  tokens_seen=51_200, size_bytes=3 * 2**30)
    html = _page(client, alice, f"/runs/{trained.pk}/").content.decode()
    assert f'href="/deploy/?checkpoint={checkpoint.pk}"' in html
    assert "51,200" in html and "3.00 GiB" in html


def test_it_sets_the_estimate_beside_what_the_run_measured_with_the_error(client, alice, trained):
    spec = trained.spec
    estimate = estimate_json({"model": spec["model"], "plan": spec["plan"], "cluster": spec["cluster"]})
    step = estimate["time"]["step"]["value"]
    html = _page(client, alice, f"/runs/{trained.pk}/").content.decode()
    assert 'data-testid="estimate-vs-measured"' in html and 'data-testid="estimate-error"' in html
    assert f"{100 * (0.5 - step) / step:+.1f}%" in html  # every step took 0.5 s
    assert f"{100 * (0.4 - estimate['time']['mfu']['value']) / estimate['time']['mfu']['value']:+.1f}%" in html
    assert "1.00 GiB" in html  # rank 0's peak, from the memory series
    assert "2.00 GiB" in html and "rank 7, median over the latest steps" in html  # the fullest rank
    # the profile's bubble: the mean of rank 0's 40% and rank 1's 20% not computing
    assert "30.0%" in html
    # the same rows as GET /api/runs/<id>/estimate/: the records hold no model states' bytes, and say so
    assert "Model states, rank 0" in html and "no step record holds the model states" in html
    assert "Pipeline bubble (idle share of a step)" in html and "Exposed communication (share of a step)" in html


def test_it_says_which_figures_are_not_measured(client, alice, plan222, corpus):
    run = new_run(alice, plan222, corpus, name="fresh")
    html = _page(client, alice, f"/runs/{run.pk}/").content.decode()
    assert html.count("not measured</td>") == 10 and "no training step recorded yet" in html
    assert "no profile taken" in html and 'data-testid="estimate-error"' not in html


def test_it_answers_a_run_another_user_may_not_see_as_missing(client, bob, trained):
    assert _page(client, bob, f"/runs/{trained.pk}/").status_code == 404
    assert client.get(f"/runs/{trained.pk}/part/header/").status_code == 404
    assert client.get("/runs/999999/").status_code == 404
    trained.shared = True
    trained.save()
    html = client.get(f"/runs/{trained.pk}/").content.decode()
    assert "Cancel run" not in html  # a shared run is read-only to others


def test_it_sends_a_visitor_who_is_not_signed_in_to_the_sign_in_page(client, trained):
    for path in (f"/runs/{trained.pk}/", f"/runs/{trained.pk}/part/history/"):
        answer = client.get(path)
        assert answer.status_code == 302 and answer["Location"] == f"/login/?next={path}"
    assert client.post(f"/runs/{trained.pk}/cancel/").status_code == 302
    trained.refresh_from_db()
    assert trained.status == "running"


def test_it_serves_each_part_on_its_own_for_htmx(client, alice, trained):
    client.force_login(alice)
    header = client.get(f"/runs/{trained.pk}/part/header/").content.decode()
    assert 'data-testid="run-status"' in header and "<html" not in header
    assert 'hx-trigger="wb:changed from:body"' in header
    assert "profile_written" in client.get(f"/runs/{trained.pk}/part/history/").content.decode()
    assert 'data-testid="estimate-error"' in client.get(f"/runs/{trained.pk}/part/measure/").content.decode()
    assert client.get(f"/runs/{trained.pk}/part/anything/").status_code == 404


def test_cancel_stops_a_running_run_and_says_so(client, alice, trained, quiet_broker,
                                               django_capture_on_commit_callbacks):
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(f"/runs/{trained.pk}/cancel/", follow=True)
    assert answer.redirect_chain == [(f"/runs/{trained.pk}/", 302)]
    trained.refresh_from_db()
    assert trained.status == "cancelled"
    assert queued_tasks(quiet_broker) == ["workbench.runs.stop"]
    html = answer.content.decode()
    assert "Run trained is cancelled." in html and "Cancel run" not in html
    again = client.post(f"/runs/{trained.pk}/cancel/", follow=True).content.decode()
    assert f"run {trained.pk} is already cancelled" in again
    assert client.get(f"/runs/{trained.pk}/cancel/").status_code == 405


def test_only_the_owner_may_cancel(client, bob, trained):
    client.force_login(bob)
    assert client.post(f"/runs/{trained.pk}/cancel/").status_code == 404
    trained.shared = True
    trained.save()
    assert client.post(f"/runs/{trained.pk}/cancel/").status_code == 403
    trained.refresh_from_db()
    assert trained.status == "running"


def test_launch_and_retry_queue_the_run(client, alice, plan222, corpus, quiet_broker,
                                        django_capture_on_commit_callbacks):
    client.force_login(alice)
    draft = new_run(alice, plan222, corpus, name="draft")
    assert ">Launch</button>" in client.get(f"/runs/{draft.pk}/").content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(f"/runs/{draft.pk}/queue/", follow=True)
    draft.refresh_from_db()
    assert draft.status == "queued" and "queued for launch" in answer.content.decode()

    failed = new_run(alice, plan222, corpus, name="failed", max_restarts=1)
    failed.transition("queued")
    failed.transition("failed")
    failed.save()
    assert "Retry from the newest checkpoint" in client.get(f"/runs/{failed.pk}/").content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(f"/runs/{failed.pk}/queue/", follow=True)
    failed.refresh_from_db()
    assert (failed.status, failed.restarts) == ("queued", 1)
    assert "to resume from its newest checkpoint" in answer.content.decode()
    assert queued_tasks(quiet_broker) == ["workbench.runs.launch", "workbench.runs.launch"]

    failed.transition("failed")
    failed.save()
    html = client.get(f"/runs/{failed.pk}/").content.decode()
    assert "all 1 restarts are used" in html
    refused = client.post(f"/runs/{failed.pk}/queue/", follow=True).content.decode()
    assert f"run {failed.pk} has used all 1 restarts" in refused
    failed.refresh_from_db()
    assert failed.status == "failed"


def test_the_trace_downloads_for_a_run_you_may_see_and_nothing_outside_its_folder(client, alice, bob, trained,
                                                                                   tmp_path):
    profile = trained.profiles.get()
    url = f"/runs/{trained.pk}/profiles/{profile.pk}/trace/0/"
    client.force_login(alice)
    answer = client.get(url)
    assert answer.status_code == 200
    assert answer["Content-Disposition"] == f'attachment; filename="run-{trained.pk}-steps-10-rank-0.trace.json.gz"'
    assert b"".join(answer.streaming_content) == (Path(profile.path) / "rank-0.trace.json.gz").read_bytes()
    assert client.get(f"/runs/{trained.pk}/profiles/{profile.pk}/trace/5/").status_code == 404

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    trace_file(elsewhere / "rank-0.trace.json.gz", 1, 1)
    (Path(profile.path) / "rank-2.trace.json.gz").symlink_to(elsewhere / "rank-0.trace.json.gz")
    assert client.get(f"/runs/{trained.pk}/profiles/{profile.pk}/trace/2/").status_code == 404
    profile.path = str(Path(trained.run_dir) / ".." / "elsewhere")
    os.symlink(elsewhere, Path(trained.run_dir).parent / "elsewhere")
    profile.save()
    assert client.get(url).status_code == 404
    profile.path = str(elsewhere)
    profile.save()
    assert client.get(url).status_code == 404

    client.force_login(bob)
    assert client.get(url).status_code == 404


def test_a_run_on_cpus_says_its_memory_is_not_measured(client, alice, corpus):
    from trainer.contract import ParallelPlan
    cluster = models.Cluster.objects.create(name="cpus", spec=presets.cluster("cpu", 1, 2).to_dict())
    model = models.ModelConfig.objects.create(owner=alice, name="tiny", spec=presets.MODELS["tiny"].to_dict())
    plan = models.ParallelismPlan.objects.create(owner=alice, name="dp2", model_config=model, cluster=cluster,
                                                 spec=ParallelPlan(dp=2, micro_batch=2, global_batch=4).to_dict())
    run = new_run(alice, plan, corpus)
    append_metrics(run, [step_record(s, 3.0, memory={}) for s in range(1, 11)])
    html = _page(client, alice, f"/runs/{run.pk}/").content.decode()
    assert "the device reports no memory" in html and 'data-testid="estimate-error"' in html


def test_a_cancelled_run_resumes_once_its_job_has_ended(client, alice, trained, quiet_broker,
                                                        django_capture_on_commit_callbacks):
    client.force_login(alice)
    models.Run.objects.filter(pk=trained.pk).update(status="cancelled", job_id="77",
                                                    ingest_state={"job_ended": False})
    html = client.get(f"/runs/{trained.pk}/").content.decode()
    assert "Resume from the newest checkpoint" in html and "its job is still stopping" in html
    models.Run.objects.filter(pk=trained.pk).update(ingest_state={"job_ended": True})
    assert "still stopping" not in client.get(f"/runs/{trained.pk}/").content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/runs/{trained.pk}/queue/")
    trained.refresh_from_db()
    assert trained.status == "queued" and trained.restarts == 0
    assert queued_tasks(quiet_broker) == ["workbench.runs.launch"]


def test_each_checkpoint_shows_its_scores_directly_and_through_its_deployments_beside_the_loss(
        client, alice, trained, data_root, nowhere):
    early = models.Checkpoint.objects.create(run=trained, step=30, path=str(data_root / "step-30"))
    late = models.Checkpoint.objects.create(run=trained, step=60, path=str(data_root / "step-60"))
    halves = models.EvaluationSet.objects.create(owner=alice, name="halves", kind="choice",
                                                 path=str(data_root / "corpus.txt"))
    prose = models.EvaluationSet.objects.create(owner=alice, name="prose", kind="text",
                                                path=str(data_root / "corpus.txt"))
    for checkpoint, acc in ((early, 0.5), (late, 0.75)):
        models.Evaluation.objects.create(owner=alice, eval_set=halves, checkpoint=checkpoint, status="done",
                                         report={"kind": "choice", "items": 4,
                                                 "metrics": {"acc": acc, "acc_stderr": 0.1, "acc_generated": 0.25}})
    int8 = serving.deployment(alice, late, nowhere, "late-int8", reduction="int8")
    models.Evaluation.objects.create(owner=alice, eval_set=halves, checkpoint=late, deployment=int8, status="done",
                                     report={"kind": "choice", "items": 4, "metrics": {"acc_generated": 0.5}})
    models.Evaluation.objects.create(owner=alice, eval_set=prose, checkpoint=late, status="done",
                                     report={"kind": "text", "items": 9, "metrics": {"byte_perplexity": 2.5}})
    models.Evaluation.objects.create(owner=alice, eval_set=prose, checkpoint=early, status="failed",
                                     message="no such file")
    html = _page(client, alice, f"/runs/{trained.pk}/").content.decode()
    # the checkpoint itself first, then its int8 deployment's score through /v1, compared by acc_generated
    assert ('data-testid="checkpoint-scores-60">halves: acc 0.750, acc_generated 0.250<br>'
            'halves via late-int8 (int8 weight-only): acc_generated 0.500<br>prose: byte_perplexity 2.500</td>') in html
    assert ('data-testid="checkpoint-scores-30">halves: acc 0.500, acc_generated 0.250<br>'
            'prose: failed, no such file</td>') in html
    assert 'hx-trigger="wb:events from:body"' in html  # nothing left to finish: the table does not poll
    # beside the loss, each set's headline score by checkpoint, labelled with the set's name
    charts = re.findall(r'data-testid="chart-(\w+)" data-names="([^"]*)"', html)
    assert charts[:2] == [("loss", "loss,val_loss"), ("scores", f"eval:{halves.pk},eval:{prose.pk}")]
    assert html.count(f'data-labels="{{&quot;eval:{halves.pk}&quot;: &quot;halves (acc)&quot;') == 1
    api = client.get(f"/api/runs/{trained.pk}/series/", {"names": f"eval:{halves.pk},eval:{prose.pk}"}).json()
    assert api["series"][f"eval:{halves.pk}"]["points"] == [[30, 0.5], [60, 0.75]]  # the deployment's not among them
    assert api["series"][f"eval:{prose.pk}"]["points"] == [[60, 2.5]]
    assert client.get(f"/api/runs/{trained.pk}/series/", {"names": "eval:x"}).status_code == 400


def test_the_page_queues_an_evaluation_of_a_checkpoint_and_follows_it(client, alice, bob, trained, data_root,
                                                                      quiet_broker,
                                                                      django_capture_on_commit_callbacks):
    step = data_root / "checkpoints" / "step-60"
    serving.checkpoint_folder(step)
    checkpoint = models.Checkpoint.objects.create(run=trained, step=60, path=str(step))
    halves = models.EvaluationSet.objects.create(owner=alice, name="halves", kind="choice",
                                                 path=str(data_root / "corpus.txt"))
    theirs = models.EvaluationSet.objects.create(owner=bob, name="theirs", kind="choice",
                                                 path=str(data_root / "corpus.txt"))
    html = _page(client, alice, f"/runs/{trained.pk}/").content.decode()
    assert f'<option value="{halves.pk}">halves (choice)</option>' in html and "theirs" not in html
    refused = client.post(f"/runs/{trained.pk}/evaluate/", {"eval_set": theirs.pk, "checkpoint": checkpoint.pk},
                          follow=True)
    assert "Choose an evaluation set" in refused.content.decode() and not models.Evaluation.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        done = client.post(f"/runs/{trained.pk}/evaluate/", {"eval_set": halves.pk, "checkpoint": checkpoint.pk},
                           follow=True)
    assert "Step 60 is queued for evaluation on halves" in done.content.decode()
    assert queued_tasks(quiet_broker) == ["workbench.evaluations.run"]
    html = done.content.decode()
    assert 'data-testid="checkpoint-scores-60">halves: pending</td>' in html
    assert 'hx-trigger="wb:events from:body, every 3s"' in html  # until it is done
