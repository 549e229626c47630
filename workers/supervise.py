"""Runs a job detached from the worker and records how it ended.

    python -m workers.supervise RUN_DIR JOB_NAME [--stdout FILE] -- COMMAND...

The parent writes RUN_DIR/job.json (the job's name and id: a launch repeated after a crash, or delivered again at
once, finds the job there), prints the supervisor's job id (``<pid>:<start time>``) and returns; the supervisor (a
new session, so the worker's restart or Ctrl-C does not touch it) runs COMMAND with its output in
RUN_DIR/logs/launcher.log (its standard output in FILE instead, when given: a command's report) and writes
RUN_DIR/exit.json when it ends. As a Slurm batch script does, it marks the job's start and end in RUN_DIR/jobs.jsonl
(job_started, job_ended, with the attempt the launcher gave in WORKBENCH_ATTEMPT). SIGTERM to the session reaches
every rank.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainer.contract.records import Event, event
from trainer.contract.runfolder import ATTEMPT_ENV, JOBS, LOGS, append_jsonl, write_json_atomic

EXIT_FILE = "exit.json"
JOB_FILE = "job.json"
LOG_FILE = "launcher.log"


def job_id_of(pid: int) -> str:
    """``<pid>:<start time>`` (field 22 of /proc/<pid>/stat), as the launcher names the job (see local.py): a pid
    the kernel gives again later is another job."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return f"{pid}:{stat.rpartition(')')[2].split()[19]}"


def _supervise(run_dir: Path, command: list[str], stdout: Path | None = None) -> None:
    job_id = job_id_of(os.getpid())
    attempt = int(os.environ.get(ATTEMPT_ENV) or 0)
    append_jsonl(run_dir / JOBS, event(Event.JOB_STARTED, -1, attempt=attempt, job_id=job_id))
    log_path = run_dir / LOGS / LOG_FILE
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    # Survive the SIGTERM sent to the whole session so that the exit is recorded once the ranks have saved and
    # stopped; a Python handler (unlike SIG_IGN) is not inherited by the command.
    signal.signal(signal.SIGTERM, lambda *_: None)
    with open(log_path, "ab") as log, open(stdout or os.devnull, "wb") as out:
        try:
            code = subprocess.call(command, stdout=out if stdout else log, stderr=log if stdout else subprocess.STDOUT,
                                   cwd=run_dir)
        except OSError as exc:
            log.write(f"could not start {command[0]}: {exc}\n".encode())
            code = 127
    append_jsonl(run_dir / JOBS, event(Event.JOB_ENDED, -1, attempt=attempt, job_id=job_id, exit_code=code))
    write_json_atomic(run_dir / EXIT_FILE, {"job_id": job_id, "exit_code": code, "started": started,
                                            "ended": time.time()})


def main(argv: list[str]) -> int:
    stdout = None
    if len(argv) > 3 and argv[2] == "--stdout":
        stdout, argv = Path(argv[3]), argv[:2] + argv[4:]
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m workers.supervise RUN_DIR JOB_NAME [--stdout FILE] -- COMMAND...", file=sys.stderr)
        return 2
    run_dir, name, _, *command = argv
    pid = os.fork()
    if pid:
        # the child's id, read while it is still ours to read: ended or not, it stays a zombie (its start time kept)
        # until this parent exits, so a job that ends at once has an id all the same. Its record is written before
        # the launcher hears the id, so that a launch delivered again at once finds the job instead of starting one.
        job_id = job_id_of(pid)
        write_json_atomic(Path(run_dir) / JOB_FILE, {"name": name, "job_id": job_id})
        print(job_id, flush=True)
        return 0
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        _supervise(Path(run_dir), command, stdout)
    finally:
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
