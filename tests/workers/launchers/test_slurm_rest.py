"""The slurmrestd launcher against the test cluster's own slurmrestd (v0.0.38): a tiny run submitted with its batch
script, the job's properties taken from that script, many jobs polled with one request, a job found again by a new
launcher, cancelling, jobs Slurm no longer lists, and what it says when the token or the address is wrong.

Jobs that need not train stop in the cluster's setup lines (``exit 3``, ``sleep 300``): the launcher and the batch
script are the real ones, only the trainer is never reached."""
import itertools
import os
import socket
import sys
import threading
import time
from dataclasses import replace

import pytest
from django.contrib.auth.models import User

from tests.trainer.launch import losses, tiny_spec
from trainer.contract import DatasetSpec, presets
from trainer.contract.presets import DEMO_TEXT
from trainer.contract.runfolder import SPEC, write_json_atomic
from webapp.models import CheckpointConversion
from webapp.services.job_rows import job_claim
from workers.job_process import Following, follow_command
from workers.launchers import CommandRequest, Job, JobRequest, JobState, JobStates, LaunchError, SchedulerSettings, launcher_for
from workers.launchers.sbatch import batch_script
from workers.launchers.slurm_rest import SlurmRestLauncher, job_environment, job_properties
from workers.launchers.slurm_rest_versions import LEGACY
from workers.supervise import EXIT_FILE

# Job names hold the run's id, and the session's cluster also runs other tests' jobs: ids no test database reaches.
_RUN_IDS = itertools.count(10_000_000 + os.getpid() % 10_000 * 100)
NEVER_GIVEN = "99999999"  # a job id the cluster never gave: a job it no longer lists


@pytest.fixture
def rest(slurm_env, monkeypatch):
    """The cluster, with a token for the worker's own user (root) in the environment, as a worker gets it."""
    monkeypatch.setenv("SLURM_JWT", slurm_env.token())
    monkeypatch.delenv("SLURM_JWT_USER", raising=False)
    return slurm_env


@pytest.fixture
def rest_any(any_slurm, monkeypatch):
    """``rest`` on each test cluster in turn: Slurm 22.05 (v0.0.38) and 24.11 (v0.0.40 to v0.0.42)."""
    monkeypatch.setenv("SLURM_JWT", any_slurm.token())
    monkeypatch.delenv("SLURM_JWT_USER", raising=False)
    return any_slurm


def _request(run_dir, setup=(), time_limit="", cluster=None, **plan) -> JobRequest:
    """An attempt of a two-step run of a two-layer model; ``setup``: the cluster's shell lines."""
    run_dir.mkdir(parents=True, exist_ok=True)
    corpus = run_dir.parent / "corpus.txt"
    corpus.write_text(DEMO_TEXT.read_text()[:60_000])
    spec = tiny_spec(run_dir, DatasetSpec(path=str(corpus), prepared_dir=str(run_dir.parent / "prepared")), steps=2,
                     layers=2, cluster=cluster, global_batch=4, **plan)
    settings = SchedulerSettings(kind="slurm-rest", partition="debug", time_limit=time_limit,
                                 env_setup=("export GLOO_SOCKET_IFNAME=wb0", *setup))
    return JobRequest(run_id=next(_RUN_IDS), attempt=1, run_dir=run_dir, spec=spec, settings=settings)


def _submit(cluster, run_dir, *setup: str) -> tuple[JobRequest, Job]:
    request = _request(run_dir, setup)
    started = SlurmRestLauncher(cluster.rest_url).submit(request)
    return request, Job(started.job_id, run_dir)


