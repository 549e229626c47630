"""What Slurm's state leaves out, read for both Slurm launchers: a step slurmstepd killed for its memory."""
from workers.launchers import Job, JobState, JobStates
from workers.launchers.slurm_jobs import output_log, with_memory_kills

KILLED = ("slurmstepd-n1: error: StepId=7.0 exceeded memory limit (1254543360 > 1153433600), being killed\n"
          "slurmstepd-n1: error: Exceeded job memory limit\n"
          "srun: error: n1: task 0: Killed\n")


def test_a_job_whose_step_slurmstepd_killed_for_its_memory_ran_out_of_memory_and_others_are_as_slurm_said(tmp_path):
    jobs = {i: Job(i, tmp_path / i) for i in ("7", "8", "9", "10")}
    for job, text in ((jobs["7"], "step 1 loss 3.2\n" + KILLED), (jobs["8"], "a failure of its own\n"),
                      (jobs["9"], KILLED)):
        output_log(job).parent.mkdir(parents=True)
        output_log(job).write_text(text)
    states = {"7": JobState(JobStates.FAILED, 137, "NonZeroExitCode"), "8": JobState(JobStates.FAILED, 1),
              "9": JobState(JobStates.COMPLETED, 0), "10": JobState(JobStates.CANCELLED)}  # 10 wrote nothing
    found = with_memory_kills(states, jobs)
    assert found["7"] == JobState(JobStates.OUT_OF_MEMORY, 137, KILLED.splitlines()[0])
    assert {k: found[k] for k in ("8", "9", "10")} == {k: states[k] for k in ("8", "9", "10")}
