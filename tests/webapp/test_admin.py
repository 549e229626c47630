"""The admin logs in, lists every stored object and validates edits through the contract."""
import pytest
from django.urls import reverse

from trainer.contract import presets
from webapp import models

ADMIN_MODELS = ["modelconfig", "parallelismplan", "cluster", "dataset", "run", "metric", "checkpoint", "profile",
                "tritonserver", "deployment", "prompttemplate", "tunejob"]


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
