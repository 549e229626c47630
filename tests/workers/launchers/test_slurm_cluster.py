"""The tests' Slurm cluster (tests/slurm_cluster.py) runs what a Slurm launcher submits: batch jobs on one and two
nodes, torch across its nodes, cancelling, and slurmrestd's v0.0.38 API with the job fields a launcher sets."""
import os
import shlex
import sys
import time

import pytest

# The batch script form for torchrun across the nodes of an allocation, as tried here. ``{python}`` and ``{program}``
# are filled in; the first node's address comes from Slurm, never from the test.
#
# Why each part (torch 2.13):
# - ``--rdzv_conf=is_host=1`` on the first node only: the c10d rendezvous lets an agent host its TCPStore when the
#   endpoint matches the machine's host name or the addresses that name resolves to
#   (``torch.distributed.elastic.rendezvous.utils._matches_machine_hostname``). Here every node's host name
#   resolves to 127.0.0.1, so no agent hosts it and all of them time out connecting to the endpoint. ``is_host`` is
#   then obeyed without a fallback, so exactly one node may say 1.
# - ``--local_addr=<the node's own address>`` on every node: after the rendezvous the rank-0 agent starts the
#   workers' store and publishes MASTER_ADDR as its ``--local_addr``, or else ``socket.getfqdn()``, the host name,
#   which on the other node is 127.0.0.1 again (the workers then hang connecting to their own loopback).
# - ``GLOO_SOCKET_IFNAME=wb0``: otherwise gloo binds to the host name's address, and connecting the ranks fails
#   ("Gloo connectFullMesh failed ... remote=[127.0.0.1]").
# Without the first two (the plain ``srun python -m torch.distributed.run ... --rdzv_endpoint=<addr>:<port>``), or
# with only one of them, the job hangs. Both take a value per node, hence the ``bash -c`` run by srun on each node.
# On a cluster whose host names resolve to their own interface addresses, the flags only restate what torch finds.
TORCHRUN_ACROSS_NODES = r"""#!/bin/bash
set -euo pipefail
node_address() {{ scontrol show node "$1" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2; }}
export FIRST_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
export RDZV_ENDPOINT="$(node_address "$FIRST_NODE"):$((20000 + SLURM_JOB_ID % 20000))"
export GLOO_SOCKET_IFNAME=wb0 PYTHON={python} PROGRAM={program}
srun --nodes=2 --ntasks-per-node=1 bash -c '
  is_host=0; [ "$SLURMD_NODENAME" = "$FIRST_NODE" ] && is_host=1
  own=$(scontrol show node "$SLURMD_NODENAME" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)
  exec "$PYTHON" -m torch.distributed.run --nnodes=2 --nproc_per_node=1 \
    --rdzv_backend=c10d --rdzv_endpoint="$RDZV_ENDPOINT" --rdzv_id="$SLURM_JOB_ID" \
    --rdzv_conf=is_host=$is_host --local_addr="$own" "$PROGRAM"'
"""

ALL_REDUCE = """import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} on {os.environ['SLURMD_NODENAME']}: sum {total.item():g}", flush=True)
dist.destroy_process_group()
"""


