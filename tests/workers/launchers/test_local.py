"""The local launcher runs a command once as a job of its own (a ``CommandRequest``: a preparation, an evaluation,
a conversion), detached from the worker as a run's ranks are: found again by its name, its report on its standard
output, its progress on its standard error, its exit code recorded as it ends."""
import sys
import time
from datetime import datetime, timedelta, timezone

from workers.launchers import (REPORT, CommandRequest, Job, JobRequest, JobStates, LocalLauncher, SchedulerSettings,
                               row_stamp)

SAYS = ("import os, sys; print('{\"rows\": 3}'); print('encoded 1 of 2 shards', file=sys.stderr); "
        "print('refused: ' + os.environ['WHY'], file=sys.stderr); sys.exit(2)")


def _ended(launcher: LocalLauncher, job: Job, seconds: float = 60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state = launcher.poll([job])[job.job_id]
        if not state.alive:
            return state
        time.sleep(0.1)
    raise AssertionError(f"job {job.job_id} still running after {seconds} s")


def test_it_runs_a_command_request_to_its_end_with_its_report_its_last_words_and_its_exit_code(tmp_path):
    launcher = LocalLauncher()
    request = CommandRequest(job_name="wb-prep7-20260102030405000000", run_dir=tmp_path / "job",
                             command=(sys.executable, "-c", SAYS), settings=SchedulerSettings(),
                             env={"WHY": "too many bad rows"})
    assert launcher.find(request) is None
    job = Job(launcher.submit(request).job_id, request.run_dir)
    assert launcher.find(request) == job.job_id  # a later delivery follows this job and starts none

    state = _ended(launcher, job)
    assert (state.state, state.exit_code) == (JobStates.FAILED, 2)
    assert (request.run_dir / REPORT).read_text() == '{"rows": 3}\n'
    said = launcher.log_paths(job)[0].read_text().splitlines()
    assert said == ["encoded 1 of 2 shards", "refused: too many bad rows"]


def test_a_job_of_another_workbenchs_row_with_the_same_id_is_not_adopted(tmp_path):
    """Two databases (a second workbench on the same runs root, a restored one) each have a run 7: their rows were
    made at different times, so their jobs' names differ and neither finds the other's job."""
    made = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    ours, theirs = (JobRequest(run_id=7, attempt=1, run_dir=tmp_path / "7", spec=None, made=row_stamp(when))
                    for when in (made, made + timedelta(microseconds=1)))
    assert ours.job_name != theirs.job_name and ours.job_name.startswith("wb-run7-")
    launcher = LocalLauncher()
    command = CommandRequest(job_name=theirs.job_name, run_dir=theirs.run_dir, command=(sys.executable, "-c", ""),
                             settings=SchedulerSettings())
    job = Job(launcher.submit(command).job_id, command.run_dir)
    _ended(launcher, job)
    assert launcher.find(theirs) == job.job_id and launcher.find(ours) is None