@pytest.mark.slow
def test_a_tiny_run_trains_as_a_job_with_the_properties_its_batch_script_names(rest, tmp_path):
    request = _request(tmp_path / "run", time_limit="10")
    write_json_atomic(request.run_dir / SPEC, request.spec.to_dict())
    launcher = SlurmRestLauncher(rest.rest_url)

    started = launcher.submit(request)

    job = Job(started.job_id, request.run_dir)
    fields = rest.wait_for_job(int(job.job_id), timeout=240)
    output = launcher.log_paths(job)
    assert fields["JobState"] == "COMPLETED", output[0].read_text(errors="replace")[-3000:]
    assert output == [request.run_dir / "logs" / f"slurm-{job.job_id}.out"] and output[0].exists()
    assert len(losses(request.run_dir)) == 2
    assert (request.run_dir / "job.sbatch").read_text() == started.script == batch_script(request)
    assert started.command[-1] == str(request.run_dir / "job.sbatch")
    # slurmrestd ignores the script's #SBATCH lines: each of these came in the request, from those lines' values
    assert {key: fields[key] for key in ("JobName", "Comment", "NumNodes", "NumTasks", "CPUs/Task", "TimeLimit",
                                         "Partition", "WorkDir", "StdOut")} == {
        "JobName": request.job_name, "Comment": f"workbench-run-{request.run_id}-attempt-1", "NumNodes": "1",
        "NumTasks": "1", "CPUs/Task": "1", "TimeLimit": "00:10:00", "Partition": "debug",
        "WorkDir": str(request.run_dir), "StdOut": str(output[0])}
    assert launcher.poll([job]) == {job.job_id: JobState(JobStates.COMPLETED, 0, "")}


