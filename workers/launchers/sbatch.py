"""The Slurm batch script of one attempt of a run: rendered from the cluster's settings and the plan.

    #!/bin/bash
    #SBATCH --job-name=wb-run<id>-<made>-a<n>  the run (and when its row was made) and the attempt: a launch
                                          repeated after a crash looks it up
    #SBATCH --nodes=… --ntasks-per-node=1 --cpus-per-task=… [--gres=gpu:…]   from the plan and the cluster
    #SBATCH --signal=B:USR1@<seconds>     with a limit of ten minutes or more: the script asks the trainer to
                                          checkpoint and stop (its own timer does so on any limit)
    #SBATCH --partition=<partition>       a Slurm name, checked again here
    #SBATCH --account=<account>           a Slurm name
    #SBATCH --qos=<qos>                   a Slurm name
    #SBATCH --time=<time_limit>           a Slurm time
    <env_setup line 1>                    staff's shell lines, verbatim (trusted input), one a line
    ...
    srun … torchrun … -m trainer …        every word quoted with shlex.quote (the container image is one word);
                                          one torchrun per node, meeting by c10d rendezvous on the allocation's
                                          first node
    exit.json                             the step's exit code, written by the script as it ends

A command run once as a job of its own (a dataset's preparation, ``command_script``) gets the same directives,
environment and job and exit records around one line: the command, its standard output to ``report.out``.

A directive's value cannot be quoted (sbatch reads ``#SBATCH`` lines itself, not through a shell), so it is checked
instead: the same rule as when the cluster was saved, once more here, so that a value written to the database by
any other way still cannot put a line break, and with it a directive or a command of its own, into the script.
"""
import shlex
import sys
from pathlib import Path
from typing import Sequence

from trainer.contract.command import ENDPOINT_FROM_ENV, trainer_command
from trainer.contract.records import Event
from trainer.contract.runfolder import ATTEMPT_ENV, EVENTS, JOBS, LOGS, SPEC
from webapp.models.clusterfields import (RUNS_ROOT_CHARACTERS, env_setup_problems, slurm_name_problem,
                                         time_limit_problem)

from .base import REPORT, CommandRequest, JobRequest
from ..supervise import EXIT_FILE, JOB_FILE

REPO = Path(__file__).resolve().parents[2]
RDZV_PORT_BASE = 20000  # the rendezvous port is 20000 + job id mod 20000: two jobs sharing a first node differ
NODE_ADDRESS = "scontrol show node \"{node}\" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p'"
PER_NODE = ('[ "$SLURMD_NODENAME" = "$FIRST_NODE" ] && host=1 || host=0; '
            f'addr=$({NODE_ADDRESS.format(node="$SLURMD_NODENAME")}); '
            'export PET_RDZV_CONF="is_host=$host" PET_LOCAL_ADDR="${addr:-$SLURMD_NODENAME}"; exec "$@"')
MAX_SIGNAL_TIME_S = 65535  # the largest time sbatch --signal takes


class UnsafeScriptValue(ValueError):
    """A cluster field that may not be written into a batch script."""


def directives(cluster) -> list[str]:
    """The ``#SBATCH`` lines for ``cluster``'s partition, account, QOS and time limit (those that are set)."""
    lines = []
    for field, option in (("partition", "partition"), ("account", "account"), ("qos", "qos")):
        value = getattr(cluster, field)
        problem = slurm_name_problem(field, value)
        if problem:
            raise UnsafeScriptValue(problem)
        if value:
            lines.append(f"#SBATCH --{option}={value}")
    problem = time_limit_problem(cluster.time_limit)
    if problem:
        raise UnsafeScriptValue(problem)
    if cluster.time_limit:
        lines.append(f"#SBATCH --time={cluster.time_limit}")
    return lines


def setup_lines(cluster) -> list[str]:
    """The cluster's environment setup, one shell line each, as staff wrote them."""
    problems = env_setup_problems(list(cluster.env_setup))
    if problems:
        raise UnsafeScriptValue("; ".join(problems))
    return list(cluster.env_setup)


def command_line(words: Sequence[str]) -> str:
    """One shell line running ``words`` exactly (paths, the container image, the trainer's arguments)."""
    return shlex.join(words)


def time_limit_s(value: str) -> int:
    """Seconds of a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS), already checked."""
    days, _, clock = value.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:  # after a day the first part is hours
        hours, minutes, seconds = (parts + [0, 0])[:3]
    else:
        hours, minutes, seconds = ([0] * (3 - len(parts)) + parts) if len(parts) == 3 else \
            (0, parts[0], parts[1] if len(parts) > 1 else 0)
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


# Slurm's signal comes at the controller's periodic check, up to a minute before it is due: on a shorter limit that
# minute is much of the attempt (it can come while the trainer is still starting), so the script's own timer alone
# asks for the stop there.
SLURM_SIGNAL_MIN_LIMIT_S = 600


