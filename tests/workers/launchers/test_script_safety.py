"""What the user's and staff's words can do to a Slurm batch script: nothing they were not meant to.

Names and cluster fields full of shell and Slurm syntax (``;``, ``$(…)``, backticks, quotes, line breaks, ``#SBATCH``
lines, ``%``, spaces, other scripts' letters) are either refused by the cluster's own validation, naming the field,
or written into a script that the real ``sbatch --test-only`` accepts and whose ``#SBATCH`` lines, read the way
sbatch reads them, are exactly the ones the fields ask for. A few of the nastiest that are accepted (they can only be
in the runs root's path, or in staff's setup lines, which are shell by design) are submitted for real as a one-step
run: the job trains that step, and none of the commands hidden in the path ran.
"""
import itertools
import os
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings
from hypothesis import HealthCheck, event, example, given, settings as hypothesis_settings, strategies as st

from tests.trainer.launch import tiny_spec
from trainer.contract import DatasetSpec, presets
from trainer.contract.presets import DEMO_TEXT
from trainer.contract.runfolder import METRICS, SPEC, read_json, read_jsonl, write_json_atomic
from webapp.models import Cluster
from webapp.models.clusterfields import SLURM_NAME, SLURM_TIME
from workers.launchers import Job, JobRequest, SlurmCLILauncher
from workers.launchers.sbatch import UnsafeScriptValue, batch_script, output_pattern
from workers.launchers.slurm_cli import EXPORTED
from workers.launching import scheduler_settings
from workers.supervise import EXIT_FILE

# Job names hold the run's id, and the session's cluster runs other tests' jobs too: ids no test database reaches.
_RUN_IDS = itertools.count(20_000_000 + os.getpid() % 10_000 * 1000)
DIRECTIVE_FIELDS = ("partition", "account", "qos", "time_limit")
INJECTED = "INJECTED"  # every command hidden in a value below would leave a file of this name
# Pieces a value is made of: what ends a directive or a shell word, starts a command or a directive, or is not ASCII.
PIECES = ["; touch INJECTED;", "$(touch INJECTED)", "`touch INJECTED`", "'", '"', "\n", "\r\n", "\n#SBATCH --uid=0\n",
          "#SBATCH --uid=0", " ", "\t", "#", "%x", "%j", "\\", "-", ".", "..", "/", "*", "ü", "訓練", "\u202e", "٣",
          "\x00", "|", "&", ">", "<"]
nasty = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=3)), min_size=1, max_size=4).map("".join)
slurm_names = st.from_regex(SLURM_NAME, fullmatch=True)
IMAGES = ["nvcr.io/nvidia/pytorch:24.05-py3", "registry.example.org:5000/team/trainer@sha256:" + "ab" * 32]
SETUP_LINES = ["module load cuda", "export GLOO_SOCKET_IFNAME=wb0", "#SBATCH --uid=0", "echo \"it's $(hostname)\""]
cluster_fields = st.fixed_dictionaries({}, optional={
    "name": nasty,
    "partition": st.one_of(st.just("debug"), slurm_names, nasty),
    "account": st.one_of(slurm_names, nasty),
    "qos": st.one_of(slurm_names, nasty),
    "time_limit": st.one_of(st.from_regex(SLURM_TIME, fullmatch=True), nasty),
    "container_image": st.one_of(st.sampled_from(IMAGES), nasty),
    "env_setup": st.lists(st.one_of(st.sampled_from(SETUP_LINES), nasty), max_size=3),
    "runs_root": nasty,  # a folder of that name (or path) under the runs roots' folder
})


def sbatch_directives(script: str) -> list[str]:
    """The ``#SBATCH`` lines sbatch reads: those before the first line that is neither blank nor a comment (lines
    end at ``\\n`` only, as sbatch reads them)."""
    found = []
    for line in script.split("\n")[1:]:  # after the #! line
        if line.startswith("#SBATCH"):
            found.append(line)
        elif line.strip() and not line.lstrip().startswith("#"):
            break
    return found