def _write_script(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_a_one_task_batch_job_completes_and_writes_what_it_printed(slurm_cluster, tmp_path):
    job_id = slurm_cluster.sbatch(f"--output={tmp_path}/out-%j.txt", "--wrap", "echo hello from $SLURMD_NODENAME")

    job = slurm_cluster.wait_for_job(job_id)

    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0")
    assert (tmp_path / f"out-{job_id}.txt").read_text() == f"hello from {job['NodeList']}\n"


def test_a_two_node_job_runs_one_task_on_each_node_each_with_its_own_address(slurm_cluster, tmp_path):
    script = _write_script(tmp_path / "where.sh", "#!/bin/bash\n"
                           "srun bash -c 'echo $SLURMD_NODENAME $(ip -4 -o addr show wb0 | awk \"{print \\$4}\")'\n")
    job_id = slurm_cluster.sbatch("-N2", "--ntasks-per-node=1", f"--output={tmp_path}/out.txt", str(script))

    assert slurm_cluster.wait_for_job(job_id)["JobState"] == "COMPLETED"
    tasks = dict(line.split() for line in (tmp_path / "out.txt").read_text().splitlines())
    assert tasks == {node: f"{address}/24" for node, address in slurm_cluster.node_addresses.items()}


def test_a_job_that_asks_for_gpus_is_given_the_nodes_fake_gpus(slurm_cluster, tmp_path):
    job_id = slurm_cluster.sbatch("--gres=gpu:2", f"--output={tmp_path}/out.txt", "--wrap",
                                  "echo $CUDA_VISIBLE_DEVICES")

    assert slurm_cluster.wait_for_job(job_id)["JobState"] == "COMPLETED"
    assert (tmp_path / "out.txt").read_text() == "0,1\n"


@pytest.mark.slow
def test_torchrun_across_the_two_nodes_all_reduces_over_gloo(slurm_cluster, tmp_path):
    program = _write_script(tmp_path / "all_reduce.py", ALL_REDUCE)
    script = _write_script(tmp_path / "torchrun.sh", TORCHRUN_ACROSS_NODES.format(
        python=shlex.quote(sys.executable), program=shlex.quote(str(program))))
    job_id = slurm_cluster.sbatch("-N2", "--ntasks-per-node=1", "--time=2", f"--output={tmp_path}/out.txt",
                                  str(script))

    job = slurm_cluster.wait_for_job(job_id, timeout=120)

    output = (tmp_path / "out.txt").read_text()
    assert job["JobState"] == "COMPLETED", output
    ranks = sorted(line for line in output.splitlines() if line.startswith("rank "))
    assert ranks == ["rank 0 on n1: sum 3", "rank 1 on n2: sum 3"] or ranks == [
        "rank 0 on n2: sum 3", "rank 1 on n1: sum 3"], output


def test_scancel_leaves_a_running_job_cancelled_within_seconds(slurm_env, tmp_path):
    cluster = slurm_env
    job_id = cluster.sbatch(f"--output={tmp_path}/out.txt", "--wrap", "sleep 300")
    cluster.wait_for_job(job_id, states=("RUNNING",))

    started = time.monotonic()
    cluster.run(["scancel", str(job_id)])
    job = cluster.wait_for_job(job_id, timeout=10)

    assert job["JobState"] == "CANCELLED" and time.monotonic() - started < 10


# slurmrestd, v0.0.38 (Slurm 22.05)


def _submission(tmp_path, script, **job):
    """A job/submit body: ``environment`` must be a dictionary, and an unknown key is refused (400)."""
    return {"script": script, "job": {"current_working_directory": str(tmp_path), "environment": {
        "PATH": os.environ["PATH"]}, "standard_output": f"{tmp_path}/rest-%j.out", **job}}


def _listed(cluster, job_id):
    status, body = cluster.rest("GET", "jobs")
    assert status == 200 and body["errors"] == []
    return next(job for job in body["jobs"] if job["job_id"] == job_id)


def test_slurmrestd_answers_ping_with_a_token_and_refuses_a_request_without_one(slurm_cluster):
    status, body = slurm_cluster.rest("GET", "ping")
    assert status == 200 and body["errors"] == []
    assert slurm_cluster.rest("GET", "ping", token="")[0] == 401
    # a token slurmctld cannot verify is a 500 ("slurmctld config is unable to load"), not a 401
    assert slurm_cluster.rest("GET", "ping", token="not.a.token")[0] == 500


def test_slurmrestd_runs_a_submitted_job_and_lists_its_name_comment_state_and_exit_code(slurm_cluster, tmp_path):
    status, body = slurm_cluster.rest("POST", "job/submit", _submission(
        tmp_path, "#!/bin/bash\necho via rest\n", name="via-rest", comment="run=7", nodes=1, tasks=1))
    assert status == 200 and body["errors"] == []
    job_id = body["job_id"]
    assert slurm_cluster.wait_for_job(job_id)["JobState"] == "COMPLETED"
    _, failing = slurm_cluster.rest("POST", "job/submit", _submission(tmp_path, "#!/bin/bash\nexit 3\n"))
    slurm_cluster.wait_for_job(failing["job_id"])

    listed = _listed(slurm_cluster, job_id)
    assert {key: listed[key] for key in ("name", "comment", "job_state", "state_reason", "exit_code")} == {
        "name": "via-rest", "comment": "run=7", "job_state": "COMPLETED", "state_reason": "None", "exit_code": 0}
    assert (tmp_path / f"rest-{job_id}.out").read_text() == "via rest\n"
    # exit_code is the wait status (code << 8 | signal), where scontrol says 3:0
    assert {key: _listed(slurm_cluster, failing["job_id"])[key] for key in ("job_state", "state_reason", "exit_code")
            } == {"job_state": "FAILED", "state_reason": "NonZeroExitCode", "exit_code": 3 << 8}


def test_slurmrestd_sets_the_job_fields_a_batch_launcher_uses(slurm_cluster, tmp_path):
    # time_limit is in minutes. scontrol does not show the signal: "USR1@60" was seen reaching the job's steps
    # (what srun started), not the batch shell, which needs "B:" (refused below). Like sbatch --signal, it is sent at
    # slurmctld's periodic time-limit check (jobs started seconds apart got it in the same second), so later than
    # asked by up to that period: tens of seconds.
    status, body = slurm_cluster.rest("POST", "job/submit", _submission(
        tmp_path, "#!/bin/bash\ntrue\n", name="fields", comment="run=8", nodes=2, tasks_per_node=1, cpus_per_task=2,
        time_limit=7, partition="debug", account="research", gres="gpu:1", signal="USR1@60", requeue=True))
    assert status == 200, body["errors"]

    job = slurm_cluster.wait_for_job(body["job_id"])
    assert {key: job[key] for key in ("JobName", "Comment", "NumNodes", "NumTasks", "CPUs/Task", "TimeLimit",
                                      "Partition", "Account", "TresPerNode", "Requeue")} == {
        "JobName": "fields", "Comment": "run=8", "NumNodes": "2", "NumTasks": "2", "CPUs/Task": "2",
        "TimeLimit": "00:07:00", "Partition": "debug", "Account": "research", "TresPerNode": "gres:gpu:1",
        "Requeue": "1"}


def test_slurmrestd_ignores_the_sbatch_lines_of_the_script(slurm_cluster, tmp_path):
    script = "#!/bin/bash\n#SBATCH --job-name=from-script\n#SBATCH --time=7\n#SBATCH --comment=x\ntrue\n"
    _, body = slurm_cluster.rest("POST", "job/submit", _submission(tmp_path, script))

    job = slurm_cluster.wait_for_job(body["job_id"])

    # none of the script's values: no name, no comment, and the partition's limit (shown as UNLIMITED, or as
    # 365-00:00:00 once the scheduler has looked at the job), not 7 minutes
    assert (job["JobName"], "Comment" in job) == ("(null)", False)
    assert job["TimeLimit"] in ("UNLIMITED", "365-00:00:00")


@pytest.mark.parametrize("field", [{"signal": "B:USR1@60"}, {"tres_per_node": "gres/gpu:1"}])
def test_slurmrestd_refuses_a_batch_shell_signal_and_fields_it_only_reports(slurm_cluster, tmp_path, field):
    status, body = slurm_cluster.rest("POST", "job/submit", _submission(tmp_path, "#!/bin/bash\ntrue\n", **field))
    assert status == 400 and body["errors"]


def test_slurmrestd_keeps_requeue_on_when_asked_for_false(slurm_cluster, tmp_path):
    # v0.0.38 drops "requeue": false: a launcher that retries by itself cannot turn Slurm's requeue off this way.
    _, body = slurm_cluster.rest("POST", "job/submit", _submission(tmp_path, "#!/bin/bash\ntrue\n", requeue=False))
    assert slurm_cluster.wait_for_job(body["job_id"])["Requeue"] == "1"


def test_slurmrestd_delete_cancels_a_job_and_with_a_signal_only_signals_it(slurm_cluster, tmp_path):
    script = ("#!/bin/bash\ntrap 'echo got USR1' USR1\ntrap 'echo got TERM; exit 0' TERM\necho traps set\n"
              "while :; do sleep 0.1; done\n")
    _, body = slurm_cluster.rest("POST", "job/submit", _submission(tmp_path, script))
    job_id = body["job_id"]
    slurm_cluster.wait_for_job(job_id, states=("RUNNING",))
    # RUNNING comes before the shell has read its traps: a signal sent sooner would go unanswered
    output = tmp_path / f"rest-{job_id}.out"
    deadline = time.monotonic() + 10
    while "traps set" not in (output.read_text() if output.exists() else ""):
        assert time.monotonic() < deadline, "the job's shell never set its traps"
        time.sleep(0.05)

    assert slurm_cluster.rest("DELETE", f"job/{job_id}?signal=USR1")[0] == 200
    time.sleep(0.5)
    assert slurm_cluster.job(job_id)["JobState"] == "RUNNING"
    # without a signal: the batch shell gets SIGTERM (SIGKILL KillWait seconds later), and the job ends CANCELLED
    assert slurm_cluster.rest("DELETE", f"job/{job_id}")[0] == 200
    assert slurm_cluster.wait_for_job(job_id, timeout=10)["JobState"] == "CANCELLED"
    assert _listed(slurm_cluster, job_id)["job_state"] == "CANCELLED"
    printed = output.read_text().splitlines()
    assert [line for line in printed if line.startswith("got ")] == ["got USR1", "got TERM"]