def test_a_job_on_gpus_asks_for_them_and_gets_a_short_environment_not_the_workers(rest, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_TEST_SECRET", "never in a job")
    seen = tmp_path / "env.txt"
    request = _request(tmp_path / "run", (f"env > {seen}", "exit 0"), cluster=presets.cluster(gpus_per_node=2), tp=2)

    started = SlurmRestLauncher(rest.rest_url).submit(request)

    fields = rest.wait_for_job(int(started.job_id))
    assert (fields["JobState"], fields["TresPerNode"], fields["CPUs/Task"]) == ("COMPLETED", "gres:gpu:2", "2")
    environment = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert environment["SLURM_CONF"] == str(rest.conf) and environment["PATH"] == os.environ["PATH"]
    assert "WORKBENCH_TEST_SECRET" not in environment and "SLURM_JWT" not in environment


def test_one_request_polls_every_job_whatever_its_state(rest, tmp_path):
    _, done = _submit(rest, tmp_path / "done", "exit 0")
    _, failed = _submit(rest, tmp_path / "failed", "exit 3")
    _, running = _submit(rest, tmp_path / "running", "sleep 300")
    recorded = Job(NEVER_GIVEN, tmp_path / "recorded")
    write_json_atomic(recorded.run_dir / EXIT_FILE, {"job_id": NEVER_GIVEN, "exit_code": 3, "ended": 0})
    unrecorded = Job(NEVER_GIVEN, tmp_path / "unrecorded")
    for job in (done, failed):
        rest.wait_for_job(int(job.job_id))
    rest.wait_for_job(int(running.job_id), states=("RUNNING",))
    launcher = SlurmRestLauncher(rest.rest_url)

    states = launcher.poll([done, failed, running, recorded])
    gone = launcher.poll([unrecorded])[NEVER_GIVEN]

    assert launcher.calls == [["GET", "jobs"], ["GET", "jobs"]]
    assert states[done.job_id] == JobState(JobStates.COMPLETED, 0, "")
    # slurmrestd gives the wait status (3 << 8); the run sees the exit code
    assert states[failed.job_id] == JobState(JobStates.FAILED, 3, "the job failed with exit code 3; NonZeroExitCode")
    assert states[running.job_id].running and states[running.job_id].exit_code is None
    assert states[NEVER_GIVEN] == JobState(JobStates.GONE, 3, "Slurm no longer lists the job; its script exited "
                                                              "with 3")
    assert (gone.state, gone.exit_code, gone.reason) == (
        JobStates.GONE, None, "Slurm no longer lists the job; it ended without an exit record")
    assert launcher.poll([]) == {} and len(launcher.calls) == 2
    launcher.cancel(running)


def test_a_new_launcher_finds_the_job_a_crashed_one_submitted_by_its_name(rest, tmp_path):
    request, job = _submit(rest, tmp_path / "run", "sleep 300")
    after_a_crash = SlurmRestLauncher(rest.rest_url)

    assert after_a_crash.find(request) == job.job_id
    assert after_a_crash.find(replace(request, attempt=2)) is None
    assert after_a_crash.calls == [["GET", "jobs"], ["GET", "jobs"]]
    after_a_crash.cancel(job)


def test_cancel_ends_a_running_job_and_minds_no_job_that_is_over_or_unknown(rest, tmp_path):
    started = tmp_path / "run" / "script-started"
    _, job = _submit(rest, tmp_path / "run", f"touch {started}", "sleep 300")
    rest.wait_for_job(int(job.job_id), states=("RUNNING",))
    # RUNNING comes before the batch script reaches its sleep; cancelled earlier it ends otherwise than by SIGTERM
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started.exists(), "the batch script did not start within 30 s"
    launcher = SlurmRestLauncher(rest.rest_url)

    asked = time.monotonic()
    launcher.cancel(job)

    assert rest.wait_for_job(int(job.job_id), timeout=10)["JobState"] == "CANCELLED"
    assert time.monotonic() - asked < 10
    state = launcher.poll([job])[job.job_id]
    # killed by Slurm's SIGTERM: no exit record, and the signal as 128 + 15
    assert (state.state, state.exit_code, state.reason) == (JobStates.CANCELLED, 143, "the job was cancelled")
    launcher.cancel(job)
    launcher.cancel(Job(NEVER_GIVEN, tmp_path))
    assert launcher.calls == [["DELETE", f"job/{job.job_id}"], ["GET", "jobs"], ["DELETE", f"job/{job.job_id}"],
                              ["DELETE", f"job/{NEVER_GIVEN}"]]


def test_a_token_written_as_scontrol_prints_it_is_taken(rest, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JWT", f"SLURM_JWT={rest.token()}\n")
    assert SlurmRestLauncher(rest.rest_url).poll([Job(NEVER_GIVEN, tmp_path)])[NEVER_GIVEN].state == JobStates.GONE


def test_without_a_token_it_says_to_set_one_and_sends_nothing(rest, tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JWT")
    launcher = SlurmRestLauncher(rest.rest_url)

    with pytest.raises(LaunchError, match=r"no token for slurmrestd: set SLURM_JWT .*scontrol token"):
        launcher.find(_request(tmp_path / "run"))

    assert launcher.calls == []


@pytest.mark.parametrize("bad", ["not.a.token", "signed with another key"])
def test_a_token_slurm_cannot_verify_is_reported_as_refused(rest, tmp_path, monkeypatch, bad):
    # v0.0.38 answers a bad token with a 500 "Unspecified error", not a 401: slurmctld refuses the call behind it
    token = rest.token()
    monkeypatch.setenv("SLURM_JWT", bad if bad == "not.a.token" else token[:-4] + token[-4:][::-1].swapcase())
    launcher = SlurmRestLauncher(rest.rest_url)

    with pytest.raises(LaunchError, match=r"^the token was refused: .*GET jobs with 500 .*set SLURM_JWT to a fresh "
                                          r"token from `scontrol token username=root"):
        launcher.poll([Job(NEVER_GIVEN, tmp_path)])
    with pytest.raises(LaunchError, match=r"^the token was refused: .*POST job/submit with 500"):
        launcher.submit(_request(tmp_path / "run", ("exit 0",)))


def test_a_slurmrestd_that_does_not_answer_is_named_with_its_address(rest, tmp_path):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(LaunchError, match=rf"^slurmrestd at http://127.0.0.1:{port} does not answer: .*refused.*: "
                                          r"check the cluster's rest_url"):
        SlurmRestLauncher(f"http://127.0.0.1:{port}/").poll([Job(NEVER_GIVEN, tmp_path)])
    with pytest.raises(LaunchError, match=r"has no openapi/v3 \(404\): give the cluster's rest_url as "
                                          r"slurmrestd's address alone"):
        SlurmRestLauncher(f"{rest.rest_url}/slurm").poll([Job(NEVER_GIVEN, tmp_path)])

    with socket.socket() as silent:  # accepts the connection and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        launcher = SlurmRestLauncher(f"http://127.0.0.1:{silent.getsockname()[1]}")
        launcher.request_timeout_s = 0.5
        started = time.monotonic()
        with pytest.raises(LaunchError, match=r"did not answer GET openapi/v3 within 0.5 s"):
            launcher.poll([Job(NEVER_GIVEN, tmp_path)])
        assert time.monotonic() - started < 5


def test_a_cluster_without_an_address_cannot_have_a_launcher():
    assert isinstance(launcher_for(SchedulerSettings(kind="slurm-rest", rest_url="http://login1:6820")),
                      SlurmRestLauncher)
    with pytest.raises(LaunchError, match="no slurmrestd address: set its rest_url"):
        launcher_for(SchedulerSettings(kind="slurm-rest"))


def test_the_jobs_properties_are_the_values_of_the_scripts_directives(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    request = _request(tmp_path / "run", cluster=presets.cluster(nodes=2, gpus_per_node=4), dp=2, tp=4)
    request = replace(request, settings=replace(request.settings, account="research", qos="high",
                                                time_limit="01:30:30"))

    job = job_properties(request, batch_script(request))

    assert job == {
        "name": request.job_name, "comment": f"workbench-run-{request.run_id}-attempt-1", "nodes": 2,
        "tasks_per_node": 1, "cpus_per_task": 4, "gres": "gpu:4", "partition": "debug", "account": "research",
        "qos": "high", "time_limit": 91, "standard_output": str(request.run_dir / "logs" / "slurm-%j.out"),
        "current_working_directory": str(request.run_dir)}
    assert set(job_environment()) <= {"PATH", "HOME", "LANG", "SLURM_CONF"}
    assert job_environment()["SLURM_CONF"] == "/etc/slurm/slurm.conf"


def test_a_directive_the_launcher_cannot_pass_on_stops_the_submission(tmp_path):
    request = _request(tmp_path / "run")
    script = batch_script(request).replace("#SBATCH --nodes=1\n", "#SBATCH --nodes=1\n#SBATCH --exclusive\n")

    with pytest.raises(LaunchError, match="#SBATCH --exclusive, which the slurm-rest launcher does not pass"):
        job_properties(request, script)


@pytest.mark.parametrize(("wait_status", "code"), [(0, 0), (3 << 8, 3), (15, 143), (9, 137), (None, None)])
def test_a_wait_status_is_read_as_the_exit_code_or_128_plus_the_signal(wait_status, code):
    assert LEGACY.exit_code({"exit_code": wait_status}) == code


@pytest.mark.django_db(transaction=True)
def test_a_command_job_is_followed_to_its_end_with_its_report_its_last_words_and_its_exit_code(rest_any, tmp_path):
    """A command run once as a job of its own (a dataset's preparation is one) through slurmrestd: what it printed
    is its report, its standard error the progress the worker reads, its exit code how it ended."""
    said = "import sys, time; print('{\"rows\": 3}'); print('encoded 1 of 2 shards', file=sys.stderr, flush=True); " \
           "time.sleep(3); print('refused: too many bad rows', file=sys.stderr); sys.exit(2)"
    request = CommandRequest(job_name=f"wb-cmd{next(_RUN_IDS)}", run_dir=tmp_path / "job",
                             command=(sys.executable, "-c", said), cpus=2,
                             settings=SchedulerSettings(kind="slurm-rest", partition="debug",
                                                        rest_url=rest_any.rest_url))
    request.run_dir.mkdir()
    owner = User.objects.create_user("follower")
    row = CheckpointConversion.objects.create(owner=owner, kind="import-hf", source="in", target="out")
    row = job_claim(CheckpointConversion, row.pk, "started")
    messages, done = [], threading.Event()

    def watch():
        while not done.is_set():
            message = CheckpointConversion.objects.get(pk=row.pk).message
            if not messages or messages[-1] != message:
                messages.append(message)
            done.wait(0.1)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        ended = follow_command(row, request, Following("check", "starting", timeout_s=120, every_s=0.5))
    finally:
        done.set()
        watcher.join()
    assert (ended.status, ended.report_line, ended.last_error) == (2, '{"rows": 3}', "refused: too many bad rows")
    job_id = CheckpointConversion.objects.get(pk=row.pk).job_id
    assert any(m.startswith(f"Slurm job {job_id} running: encoded 1 of 2 shards") for m in messages), messages
    job = rest_any.job(int(job_id))
    assert (job["JobName"], job["NumCPUs"], job["Partition"]) == (request.job_name, "2", "debug")
    # a later delivery finds the job by its name and submits nothing
    assert launcher_for(request.settings).find(request) == job_id


def test_it_speaks_the_newest_version_the_servers_description_offers(rest_any):
    # 22.05's slurmrestd is started with v0.0.38 alone; 24.11's offers v0.0.40 to v0.0.42
    assert SlurmRestLauncher(rest_any.rest_url).version == {"22.05": "v0.0.38", "24.11": "v0.0.42"}[rest_any.release]