def step_command(script: str) -> str:
    """The srun command line of the script's job step, which may span lines (a quoted path may hold line breaks):
    the first srun after the trap line, up to the ``&`` that puts it in the background. Nothing a user or staff gave
    is written between the trap and the step."""
    after_trap = script[script.index("\ntrap time_limit_near USR1\n"):]
    return after_trap[after_trap.index("\nsrun ") + 1:after_trap.index(" &\nstep=$!\n")]


def expected_directives(request: JobRequest) -> list[str]:
    """Those of the run and its shape, and one for each scheduler field that is set, with its value as it is."""
    settings = request.settings
    fixed = [f"#SBATCH --job-name={request.job_name}",
             f"#SBATCH --comment=workbench-run-{request.run_id}-attempt-{request.attempt}", "#SBATCH --nodes=1",
             "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=1", "#SBATCH --no-requeue"]
    given = [f"#SBATCH --{option}={getattr(settings, field)}" for field, option in
             (("partition", "partition"), ("account", "account"), ("qos", "qos"), ("time_limit", "time"))
             if getattr(settings, field)]
    return fixed + given


@pytest.fixture(scope="session")
def one_rank_spec(tmp_path_factory):
    """A one-step run of a two-layer model on one CPU rank of a one-node Slurm cluster, its corpus prepared once."""
    data = tmp_path_factory.mktemp("script-safety-data")
    corpus = data / "corpus.txt"
    corpus.write_text(DEMO_TEXT.read_text()[:60_000])
    return tiny_spec(data / "unused", DatasetSpec(path=str(corpus), prepared_dir=str(data / "prepared")), steps=1,
                     layers=2, global_batch=4, cluster=presets.cluster("cpu", nodes=1, gpus_per_node=1))


def _cluster(**fields) -> Cluster:
    fields.setdefault("name", "nasty")
    return Cluster(kind="slurm", spec=presets.cluster("cpu", nodes=1, gpus_per_node=1).to_dict(), **fields)


def _refusals(cluster: Cluster, runs_roots: Path) -> set[str]:
    """The fields the cluster's own validation (as when staff save it) refuses; the database is not needed."""
    with override_settings(WORKBENCH={"RUNS_ROOTS": [runs_roots]}):
        try:
            cluster.full_clean(validate_unique=False, validate_constraints=False)
        except ValidationError as exc:
            return set(exc.message_dict)
    return set()


def _request(cluster: Cluster, spec, runs_root: Path) -> JobRequest:
    """The first attempt of a run in ``runs_root`` on ``cluster``, with the scheduler settings a worker reads."""
    run_id = next(_RUN_IDS)
    run_dir = runs_root / str(run_id)
    return JobRequest(run_id=run_id, attempt=1, run_dir=run_dir, spec=spec.replace(output_dir=str(run_dir)),
                      settings=scheduler_settings(cluster))


def _write_script(request: JobRequest) -> Path:
    request.run_dir.mkdir(parents=True, exist_ok=True)
    path = request.run_dir / "job.sbatch"
    path.write_text(batch_script(request))
    return path


def _test_only(slurm_cluster, request: JobRequest, script: Path):
    """sbatch --test-only with what the launcher gives sbatch besides the script: no job is made, nothing runs."""
    return slurm_cluster.run(["sbatch", "--test-only", f"--export={EXPORTED}",
                              f"--output={output_pattern(request.run_dir)}", f"--chdir={request.run_dir}",
                              str(script)], check=False)


@hypothesis_settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=cluster_fields, run_name=nasty)
@example(fields={"partition": "gpu\n#SBATCH --uid=0"}, run_name="x")
@example(fields={"account": "$(touch INJECTED)", "qos": "`touch INJECTED`"}, run_name="; touch INJECTED")
@example(fields={"time_limit": "02:00:00\ntouch INJECTED"}, run_name="x")
@example(fields={"container_image": "nvcr.io/x:1 $(touch INJECTED)"}, run_name="x")
@example(fields={"env_setup": ["module load cuda", "ok\n#SBATCH --uid=0"]}, run_name="x")
@example(fields={"env_setup": ["#SBATCH --uid=0"], "partition": "debug", "time_limit": "1-00:00"}, run_name="x")
@example(fields={"runs_root": "r%x 50%j"}, run_name="x")
@example(fields={"runs_root": "dos\r\nline"}, run_name="x")
@example(fields={"runs_root": "it's $(touch INJECTED)\n#SBATCH --uid=0 `touch INJECTED` 訓練"},
         run_name="a\n#SBATCH --uid=0")
