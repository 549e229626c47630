"""The admin logs in, lists every stored object and validates edits through the contract."""
import pytest
from django.urls import reverse

from trainer.contract import presets
from webapp import models, services

ADMIN_MODELS = ["modelconfig", "parallelismplan", "cluster", "dataset", "run", "metric", "checkpoint", "profile",
                "tritonserver", "deployment", "prompttemplate", "tunejob", "dataroot"]


@pytest.fixture
def admin_client_logged_in(client, django_user_model):
    django_user_model.objects.create_superuser("root", "root@example.org", "correct-horse-battery")
    assert client.login(username="root", password="correct-horse-battery")
    return client


def test_it_logs_in_through_the_login_form(client, django_user_model):
    django_user_model.objects.create_superuser("root", "root@example.org", "correct-horse-battery")
    page = client.post("/admin/login/?next=/admin/", {"username": "root", "password": "correct-horse-battery",
                                                      "next": "/admin/"}, follow=True)
    assert page.status_code == 200 and b"Site administration" in page.content


@pytest.mark.parametrize("model", ADMIN_MODELS)
def test_it_lists_and_offers_to_add_every_model(admin_client_logged_in, plan222, model):
    assert admin_client_logged_in.get(reverse(f"admin:workbench_{model}_changelist")).status_code == 200
    assert admin_client_logged_in.get(reverse(f"admin:workbench_{model}_add")).status_code == 200


def test_it_refuses_an_invalid_plan_in_the_admin_form(admin_client_logged_in, gpt2_small, cluster8):
    owner = models.ModelConfig.objects.get().owner
    form = {"name": "bad", "owner": owner.pk, "model_config": gpt2_small.pk, "cluster": cluster8.pk,
            "spec": '{"dp": 1, "tp": 8, "pp": 1, "micro_batch": 1, "global_batch": 8}'}
    page = admin_client_logged_in.post(reverse("admin:workbench_parallelismplan_add"), form)
    assert page.status_code == 200 and b"tp=8 does not divide n_heads=12" in page.content
    assert not models.ParallelismPlan.objects.exists()
    form["spec"] = '{"dp": 2, "tp": 2, "pp": 2, "micro_batch": 1, "global_batch": 8}'
    page = admin_client_logged_in.post(reverse("admin:workbench_parallelismplan_add"), form)
    assert page.status_code == 302 and models.ParallelismPlan.objects.get().plan_spec().grad_accum == 4


def test_it_lets_a_non_staff_user_nowhere_near_the_admin(client, alice):
    assert client.login(username="alice", password="correct-horse-battery")
    assert client.get("/admin/").status_code == 302


def test_it_keeps_clusters_to_staff_with_the_permission(client, django_user_model, cluster8):
    django_user_model.objects.create_user("helper", password="correct-horse-battery", is_staff=True)
    assert client.login(username="helper", password="correct-horse-battery")
    assert client.get(reverse("admin:workbench_cluster_change", args=[cluster8.pk])).status_code == 403
    spec = presets.cluster().to_dict()
    assert client.post(reverse("admin:workbench_cluster_add"), {"name": "x", "spec": spec}).status_code == 403


INLINE_MANAGEMENT = {"metrics-TOTAL_FORMS": 0, "metrics-INITIAL_FORMS": 0}


def _run(owner, plan, dataset, status=None, **fields):
    run = services.run_create(owner=owner, name="r", plan=plan, dataset=dataset, steps=10)
    for to in status or ():
        run.transition(to)
    models.Run.objects.filter(pk=run.pk).update(status=run.status, **fields)
    return models.Run.objects.get(pk=run.pk)


def test_it_keeps_a_runs_state_and_spec_out_of_reach_of_the_change_form(admin_client_logged_in, alice, plan222,
                                                                        corpus):
    run = _run(alice, plan222, corpus)
    page = admin_client_logged_in.get(reverse("admin:workbench_run_change", args=[run.pk]))
    assert page.status_code == 200 and b"output_dir" in page.content and b'name="status"' not in page.content
    form = {"name": "renamed", "owner": alice.pk, "shared": "on", "max_restarts": 2, "status": "failed",
            "attempts": 7, "job_id": "4242:1", "steps": 1, "plan": plan222.pk, **INLINE_MANAGEMENT}
    page = admin_client_logged_in.post(reverse("admin:workbench_run_change", args=[run.pk]), form)
    assert page.status_code == 302
    after = models.Run.objects.get(pk=run.pk)
    assert after.name == "renamed" and after.shared  # the form was taken, except for what it may not change
    assert (after.status, after.attempts, after.job_id, after.steps, after.spec) == ("draft", 0, "", 10, run.spec)


