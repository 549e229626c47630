"""Who may see and change what: anonymous clients nothing, users their own and shared objects, staff everything."""
import pytest

from trainer.contract import presets

WRITES = [
    ("post", "/api/model-configs/"), ("post", "/api/plans/"), ("post", "/api/clusters/"), ("post", "/api/datasets/"),
    ("post", "/api/runs/"), ("put", "/api/model-configs/1/"), ("patch", "/api/plans/1/"),
    ("delete", "/api/clusters/1/"), ("delete", "/api/datasets/1/"), ("post", "/api/runs/1/cancel/"),
    ("post", "/api/runs/1/launch/"), ("post", "/api/triton-servers/"), ("post", "/api/deployments/"),
    ("post", "/api/deployments/1/undeploy/"), ("post", "/api/deployments/1/generate/"),
    ("post", "/api/checkpoints/register/"), ("post", "/api/prompt-templates/"),
]


@pytest.mark.parametrize("method, url", WRITES)
def test_it_answers_every_write_without_credentials_with_401(db, api, method, url):
    response = getattr(api(None), method)(url, {}, format="json")
    assert response.status_code == 401


@pytest.mark.parametrize("url", ["/api/model-configs/", "/api/runs/", "/api/metrics/", "/api/clusters/",
                                 "/api/triton-servers/", "/api/triton-servers/1/status/", "/api/deployments/",
                                 "/api/prompt-templates/"])
def test_it_answers_reads_without_credentials_with_401(db, api, url):
    assert api(None).get(url).status_code == 401


def test_it_hides_a_private_config_from_another_user(alice, bob, api, gpt2_small):
    assert api(bob).get(f"/api/model-configs/{gpt2_small.id}/").status_code == 404
    assert api(bob).get("/api/model-configs/").json()["count"] == 0
    assert api(bob).patch(f"/api/model-configs/{gpt2_small.id}/", {"name": "mine"}, format="json").status_code == 404
    assert api(bob).delete(f"/api/model-configs/{gpt2_small.id}/").status_code == 404
    assert api(alice).get("/api/model-configs/").json()["count"] == 1


def test_it_shows_a_shared_config_to_others_but_lets_only_the_owner_change_it(alice, bob, api, gpt2_small):
    gpt2_small.shared = True
    gpt2_small.save()
    assert api(bob).get(f"/api/model-configs/{gpt2_small.id}/").status_code == 200
    assert api(bob).patch(f"/api/model-configs/{gpt2_small.id}/", {"name": "mine"}, format="json").status_code == 403
    assert api(bob).delete(f"/api/model-configs/{gpt2_small.id}/").status_code == 403
    assert api(alice).patch(f"/api/model-configs/{gpt2_small.id}/", {"name": "ok"}, format="json").status_code == 200


def test_it_lets_staff_see_and_change_everything(staff, api, gpt2_small):
    assert api(staff).get(f"/api/model-configs/{gpt2_small.id}/").status_code == 200
    assert api(staff).patch(f"/api/model-configs/{gpt2_small.id}/", {"description": "x"},
                            format="json").status_code == 200


def test_it_refuses_a_plan_on_another_users_private_model(bob, api, gpt2_small, cluster8):
    response = api(bob).post("/api/plans/", {"name": "p", "model_config": gpt2_small.id, "cluster": cluster8.id,
                                             "spec": {"dp": 8, "global_batch": 8}}, format="json")
    assert response.status_code == 400 and "model_config" in response.data


def test_it_lets_users_read_clusters_and_only_staff_write_them(alice, staff, api, cluster8):
    spec = presets.cluster("H100-SXM", 2, 8).to_dict()
    assert api(alice).get(f"/api/clusters/{cluster8.id}/").status_code == 200
    assert api(alice).post("/api/clusters/", {"name": "h", "spec": spec}, format="json").status_code == 403
    assert api(alice).delete(f"/api/clusters/{cluster8.id}/").status_code == 403
    created = api(staff).post("/api/clusters/", {"name": "h", "kind": "slurm", "spec": spec, "partition": "gpu",
                                                 "time_limit": "1-02:00:00"}, format="json")
    assert created.status_code == 201, created.data


def test_it_validates_cluster_fields(staff, api):
    spec = presets.cluster().to_dict()
    bad_time = api(staff).post("/api/clusters/", {"name": "c", "spec": spec, "time_limit": "soon"}, format="json")
    assert bad_time.status_code == 400 and "not a Slurm time" in bad_time.data["time_limit"][0]
    local_partition = api(staff).post("/api/clusters/", {"name": "c", "spec": spec, "partition": "gpu"},
                                      format="json")
    assert local_partition.status_code == 400 and "Slurm clusters only" in local_partition.data["kind"][0]
    no_gpus = api(staff).post("/api/clusters/", {"name": "c", "spec": {**spec, "gpus_per_node": 0}}, format="json")
    assert no_gpus.status_code == 400 and "gpus_per_node=0 must be positive" in no_gpus.data["spec"]["gpus_per_node"][0]


def test_it_keeps_datasets_inside_the_data_roots_and_says_the_same_of_missing_files(alice, api, data_root):
    inside = api(alice).post("/api/datasets/", {"name": "d", "path": str(data_root / "corpus.txt")}, format="json")
    assert inside.status_code == 201, inside.data
    outside = api(alice).post("/api/datasets/", {"name": "e", "path": "/etc/passwd"}, format="json")
    missing = api(alice).post("/api/datasets/", {"name": "f", "path": str(data_root / "nope.txt")}, format="json")
    assert outside.status_code == missing.status_code == 400
    assert "is not a file or folder you may use" in outside.data["path"][0]
    # the same words for a file that is not there as for one that may not be read: no probing which files exist
    assert outside.data["path"][0].replace("/etc/passwd", "X") == \
        missing.data["path"][0].replace(str(data_root / "nope.txt"), "X")