def test_every_value_is_refused_by_its_field_or_reaches_sbatch_exactly_as_given(
        fields, run_name, slurm_cluster, slurm_cluster_24, one_rank_spec, tmp_path_factory):
    base = tmp_path_factory.getbasetemp() / "script-safety" / "roots"
    base.mkdir(parents=True, exist_ok=True)
    runs_root = base / fields.get("runs_root", "")
    given = {**fields, "runs_root": str(runs_root)}
    cluster = _cluster(**given)
    refused = _refusals(cluster, base)
    event(f"refused: {', '.join(sorted(refused))}" if refused else "accepted")

    # Each refusal names the field whose value it is about, whatever the other fields hold.
    alone = {field: _refusals(_cluster(**{field: value}), base) for field, value in given.items()}
    assert all(found <= {field} for field, found in alone.items()), alone
    assert refused == {field for field, found in alone.items() if found}
    spec = one_rank_spec.replace(name=run_name)
    request = _request(cluster, spec, runs_root)
    if refused & {*DIRECTIVE_FIELDS, "env_setup"}:
        # Stored by some other way than the cluster's validation, the script refuses them all the same.
        with pytest.raises(UnsafeScriptValue):
            batch_script(request)
        return
    if refused:
        return  # an image or a runs root the cluster refused is never written; what the script quotes is below

    script = batch_script(request)
    # No name reaches the script: the run's name lives in spec.json only, and the cluster's name nowhere.
    assert script == batch_script(replace(request, spec=request.spec.replace(name="plain")))
    directives = sbatch_directives(script)
    assert sorted(line for line in directives if not line.startswith("#SBATCH --signal=")) == \
        sorted(expected_directives(request))
    assert all(re.fullmatch(r"#SBATCH --signal=B:USR1@[0-9]+", line) for line in directives
               if line.startswith("#SBATCH --signal="))
    lines = script.split("\n")
    assert set(cluster.env_setup) <= set(lines)  # staff's lines, verbatim (and, above, not one of the directives)
    words = shlex.split(step_command(script))
    assert f"{request.run_dir}/{SPEC}" in words  # the run folder is one word, whatever it holds
    if cluster.container_image:
        assert f"--container-image={cluster.container_image}" in words

    script_file = _write_script(request)
    for slurm in (slurm_cluster, slurm_cluster_24):  # each release's sbatch reads the script as it is
        answer = _test_only(slurm, request, script_file)
        if cluster.partition not in ("", "debug"):  # a Slurm name, but not one of the test cluster's partitions
            assert answer.returncode != 0 and f"invalid partition specified: {cluster.partition}" in answer.stderr
        else:
            assert answer.returncode == 0, (slurm.release, answer.stderr)
            assert "to start at" in answer.stderr


def test_sbatch_reads_directives_only_before_the_first_command(slurm_cluster, tmp_path):
    """What the setup lines' safety rests on, seen on the real sbatch: the same lines are directives above the first
    command and comments below it."""
    injected = "#SBATCH --uid=65534\n#SBATCH --job-name=injected\n"
    ids = {}
    for where, script in (("above", f"#!/bin/bash\n{injected}true\n"), ("below", f"#!/bin/bash\ntrue\n{injected}")):
        (tmp_path / where).write_text(script)
        # no --job-name here: the command line's options win over the script's (the name is the script's file's)
        ids[where] = slurm_cluster.sbatch("--hold", f"--chdir={tmp_path}", str(tmp_path / where))
    try:
        jobs = {where: slurm_cluster.job(job_id) for where, job_id in ids.items()}
    finally:
        slurm_cluster.run(["scancel", *map(str, ids.values())])
    assert (jobs["above"]["JobName"], jobs["above"]["UserId"]) == ("injected", "nobody(65534)")
    assert (jobs["below"]["JobName"], jobs["below"]["UserId"]) == ("below", "root(0)")


@pytest.mark.parametrize("folder", ["runs%x", "50%", "back\\slash", "dos\r\nline", "nul\x00"])
def test_a_runs_root_that_slurm_or_a_path_cannot_take_as_it_is_is_refused_by_name(folder, tmp_path):
    assert _refusals(_cluster(runs_root=str(tmp_path / folder)), tmp_path) == {"runs_root"}


