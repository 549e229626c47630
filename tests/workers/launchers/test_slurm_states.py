"""Slurm's states and reasons, as squeue, sacct and slurmrestd give them, in words a person can act on."""
import pytest

from workers.launchers.slurm_states import exit_status, expand_hostlist, job_state


@pytest.mark.parametrize("state, reason, alive, words", [
    ("PENDING", "Resources", True, "waiting: Resources"),
    ("RUNNING", "None", True, ""),
    ("COMPLETING", "None", True, ""),  # not over: the job's processes are still being cleaned up
    ("COMPLETED", "None", False, ""),
    ("TIMEOUT", "TimeLimit", False, "the job reached its time limit; TimeLimit"),
    ("OUT_OF_MEMORY", "OutOfMemory", False, "a node of the job ran out of memory (OUT_OF_MEMORY): lower the "
                                            "micro-batch, use activation checkpointing or shard more of the state; "
                                            "OutOfMemory"),
    ("NODE_FAIL", "NodeDown", False, "a node of the job failed (NODE_FAIL); NodeDown"),
    ("PREEMPTED", "None", False, "the job was preempted by a job of higher priority"),
])
def test_it_says_what_each_state_means_and_whether_the_job_may_still_change(state, reason, alive, words):
    said = job_state(state, reason)
    assert (said.state, said.alive, said.reason) == (state, alive, words)


def test_it_names_who_cancelled_a_job_as_sacct_records_it():
    said = job_state("CANCELLED by 0")
    assert (said.state, said.alive, said.reason) == ("CANCELLED", False, "the job was cancelled by root")


def test_a_failure_says_its_exit_code():
    assert job_state("FAILED", "NonZeroExitCode", 3).reason == "the job failed with exit code 3; NonZeroExitCode"


@pytest.mark.parametrize("value, code", [("0:0", 0), ("3:0", 3), ("0:9", 137), ("0:15", 143), ("", None)])
def test_an_exit_code_and_signal_become_one_number(value, code):
    assert exit_status(value) == code



@pytest.mark.parametrize(("hostlist", "names"), [
    ("n1", ["n1"]), ("n[1-3,7]", ["n1", "n2", "n3", "n7"]), ("gpu[08-10],cpu1", ["gpu08", "gpu09", "gpu10", "cpu1"]),
    ("rack[1-2]-a,login", ["rack1-a", "rack2-a", "login"]), ("", [])])
def test_a_host_list_is_read_as_node_names_as_scontrol_gives_them(hostlist, names):
    assert expand_hostlist(hostlist) == names