def signal_before_limit_s(time_limit: str, wanted_s: int) -> int:
    """How long before the limit the checkpoint signal comes: as the cluster asks, leaving at least a tenth of the
    limit (and 10 s) to train."""
    limit = time_limit_s(time_limit)
    return max(1, min(wanted_s, limit - max(10, limit // 10), MAX_SIGNAL_TIME_S))


def job_shape(request: JobRequest) -> tuple[int, int]:
    """(nodes, ranks per node) for the plan on the cluster: whole nodes of the cluster's GPUs per node."""
    world, per_node = request.spec.plan.world_size, request.spec.cluster.gpus_per_node
    nodes = -(-world // per_node)
    if world % nodes:
        raise UnsafeScriptValue(f"the plan's {world} ranks do not fill {nodes} nodes of {per_node} evenly: use a "
                                f"world size that is a multiple of {per_node}, or at most {per_node}")
    return nodes, world // nodes


def output_pattern(run_dir: Path) -> str:
    """Where Slurm writes the batch script's output (given to sbatch as an argument, never as a directive)."""
    return str(run_dir / LOGS / "slurm-%j.out")


def batch_script(request: JobRequest, python: str = sys.executable) -> str:
    settings, run_dir = request.settings, request.run_dir
    nodes, per_node = job_shape(request)
    on_gpus = request.spec.cluster.gpu.name != "cpu"
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={request.job_name}",
             f"#SBATCH --comment=workbench-run-{request.run_id}-attempt-{request.attempt}",
             f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1",
             # one torchrun a node starts the node's ranks: each rank wants a CPU of its own (more on GPU nodes)
             f"#SBATCH --cpus-per-task={per_node}",
             *([f"#SBATCH --gres=gpu:{per_node}"] if on_gpus else []),
             # the workbench starts another attempt itself, from the newest checkpoint, as a new job
             "#SBATCH --no-requeue",
             *directives(settings), *_exclusion(request.exclude)]
    _check_folder(run_dir)
    timer = []
    if settings.time_limit and time_limit_s(settings.time_limit):  # 0 is Slurm's "no limit"
        limit, before = time_limit_s(settings.time_limit), signal_before_limit_s(settings.time_limit,
                                                                                   settings.stop_before_limit_s)
        if limit >= SLURM_SIGNAL_MIN_LIMIT_S:
            lines.append(f"#SBATCH --signal=B:USR1@{before}")
        # Slurm sends its signal at its periodic check, up to a minute early, and slurmrestd cannot ask for it to
        # reach the batch shell at all: the script keeps its own time as well.
        timer = [f"( sleep {limit - before} && kill -USR1 $$ ) &", "timer=$!"]
    args = ["--spec", str(run_dir / SPEC), *(["--resume"] if request.resume else [])]
    interpreter = "python" if settings.container_image else python
    # a world of one needs no torchrun: srun starts the trainer itself, a second sooner and with one process less
    alone = nodes == per_node == 1
    words = trainer_command(args, nproc_per_node=per_node, nodes=nodes, endpoint=ENDPOINT_FROM_ENV, srun=not alone,
                            launcher_for_one=not alone, python=interpreter)
    if alone:
        words = ["srun", "--nodes=1", "--ntasks-per-node=1", *words]
    python_at = words.index(interpreter)
    srun, program = [words[0], "--kill-on-bad-exit=1", *words[1:python_at]], words[python_at:]
    if settings.container_image:
        mounts = ",".join(f"{p}:{p}" for p in (str(REPO), str(run_dir.parent)))
        srun += [f"--container-image={settings.container_image}", f"--container-mounts={mounts}",
                 f"--container-workdir={run_dir}"]
    step = f"{command_line(srun)} {command_line(program)}" if alone else \
        f'{command_line(srun)} bash -c "$per_node" node {command_line(program)}'
    rendezvous = [] if alone else [
        "# torchrun on every node meets the others at the first node of the allocation. That node hosts the",
        "# rendezvous and every node publishes its own address: a node's host name may resolve to the loopback.",
        'export FIRST_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"first_addr=$({NODE_ADDRESS.format(node='$FIRST_NODE')})",
        f'export PET_RDZV_ENDPOINT="${{first_addr:-$FIRST_NODE}}:$(( {RDZV_PORT_BASE} + SLURM_JOB_ID % 20000 ))"',
        'export PET_RDZV_ID="$SLURM_JOB_ID"',
        f"per_node={shlex.quote(PER_NODE)}"]
    run = shlex.quote(str(run_dir))
    lines += [
        *_environment(settings),
        *rendezvous,
        f"run_dir={run}",
        *_job_record(request.job_name),
        f"export {ATTEMPT_ENV}={int(request.attempt)}",
        *_job_event(Event.JOB_STARTED, request.attempt),
        "time_limit_near() {",
        '  [ -n "$stopping" ] && return; stopping=1  # Slurm\'s signal and the script\'s own timer: the first counts',
        f"  printf '{{\"event\":\"{Event.TIME_LIMIT_NEAR}\",\"time\":%s,\"rank\":-1}}\\n' \"$(date +%s)\" "
        f'>> "$run_dir/{EVENTS}"',
        "  # SIGTERM to the tasks (srun itself would kill them at once): the trainer saves at the end of its step and",
        "  # exits. The trainer's step is the script's only srun, step 0.",
        '  scancel --signal=TERM "$SLURM_JOB_ID.0"',
        "}",
        "trap time_limit_near USR1",
        *timer,
        f"{step} &",
        "step=$!",
        "# wait returns early when the trap runs: wait again until the step has really ended",
        'while :; do wait "$step"; code=$?; kill -0 "$step" 2>/dev/null || break; done',
        *(['kill "$timer" 2>/dev/null'] if timer else []),
        *_job_event(Event.JOB_ENDED, request.attempt, exit_code='"$code"'),
        *_exit_record(),
    ]
    return "\n".join(lines) + "\n"


def _exclusion(nodes: tuple[str, ...]) -> list[str]:
    """``#SBATCH --exclude`` for the nodes earlier attempts failed on (names as Slurm gave them, checked again)."""
    for node in nodes:
        problem = slurm_name_problem("excluded node", node)
        if problem:
            raise UnsafeScriptValue(problem)
    return [f"#SBATCH --exclude={','.join(nodes)}"] if nodes else []


def _check_folder(run_dir: Path) -> None:
    problem = next((f"the job folder {str(run_dir)!r} holds {why}" for character, why in
                    RUNS_ROOT_CHARACTERS.items() if character in str(run_dir)), None)
    if problem:  # checked when the runs root was saved; a folder that came another way is checked here
        raise UnsafeScriptValue(problem)


def _environment(settings) -> list[str]:
    return [
        "# The jobs' tasks get the environment this script has, not the submitter's (sbatch was given a short list).",
        "export SLURM_EXPORT_ENV=ALL",
        "unset SLURM_JWT  # a slurmrestd token never reaches the job's tasks (srun fails with one)",
        f"export PYTHONPATH={shlex.quote(str(REPO))}${{PYTHONPATH:+:$PYTHONPATH}} PYTHONUNBUFFERED=1",
        "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}",
        "# The cluster's environment setup",
        *setup_lines(settings)]


def _job_record(name: str) -> list[str]:
    return ["# the job's name and id in its folder: a submission repeated after Slurm forgot the job still finds it",
            f'printf \'{{"name":"{name}","job_id":"%s"}}\\n\' "$SLURM_JOB_ID" > "$run_dir/.{JOB_FILE}.tmp" '
            f'&& mv "$run_dir/.{JOB_FILE}.tmp" "$run_dir/{JOB_FILE}"']


def _job_event(kind: str, attempt: int, exit_code: str = "") -> list[str]:
    """A jobs.jsonl line, timed to the nanosecond: the job began on its allocation, or is about to leave it."""
    fields = f'"event":"{kind}","rank":-1,"attempt":{int(attempt)},"job_id":"%s"'
    values = ['"$SLURM_JOB_ID"']
    if exit_code:
        fields, values = fields + ',"exit_code":%d', values + [exit_code]
    return [f"printf '{{{fields},\"time\":%s}}\\n' {' '.join(values)} \"$(date +%s.%N)\" >> \"$run_dir/{JOBS}\""]


def _exit_record() -> list[str]:
    return [f'printf \'{{"job_id":"%s","exit_code":%d,"ended":%s}}\\n\' "$SLURM_JOB_ID" "$code" "$(date +%s)" '
            f'> "$run_dir/.{EXIT_FILE}.tmp" && mv "$run_dir/.{EXIT_FILE}.tmp" "$run_dir/{EXIT_FILE}"',
            'exit "$code"']


def command_script(request: CommandRequest, python: str = sys.executable) -> str:
    """The batch script of a command run once on one node (a dataset's preparation): its standard output to
    REPORT in the job's folder, its standard error to Slurm's output file (the progress a worker reads), its exit
    code recorded as a run's is. The cluster's time limit applies; nothing is signalled before it."""
    settings, run_dir = request.settings, request.run_dir
    _check_folder(run_dir)
    words = list(request.command)
    if settings.container_image:
        mounts = ",".join(f"{p}:{p}" for p in dict.fromkeys((str(REPO), str(run_dir), *request.mounts)))
        words = ["srun", "--ntasks=1", f"--container-image={settings.container_image}",
                 f"--container-mounts={mounts}", f"--container-workdir={run_dir}",
                 *(["python", *words[1:]] if words[0] == python else words)]
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={request.job_name}",
             f"#SBATCH --comment=workbench-{request.job_name}",
             "#SBATCH --nodes=1",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --cpus-per-task={request.cpus}",
             "#SBATCH --no-requeue",
             *directives(settings),
             *_environment(settings),
             f"run_dir={shlex.quote(str(run_dir))}",
             *_job_record(request.job_name),
             f'{command_line(words)} > "$run_dir/{REPORT}"',
             "code=$?",
             *_exit_record()]
    return "\n".join(lines) + "\n"