def test_sbatch_rewrites_percent_signs_and_backslashes_in_an_output_path(slurm_cluster, tmp_path):
    """Why a runs root may hold neither: the run folder is part of the output file name sbatch is given, in which
    ``%x`` becomes the job's name and a backslash turns every replacement off (and is dropped)."""
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\ntrue\n")
    for folder in ("out%x", "outmoved", "back\\slash", "backslash"):
        (tmp_path / folder).mkdir()
    ids = [slurm_cluster.sbatch("--job-name=moved", f"--output={tmp_path}/{folder}/slurm-%j.out",
                                f"--chdir={tmp_path}", str(script)) for folder in ("out%x", "back\\slash")]
    for job_id in ids:
        assert slurm_cluster.wait_for_job(job_id)["JobState"] == "COMPLETED"
    assert [p.name for p in (tmp_path / "outmoved").iterdir()] == [f"slurm-{ids[0]}.out"]
    assert [p.name for p in (tmp_path / "backslash").iterdir()] == ["slurm-%j.out"]
    assert not [*(tmp_path / "out%x").iterdir(), *(tmp_path / "back\\slash").iterdir()]


# Accepted values that carry commands and directives: only a path (the runs root) can hold them; staff's setup lines
# add directive lines verbatim, and one line whose effect is meant, so that the test sees the setup did run.
RUNS_ROOTS = {
    "command substitution and backticks": "runs $(touch {marker}) `touch {marker}`",
    "quotes and semicolons": "it's \"quoted\"; touch {marker}; echo '",
    "directives on lines of their own": "runs\n#SBATCH --uid=65534\n#SBATCH --job-name=injected\n$(touch {marker})",
    "spaces and other scripts": "Läufe 訓練 \u202e\t٣ x",
}
STAFF_LINES = ["export GLOO_SOCKET_IFNAME=wb0", "#SBATCH --uid=0", "#SBATCH --uid=65534",
               "#SBATCH --job-name=injected", "#SBATCH --partition=nowhere",
               'printf "%s\\n" "$SLURM_JOB_NAME" "$(id -u)" > setup-ran']


@pytest.mark.slow
@pytest.mark.parametrize("runs_root", RUNS_ROOTS.values(), ids=RUNS_ROOTS.keys())
def test_a_one_step_run_in_a_nasty_folder_trains_and_runs_nothing_else(runs_root, slurm_env, one_rank_spec, tmp_path,
                                                                        settings):
    marker = tmp_path / INJECTED
    root = tmp_path / runs_root.format(marker=marker)
    settings.WORKBENCH = {**settings.WORKBENCH, "RUNS_ROOTS": [tmp_path]}
    cluster = _cluster(partition=slurm_env.partition, env_setup=STAFF_LINES, runs_root=str(root))
    cluster.full_clean(validate_unique=False, validate_constraints=False)  # accepted as staff would save it
    request = _request(cluster, one_rank_spec.replace(name="x'; touch INJECTED #"), root)
    request.run_dir.mkdir(parents=True)
    write_json_atomic(request.run_dir / SPEC, request.spec.to_dict())

    launcher = SlurmCLILauncher()
    job = Job(launcher.submit(request).job_id, request.run_dir)
    fields = slurm_env.wait_for_job(int(job.job_id), timeout=180)

    [output] = launcher.log_paths(job)
    assert fields["JobState"] == "COMPLETED", output.read_text(errors="replace")[-3000:]
    assert (fields["JobName"], fields["UserId"], fields["Partition"]) == (request.job_name, "root(0)", "debug")
    assert output.exists()  # where the launcher says it is: sbatch took the folder as it is
    assert [r["step"] for _, r in read_jsonl(request.run_dir / METRICS) if "loss" in r] == [1]
    assert read_json(request.run_dir / EXIT_FILE)["exit_code"] == 0
    assert (request.run_dir / "setup-ran").read_text() == f"{request.job_name}\n0\n"  # staff's line ran, as root
    assert not [p for p in tmp_path.rglob(f"{INJECTED}*") if p.is_file()], "a command hidden in a path ran"
