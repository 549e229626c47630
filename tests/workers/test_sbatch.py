"""What a cluster's fields put into a batch script: directives checked once more, setup lines verbatim, the command
quoted word by word; what the script records for a launch repeated later."""
import shlex
from pathlib import Path

import pytest

from trainer.contract import DatasetSpec, ParallelPlan, RunSpec, presets
from webapp import models
from workers.launchers import JobRequest, SchedulerSettings
from workers.launchers.sbatch import UnsafeScriptValue, batch_script, command_line, directives, setup_lines
from workers.launchers.slurm_jobs import started_job_id


def _cluster(**fields) -> models.Cluster:
    return models.Cluster(name="s", kind="slurm", spec=presets.cluster().to_dict(), **fields)


def test_it_writes_the_directives_of_the_fields_that_are_set():
    cluster = _cluster(partition="gpu", qos="high.v2", time_limit="1-12:00:00")
    assert directives(cluster) == ["#SBATCH --partition=gpu", "#SBATCH --qos=high.v2", "#SBATCH --time=1-12:00:00"]


@pytest.mark.parametrize("fields", [{"partition": "gpu\n#SBATCH --uid=0"}, {"account": "a b"},
                                    {"time_limit": "02:00:00\nrm -rf /"}, {"qos": "q;id"}])
def test_it_refuses_a_value_that_would_end_its_directive_even_if_it_was_stored(fields):
    with pytest.raises(UnsafeScriptValue, match="is not a Slurm"):
        directives(_cluster(**fields))


def test_it_writes_setup_lines_as_given_and_refuses_a_line_with_a_break():
    assert setup_lines(_cluster(env_setup=["module load cuda", "source $HOME/env.sh"])) == [
        "module load cuda", "source $HOME/env.sh"]
    with pytest.raises(UnsafeScriptValue, match="line 1 holds a line break"):
        setup_lines(_cluster(env_setup=["module load cuda\nid"]))


def test_it_quotes_every_word_of_the_command():
    words = ["enroot", "start", "nvcr.io/nvidia/pytorch:24.05-py3", "python", "-m", "trainer", "--spec",
             "/runs/it's here/spec.json", "$(id)"]
    line = command_line(words)
    assert shlex.split(line) == words and "'$(id)'" in line


def test_a_launch_finds_the_job_its_script_recorded_after_slurm_has_forgotten_it(tmp_path):
    spec = RunSpec(model=presets.MODELS["tiny"], plan=ParallelPlan(micro_batch=2, global_batch=2),
                   cluster=presets.local_cpu_cluster(1), dataset=DatasetSpec(path="/data.txt"),
                   output_dir=str(tmp_path))
    request = JobRequest(run_id=7, attempt=2, run_dir=Path(tmp_path), spec=spec,
                         settings=SchedulerSettings(kind="slurm", time_limit="0"))
    script = batch_script(request)
    assert '{"name":"wb-run7-a2","job_id":"%s"}' in script
    assert "#SBATCH --signal" not in script and "sleep" not in script  # a time limit of 0 is Slurm's "none"
    (tmp_path / "job.json").write_text('{"name": "wb-run7-a1", "job_id": "41"}')
    assert started_job_id(request) is None  # the attempt before's job
    (tmp_path / "job.json").write_text('{"name": "wb-run7-a2", "job_id": "42"}')
    assert started_job_id(request) == "42"


def test_an_attempt_after_a_node_failure_asks_slurm_to_avoid_the_failed_nodes_named_safely(tmp_path):
    spec = RunSpec(model=presets.MODELS["tiny"], plan=ParallelPlan(micro_batch=2, global_batch=2),
                   cluster=presets.local_cpu_cluster(1), dataset=DatasetSpec(path="/data.txt"),
                   output_dir=str(tmp_path))
    request = JobRequest(run_id=7, attempt=2, run_dir=Path(tmp_path), spec=spec,
                         settings=SchedulerSettings(kind="slurm"), exclude=("gpu-017", "gpu-101"))
    assert "#SBATCH --exclude=gpu-017,gpu-101\n" in batch_script(request)
    assert "--exclude" not in batch_script(JobRequest(run_id=7, attempt=1, run_dir=Path(tmp_path), spec=spec))
    with pytest.raises(UnsafeScriptValue, match="is not a Slurm name"):
        batch_script(JobRequest(run_id=7, attempt=2, run_dir=Path(tmp_path), spec=spec, exclude=("n1\nrm -rf /",)))