def test_it_cancels_runs_through_the_service_and_says_which_it_could_not(
        admin_client_logged_in, alice, plan222, corpus, django_capture_on_commit_callbacks):
    running = _run(alice, plan222, corpus, status=["queued", "submitted"], job_id="4242:1", attempts=1)
    done = _run(alice, plan222, corpus, status=["queued", "submitted", "completed"])
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        page = admin_client_logged_in.post(reverse("admin:workbench_run_changelist"), {
            "action": "cancel", "_selected_action": [running.pk, done.pk]}, follow=True)
    assert page.status_code == 200
    running.refresh_from_db()
    assert running.status == "cancelled" and running.finished_at and running.status_message.endswith("in the admin")
    assert len(callbacks) == 1  # run_cancel sends the stop task for the job it cancelled
    assert models.Run.objects.get(pk=done.pk).status == "completed"
    assert f"run {done.pk} (r): run {done.pk} is already completed" in page.content.decode().lower()


def test_it_queues_a_failed_run_again_through_the_service(admin_client_logged_in, alice, plan222, corpus,
                                                        django_capture_on_commit_callbacks):
    failed = _run(alice, plan222, corpus, status=["queued", "failed"], attempts=1)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        admin_client_logged_in.post(reverse("admin:workbench_run_changelist"), {
            "action": "queue", "_selected_action": [failed.pk]})
    failed.refresh_from_db()
    assert failed.status == "queued" and failed.queued_at and len(callbacks) == 1  # the launch task, on commit


def test_it_creates_a_run_through_run_create_and_refuses_what_it_refuses(admin_client_logged_in, alice, plan222,
                                                                         corpus):
    form = {"name": "from-admin", "owner": alice.pk, "plan": plan222.pk, "dataset": corpus.pk, "steps": 0,
            "seed": 1, "checkpoint_every": 0, "eval_every": 0, "optimizer": "{}", "profile": "null",
            "max_restarts": 2, **INLINE_MANAGEMENT}
    page = admin_client_logged_in.post(reverse("admin:workbench_run_add"), form)
    assert page.status_code == 200 and b"steps: steps=0 must be positive" in page.content
    assert not models.Run.objects.exists()
    page = admin_client_logged_in.post(reverse("admin:workbench_run_add"), {**form, "steps": 5})
    assert page.status_code == 302
    run = models.Run.objects.get()
    assert run.model_config == plan222.model_config and run.spec["steps"] == 5
    assert run.spec["output_dir"] == run.run_dir and run.run_dir.endswith(f"/{run.pk}")


def test_it_edits_a_clusters_machines_as_fields_and_a_gpu_preset_brings_its_figures(admin_client_logged_in):
    fields = {"name": "lab", "kind": "slurm", "partition": "gpu", "account": "team", "gpu_preset": "H100-SXM",
              "gpu_name": "", "memory_gb": "1", "peak_tflops": "1", "memory_bandwidth_gbs": "1", "nodes": "4",
              "gpus_per_node": "8", "intra_node_bandwidth_gbs": "450", "inter_node_bandwidth_gbs": "50",
              "gpu_hour_cost": "2.5", "env_setup": "[]", "stop_before_limit_s": "120"}
    answer = admin_client_logged_in.post(reverse("admin:workbench_cluster_add"), fields)
    assert answer.status_code == 302, answer.context["adminform"].form.errors
    spec = models.Cluster.objects.get(name="lab").spec
    assert spec["gpu"].items() <= presets.GPUS["H100-SXM"].to_dict().items() and (spec["nodes"], spec["gpus_per_node"]) == (4, 8)
    assert (spec["intra_node_bandwidth_gbs"], spec["gpu_hour_cost"]) == (450, 2.5)
    lab = models.Cluster.objects.get(name="lab")
    page = admin_client_logged_in.get(reverse("admin:workbench_cluster_change", args=[lab.pk])).content.decode()
    assert 'name="gpu_name" value="H100-SXM"' in page and 'name="nodes" value="4"' in page
    assert "Cost of a GPU-hour (USD):</label>" in page  # the currency the wizard shows costs in
    # a figure the contract refuses is refused on its own field's form
    answer = admin_client_logged_in.post(reverse("admin:workbench_cluster_change", args=[lab.pk]),
                                         {**fields, "gpu_preset": "", "gpu_name": "X", "nodes": "0"})
    assert answer.status_code == 200 and "Ensure this value is greater than or equal to 1" in answer.content.decode()
