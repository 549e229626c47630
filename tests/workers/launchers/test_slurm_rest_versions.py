"""The shapes of slurmrestd's API versions (workers.launchers.slurm_rest_versions), read from what each version's
server writes; the launcher speaks the v0.0.38 of the test cluster's slurmrestd in test_slurm_rest.py."""
import pytest

from workers.launchers import LaunchError
from workers.launchers.slurm_rest_versions import LEGACY, chosen_version, dialect, offered_versions

# The paths of a 24.11 server's description, a few of each version it loads.
DESCRIPTION_24_11 = {"paths": {f"/slurm/{v}/{p}": {} for v in ("v0.0.40", "v0.0.41", "v0.0.42")
                               for p in ("job/submit", "jobs", "ping")} | {"/slurmdb/v0.0.42/jobs": {}}}


def test_the_newest_version_both_sides_speak_is_chosen():
    assert offered_versions(DESCRIPTION_24_11) == {"v0.0.40", "v0.0.41", "v0.0.42"}
    assert chosen_version(offered_versions(DESCRIPTION_24_11), "http://x") == "v0.0.42"
    assert chosen_version({"v0.0.36", "v0.0.37", "v0.0.38"}, "http://x") == "v0.0.38"   # 22.05
    assert chosen_version({"v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44"}, "http://x") == "v0.0.42"   # 25.11


def test_a_server_without_a_version_spoken_here_is_refused_naming_both_sides():
    with pytest.raises(LaunchError) as refused:
        chosen_version({"v0.0.39", "v0.0.37"}, "http://login1:6820")
    assert str(refused.value).startswith("slurmrestd at http://login1:6820 offers v0.0.37, v0.0.39; this launcher "
                                         "speaks v0.0.38, v0.0.40, v0.0.41, v0.0.42")


def test_from_v0_0_40_the_script_goes_inside_the_job_with_the_newer_field_shapes():
    job = {"name": "wb-run1-a1", "nodes": 2, "gres": "gpu:4", "time_limit": 91, "partition": "debug",
           "excluded_nodes": "n1,n7"}
    body = dialect("v0.0.41").submit_body("#!/bin/bash\n", job, {"PATH": "/usr/bin", "LANG": "C.UTF-8"})
    assert body == {"job": {"name": "wb-run1-a1", "nodes": "2", "tres_per_node": "gres/gpu:4",
                            "time_limit": {"set": True, "infinite": False, "number": 91}, "partition": "debug",
                            "excluded_nodes": ["n1", "n7"],
                            "script": "#!/bin/bash\n", "environment": ["PATH=/usr/bin", "LANG=C.UTF-8"]}}
    assert LEGACY.submit_body("#!/bin/bash\n", {"nodes": 2}, {"PATH": "/usr/bin"}) == {
        "script": "#!/bin/bash\n", "job": {"nodes": 2, "environment": {"PATH": "/usr/bin"}}}


@pytest.mark.parametrize(("job_state", "state"), [
    (["PENDING"], "PENDING"), (["PENDING", "REQUEUED"], "PENDING"), (["RUNNING", "COMPLETING"], "COMPLETING"),
    (["COMPLETED"], "COMPLETED"), (["CANCELLED"], "CANCELLED"), (["NODE_FAIL", "REQUEUED"], "NODE_FAIL"), ([], "")])
def test_a_state_list_is_read_as_its_base_state_or_completing(job_state, state):
    assert dialect("v0.0.42").state({"job_state": job_state}) == state


def _number(n):
    return {"set": True, "infinite": False, "number": n}


@pytest.mark.parametrize(("exit_code", "code"), [
    ({"status": ["SUCCESS"], "return_code": _number(0), "signal": {"id": {"set": False}, "name": ""}}, 0),
    ({"status": ["ERROR"], "return_code": _number(2), "signal": {"id": {"set": False}, "name": ""}}, 2),
    ({"status": ["SIGNALED"], "return_code": {"set": False}, "signal": {"id": _number(9), "name": "KILL"}}, 137),
    ({"status": ["PENDING"], "return_code": {"set": False}}, None), (None, None)])
def test_an_exit_code_object_is_read_as_the_code_or_128_plus_the_signal(exit_code, code):
    assert dialect("v0.0.40").exit_code({"exit_code": exit_code}) == code
