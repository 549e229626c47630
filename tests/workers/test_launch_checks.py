"""The worker checks a run's parts once more right before it starts the job: sharing may have been withdrawn, or the
dataset's file re-pointed, since the run was queued. A refused launch starts nothing and says why. An
attempt avoids the nodes earlier ones failed on. A launch is sent again only when none waits in the queue."""
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from webapp import models, services
from workers.launching import WAITING, avoided_nodes, run_launch
from workers.launchers import JobState, JobStates
from workers.runs import launchable_run_ids, reconcile_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def shared_parts(tiny_run_parts):
    """The runner's plan, model config and dataset, all shared; and another user, who uses them."""
    owner, plan, dataset = tiny_run_parts
    models.ModelConfig.objects.filter(pk=plan.model_config_id).update(shared=True)
    models.ParallelismPlan.objects.filter(pk=plan.pk).update(shared=True)
    models.Dataset.objects.filter(pk=dataset.pk).update(shared=True)
    plan.refresh_from_db()
    dataset.refresh_from_db()
    return User.objects.create_user("borrower"), plan, dataset


def _queued(owner, plan, dataset) -> models.Run:
    run = services.run_create(owner=owner, name="r", plan=plan, dataset=dataset, steps=2)
    return services.run_queue(run)  # queued while all is well: the launch task is on its way


def test_it_fails_a_queued_run_at_launch_once_its_plan_is_unshared(shared_parts):
    borrower, plan, dataset = shared_parts
    run = _queued(borrower, plan, dataset)
    models.ParallelismPlan.objects.filter(pk=plan.pk).update(shared=False)
    assert run_launch(run.pk) == "failed"
    run.refresh_from_db()
    assert (run.status, run.job_id, run.attempts) == ("failed", "", 0)  # no job was started
    assert run.status_message == ("could not launch: plan 'one' is not shared with borrower: ask its owner to share "
                                  "it (again), or make a plan of your own")


def test_it_fails_a_queued_run_at_launch_once_its_dataset_is_unshared(shared_parts):
    borrower, plan, dataset = shared_parts
    run = _queued(borrower, plan, dataset)
    models.Dataset.objects.filter(pk=dataset.pk).update(shared=False)
    assert run_launch(run.pk) == "failed"
    assert "dataset 'shakespeare' is not shared with borrower" in models.Run.objects.get(pk=run.pk).status_message


def test_it_fails_a_run_whose_dataset_link_was_repointed_out_of_the_roots_after_it_was_queued(tiny_run_parts,
                                                                                                tmp_path):
    owner, plan, dataset = tiny_run_parts
    link = tmp_path / "data" / "linked.txt"
    link.symlink_to(dataset.path)  # inside the data root: fine
    linked = models.Dataset.objects.create(owner=owner, name="linked", path=str(link))
    linked.full_clean()
    run = _queued(owner, plan, linked)
    secret = tmp_path / "elsewhere.txt"
    secret.write_text("not data\n")
    link.unlink()
    link.symlink_to(secret)
    assert run_launch(run.pk) == "failed"
    message = models.Run.objects.get(pk=run.pk).status_message
    assert message.startswith(f"could not launch: dataset 'linked': {link} is not a file or folder you may use")


def test_it_does_not_restart_a_failed_run_whose_owner_may_no_longer_use_its_parts(shared_parts):
    borrower, plan, dataset = shared_parts
    run = services.run_create(owner=borrower, name="r", plan=plan, dataset=dataset, steps=2)
    models.Run.objects.filter(pk=run.pk).update(status="running", attempts=1, job_id="1:gone",
                                                ingest_state={"job_ended": False})
    models.Dataset.objects.filter(pk=dataset.pk).update(shared=False)
    run.refresh_from_db()
    assert reconcile_run(run, JobState(JobStates.FAILED, 1, "the job exited with code 1")) == "failed"
    run.refresh_from_db()
    assert (run.status, run.restarts, run.ingest_state["job_ended"]) == ("failed", 0, True)
    assert run.status_message == ("attempt 1 ended without finishing: the job exited with code 1; not restarted: "
                                  "dataset 'shakespeare' is not shared with borrower: ask its owner to share it "
                                  "(again), or register a dataset of your own")


def test_a_next_attempt_avoids_the_nodes_that_failed_and_the_stragglers_only_where_staff_asked(settings):
    run = models.Run(ingest_state={"excluded_nodes": ["n3"], "straggler_nodes": ["n1", "n3"]})
    settings.WORKBENCH = {**settings.WORKBENCH, "EXCLUDE_STRAGGLERS": False}
    assert avoided_nodes(run) == ("n3",)
    settings.WORKBENCH = {**settings.WORKBENCH, "EXCLUDE_STRAGGLERS": True}
    assert avoided_nodes(run) == ("n1", "n3")


def test_a_launch_is_sent_again_only_once_none_waits_in_the_queue_or_the_one_sent_is_long_lost(tiny_run_parts):
    owner, plan, dataset = tiny_run_parts
    run = _queued(owner, plan, dataset)
    assert models.Run.objects.get(pk=run.pk).launch_sent_at is not None
    assert launchable_run_ids() == []  # its launch waits in the queue
    long_ago = timezone.now() - timedelta(minutes=10)
    runs = models.Run.objects.filter(pk=run.pk)
    runs.update(queued_at=long_ago, launch_sent_at=long_ago)  # queued and sent long ago: the message was lost
    assert launchable_run_ids() == [run.pk]
    services.launch_send([run.pk])
    assert launchable_run_ids() == []  # however many passes follow while it waits
    # a run waiting for local slots is sent again at the next pass once a worker took the last one, not before
    runs.update(queued_at=timezone.now(), ingest_state={WAITING: True}, launch_sent_at=timezone.now())
    assert launchable_run_ids() == []
    runs.update(launch_sent_at=None)
    assert launchable_run_ids() == [run.pk]
