"""A cluster's scheduler fields are checked by what they are: Slurm names and times, an image reference, setup lines
and a runs root under the configured roots; nothing that could end a #SBATCH line gets in."""
import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from trainer.contract import presets
from webapp.models.clusterfields import container_image_problem, slurm_name_problem, time_limit_problem

SPEC = presets.cluster().to_dict()


def _cluster(api, staff, **fields):
    return api(staff).post("/api/clusters/", {"name": "c", "kind": "slurm", "spec": SPEC, **fields}, format="json")


@pytest.mark.parametrize("value", ["gpu", "a100_80g", "long-run.v2", "A" * 64])
@pytest.mark.parametrize("field", ["partition", "account", "qos"])
def test_it_takes_slurm_names(staff, api, field, value):
    assert _cluster(api, staff, **{field: value}).status_code == 201


@pytest.mark.parametrize("value", ["gpu\n#SBATCH --uid=0", "gpu;rm", "two words", "-x", ".hidden", "A" * 65,
                                   "gpü", "gpu$(id)"])
@pytest.mark.parametrize("field", ["partition", "account", "qos"])
def test_it_refuses_what_is_not_a_slurm_name(staff, api, field, value):
    answer = _cluster(api, staff, **{field: value})
    assert answer.status_code == 400 and f"{field} {value!r} is not a Slurm name" in answer.data[field][0]
    assert "letters, digits, '_', '-' and '.'" in answer.data[field][0] and "at most 64" in answer.data[field][0]


@pytest.mark.parametrize("value", ["90", "30:00", "02:00:00", "1-12", "1-12:30", "1-00:00:00", "7-23:59:59"])
def test_it_takes_each_slurm_time_format(staff, api, value):
    assert _cluster(api, staff, time_limit=value).status_code == 201


@pytest.mark.parametrize("value", ["soon", "١٢:٠٠", "1-24", "02:60:00", "1:2:3:4", "-1", "1--2", "1-", "9 0"])
def test_it_refuses_what_is_not_a_slurm_time(staff, api, value):
    answer = _cluster(api, staff, time_limit=value)
    assert answer.status_code == 400 and f"{value!r} is not a Slurm time" in answer.data["time_limit"][0]
    assert "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS with ASCII digits" in answer.data["time_limit"][0]


@pytest.mark.parametrize("value", ["ubuntu", "nvcr.io/nvidia/pytorch:24.05-py3", "localhost:5000/team/trainer",
                                   "ghcr.io/org/img@sha256:" + "a" * 64, "registry.example/a/b:v1@sha256:" + "0" * 64])
def test_it_takes_image_references(staff, api, value):
    assert _cluster(api, staff, container_image=value).status_code == 201


@pytest.mark.parametrize("value", ["Ubuntu", "img:tag with space", "img;rm -rf /", "img$(id)", "img\nx", "img:",
                                   "img@sha256:short", "a/" * 130 + "b", "'quoted'"])
def test_it_refuses_what_is_not_an_image_reference(staff, api, value):
    answer = _cluster(api, staff, container_image=value)
    assert answer.status_code == 400 and "is not a container image reference" in answer.data["container_image"][0]


def test_it_stores_directive_values_without_the_whitespace_around_them_and_refuses_it_inside(staff, api):
    answer = _cluster(api, staff, time_limit=" 02:00:00\n", partition="gpu\n")
    assert answer.status_code == 201 and (answer.data["time_limit"], answer.data["partition"]) == ("02:00:00", "gpu")
    # the model's own check, which the admin and any other writer go through, takes no stray line break either
    assert time_limit_problem("02:00:00\n") and slurm_name_problem("partition", "gpu\n")
    assert container_image_problem("img\n")


def test_it_takes_setup_lines_as_a_list_of_strings_and_refuses_line_breaks_inside_one(staff, api):
    fine = _cluster(api, staff, env_setup=["module load cuda/12.4", "source /opt/env.sh"])
    assert fine.status_code == 201 and fine.data["env_setup"] == ["module load cuda/12.4", "source /opt/env.sh"]
    for value, message in [("module load cuda", "give the setup as a JSON list of strings"),
                           (["ok", 3], "give the setup as a JSON list of strings"),
                           (["module load cuda\nrm -rf /"], "line 1 holds a line break or NUL"),
                           (["ok", "a\rb"], "line 2 holds a line break or NUL"),
                           (["x" * 1001], "line 1 has 1001 characters; at most 1000"),
                           (["x"] * 101, "101 lines; at most 100")]:
        answer = api(staff).post("/api/clusters/", {"name": "d", "kind": "slurm", "spec": SPEC, "env_setup": value},
                                 format="json")
        assert answer.status_code == 400 and message in answer.data["env_setup"][0], (value, answer.data)


def test_it_keeps_a_clusters_runs_root_under_the_configured_roots(staff, api, tmp_path, settings):
    settings.WORKBENCH = {**settings.WORKBENCH, "RUNS_ROOTS": [tmp_path / "runs"]}
    assert _cluster(api, staff, runs_root=str(tmp_path / "runs" / "team-a")).status_code == 201
    for value, message in [(str(tmp_path / "elsewhere"), "is outside the runs roots"),
                           (str(tmp_path / "runs" / ".." / "escape"), "is outside the runs roots"),
                           ("runs/relative", "is a relative path")]:
        answer = api(staff).post("/api/clusters/", {"name": "e", "spec": SPEC, "runs_root": value}, format="json")
        assert answer.status_code == 400 and message in answer.data["runs_root"][0], answer.data
        assert "WORKBENCH_RUNS_ROOTS" in answer.data["runs_root"][0]


@pytest.mark.django_db(transaction=True)
def test_it_turns_existing_setup_text_into_lines_when_migrating():
    executor = MigrationExecutor(connection)
    try:
        executor.migrate([("workbench", "0005_run_launching_since")])
        Cluster = executor.loader.project_state([("workbench", "0005_run_launching_since")]).apps.get_model(
            "workbench", "Cluster")
        Cluster.objects.create(name="old", spec=SPEC, env_setup="module load cuda\n\n  source /opt/env.sh  \n")
        Cluster.objects.create(name="none", spec=SPEC)
        executor = MigrationExecutor(connection)
        executor.migrate([("workbench", "0006_data_roots_and_cluster_fields")])
        Cluster = executor.loader.project_state([("workbench", "0006_data_roots_and_cluster_fields")]).apps.get_model(
            "workbench", "Cluster")
        assert Cluster.objects.get(name="old").env_setup == ["module load cuda", "  source /opt/env.sh"]
        assert Cluster.objects.get(name="none").env_setup == []
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
