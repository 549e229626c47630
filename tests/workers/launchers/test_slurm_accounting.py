"""Slurm's accounting as the launchers read it: sacct's parsable lines become one record per job with its steps,
who cancelled it and what it held; and on the 24.11 test cluster, which keeps accounting in slurmdbd over MariaDB,
sacct really answers with every step's exit code, run time and peak memory, and slurmrestd's slurmdbd endpoints
answer the same."""
from __future__ import annotations

import time

import pytest

from workers.launchers.slurm_accounting import parse_sacct
from workers.launchers.slurm_cli import SlurmCLILauncher
from workers.launchers.slurm_rest import SlurmRestLauncher

# what sacct printed on the 24.11 test cluster for a job of two steps (the second exits 3) and a cancelled job
SACCT = """\
1|wrap|COMPLETED|0:0|2|billing=1,cpu=1,node=1,gres/gpu=2||n1|2026-12-04T16:21:09|2026-12-04T16:21:11
1.batch|batch|COMPLETED|0:0|2|cpu=1,mem=0,node=1|11376K|n1|2026-12-04T16:21:11|2026-12-04T16:21:11
1.0|sh|COMPLETED|0:0|2|cpu=1,mem=0,node=1|64288K|n1|2026-12-04T16:21:11|2026-12-04T16:21:11
1.1|sh|FAILED|3:0|0|cpu=1,mem=0,node=1||n1|2026-12-04T16:21:13|2026-12-04T16:21:13
2|wrap|CANCELLED by 0|0:0|2|billing=1,cpu=1,node=1||n1|2026-12-04T16:21:13|2026-12-04T16:21:13
2.batch|batch|CANCELLED|0:15|2|cpu=1,mem=0,node=1|3712K|n1|2026-12-04T16:21:13|2026-12-04T16:21:13
3|wrap|PENDING|0:0|0|||None assigned|2026-12-04T16:21:13|Unknown
"""


def test_sacct_lines_become_a_record_per_job_with_its_steps():
    jobs = parse_sacct(SACCT)
    first, cancelled, pending = jobs["1"], jobs["2"], jobs["3"]
    assert (first.state, first.exit_code, first.queued_s, first.elapsed_s, first.cancelled_by) == \
        ("COMPLETED", 0, 2, 2, "")
    assert [(s.step, s.state, s.exit_code, s.max_rss_bytes) for s in first.steps] == [
        ("batch", "COMPLETED", 0, 11376 * 1024), ("0", "COMPLETED", 0, 64288 * 1024), ("1", "FAILED", 3, None)]
    assert first.to_dict()["gpu_seconds"] == 4 and first.to_dict()["cpu_seconds"] == 2
    assert "1 (sh) failed exit 3" in first.summary()
    assert (cancelled.state, cancelled.cancelled_by, cancelled.steps[0].exit_code) == ("CANCELLED", "root", 128 + 15)
    assert "cancelled by root" in cancelled.summary()
    assert (pending.state, pending.queued_s, pending.steps) == ("PENDING", None, [])


def test_lines_of_another_shape_are_left_out():
    assert parse_sacct("sacct: error: Problem talking to the database: Connection refused\n") == {}


@pytest.mark.slow
def test_the_current_cluster_accounts_for_every_step_and_for_who_cancelled(slurm_cluster_24, monkeypatch):
    cluster = slurm_cluster_24
    for name, value in cluster.env.items():
        monkeypatch.setenv(name, value)
    steps = ("srun python3 -c 'x = bytearray(200 * 2**20); import time; time.sleep(2.5)'; "
             "srun sh -c 'exit 3'; exit 0")
    finished = cluster.sbatch("--wrap", steps, "--nodes=1", "--ntasks=1", f"--chdir={cluster.root}",
                              "--output=/dev/null")
    sleeper = cluster.sbatch("--wrap", "sleep 60", f"--chdir={cluster.root}", "--output=/dev/null")
    cluster.wait_for_job(sleeper, states=("RUNNING",))
    cluster.run(["scancel", str(sleeper)])
    for job in (finished, sleeper):
        cluster.wait_for_job(job, timeout=60)
    launcher, deadline = SlurmCLILauncher(), time.monotonic() + 15
    while (records := launcher.accounting([str(finished), str(sleeper)])).get(str(sleeper)) is None or \
            any(r.state in ("RUNNING", "COMPLETING") for r in records.values()):
        assert time.monotonic() < deadline, records
        time.sleep(0.5)
    done, cancelled = records[str(finished)], records[str(sleeper)]
    assert (done.state, done.exit_code) == ("COMPLETED", 0)
    by_step = {s.step: s for s in done.steps}
    assert by_step["1"].exit_code == 3 and by_step["1"].state == "FAILED"
    assert by_step["0"].exit_code == 0 and by_step["0"].elapsed_s >= 2
    assert by_step["0"].max_rss_bytes >= 200 * 2**20  # the 200 MiB the step held, sampled each second
    assert (cancelled.state, cancelled.cancelled_by) == ("CANCELLED", "root")
    assert launcher.calls[-1][0] == "sacct"
    # slurmrestd's slurmdbd endpoints, at the version the REST launcher negotiated, keep the same record. Under
    # load slurmdbd may still be rewriting the cancelled job's batch step after the job ended (seen twice under load:
    # sacct read it FAILED 15:0 while slurmrestd read it killed by signal 15): the two are compared once the record
    # has settled, sacct reading the same before and after slurmrestd, and slurmrestd the same as sacct.
    monkeypatch.setenv("SLURM_JWT", cluster.token())
    monkeypatch.delenv("SLURM_JWT_USER", raising=False)
    rest, jobs, deadline = SlurmRestLauncher(cluster.rest_url), [str(finished), str(sleeper)], time.monotonic() + 30
    while True:
        through_rest = rest.accounting(jobs)
        again = launcher.accounting(jobs)
        if again == records == through_rest:
            break
        assert time.monotonic() < deadline, {"sacct": records, "sacct again": again, "slurmrestd": through_rest}
        records = again
        time.sleep(0.5)
    assert {tuple(call[1].split("/")[:2]) for call in rest.calls} == {("slurmdb", rest.version)}
