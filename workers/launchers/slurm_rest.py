"""Slurm through slurmrestd (REST API v0.0.38 to v0.0.42: Slurm 22.05 to 25.11), for workers that do not run on a
login node.

    version  GET  /openapi/v3   once a server: the newest API version both sides speak (slurm_rest_versions)

    submit   POST job/submit    the batch script (stored in the run folder, as for sbatch) and the job's properties
    find     GET  jobs          the job named for the run and the attempt (a launch repeated after a crash)
    poll     GET  jobs          one request for every job; a job no longer listed has gone
    cancel   DELETE job/<id>    SIGTERM, SIGKILL after Slurm's KillWait

slurmrestd ignores a script's ``#SBATCH`` lines, so the job's properties go in the request: they are read from those
very lines (``job_properties``), so that both launchers submit the same job; each version writes them its own way. The token is the worker's: SLURM_JWT
(what ``scontrol token`` prints) for the user SLURM_JWT_USER, or else the user the worker runs as.
"""
import getpass
import http.client
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from .base import Job, JobState, JobStates, LaunchError, StartedJob
from .sbatch import output_pattern, time_limit_s
from .slurm_jobs import (SlurmRequest, forgotten_job_state, output_log, recorded_exit_code, started_job_id,
                         with_failed_nodes, with_memory_kills, write_batch_script)
from .slurm_accounting import JobRecord
from .slurm_rest_versions import LEGACY, OPENAPI_PATH, Dialect, chosen_version, dialect, offered_versions
from .slurm_states import job_state

# What a job's environment starts with (slurmrestd wants one; the script sets the rest). The worker's own environment
# (its database URL, its secret key, its token) never reaches a job.
ENVIRONMENT = ("PATH", "HOME", "LANG", "SLURM_CONF")
# The script's #SBATCH options as slurmrestd's job fields (v0.0.38's names: slurm_rest_versions renames for later).
FIELDS = {"job-name": "name", "comment": "comment", "nodes": "nodes", "ntasks-per-node": "tasks_per_node",
          "cpus-per-task": "cpus_per_task", "gres": "gres", "partition": "partition", "account": "account",
          "qos": "qos", "time": "time_limit", "exclude": "excluded_nodes"}
# A node in one of these states is not to be counted on (slurmrestd's words for them, in any version)
DOWN_NODE_STATES = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING"})
COUNTS = {"nodes", "tasks_per_node", "cpus_per_task"}
# Options of the script slurmrestd cannot take. --signal: "B:USR1@…" (to the batch shell) is refused, and a signal to
# the steps would reach torchrun, not the script's handler; the script keeps its own timer to the time limit
# instead. --no-requeue: "requeue": false is accepted and dropped (Requeue=1), so the job keeps the cluster's default.
NOT_PASSED = frozenset({"signal", "no-requeue"})
# Slurm's error numbers for a job that has already gone or ended: nothing is left to cancel.
ALREADY_OVER = {2017, 2021}  # ESLURM_INVALID_JOB_ID, ESLURM_ALREADY_DONE
# A token slurmctld cannot verify (expired, tampered with, signed with another key) is not a 401: slurmrestd passes
# it on, and the call it made fails with a 500 and one of these (only slurmctld's log says why): "Unspecified error"
# for what reads (GET jobs), "Zero Bytes were transmitted or received" for a submission.
UNVERIFIED_TOKEN = frozenset({-1, 5005})
# The version each server was found to speak, by address: asked once a process (again after a 404, as after an
# upgrade of the server).
_VERSIONS: dict[str, str] = {}


class SlurmRestError(LaunchError):
    """slurmrestd answered, and refused: ``error_numbers`` are Slurm's numbers for why."""

    def __init__(self, message: str, answer: dict[str, Any]):
        super().__init__(message)
        self.error_numbers = error_numbers(answer)


class NotServed(LaunchError):
    """slurmrestd lacks an optional path (the slurmdbd endpoints, where it does not load them)."""


def error_numbers(answer: dict[str, Any]) -> set[int]:
    """Slurm's numbers for the errors of an answer (v0.0.38 names them error_number or error_code)."""
    errors = answer.get("errors") if isinstance(answer.get("errors"), list) else []
    numbers = {e.get("error_number", e.get("error_code")) for e in errors if isinstance(e, dict)}
    return {n for n in numbers if isinstance(n, int)}


def sbatch_options(script: str) -> list[tuple[str, str]]:
    """(option, value) of each ``#SBATCH --option[=value]`` line, read as sbatch reads them: up to the first line
    that is neither a comment nor blank."""
    options = []
    for line in script.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith("#SBATCH --"):
            option, _, value = line.removeprefix("#SBATCH --").partition("=")
            options.append((option, value))
    return options


def job_properties(request: SlurmRequest, script: str) -> dict[str, Any]:
    """The job/submit ``job`` object in v0.0.38's names (``Dialect.submit_body`` writes it for each version): the
    values of the script's ``#SBATCH`` lines, the output file and the working folder."""
    job: dict[str, Any] = {}
    for option, value in sbatch_options(script):
        if option in NOT_PASSED:
            continue
        field = FIELDS.get(option)
        if field is None:
            raise LaunchError(f"the batch script asks for #SBATCH --{option}, which the slurm-rest launcher does not "
                              f"pass to slurmrestd: add it to workers/launchers/slurm_rest.py")
        if field == "time_limit":
            # whole minutes, rounded up: the script's own timer still fires before the limit the cluster set
            job[field] = max(1, -(-time_limit_s(value) // 60))
        else:
            job[field] = int(value) if field in COUNTS else value
    job.update(standard_output=output_pattern(request.run_dir), current_working_directory=str(request.run_dir))
    return job


def job_environment() -> dict[str, str]:
    """What a job's environment starts with: a few of the worker's variables."""
    return {name: os.environ[name] for name in ENVIRONMENT if name in os.environ}


class SlurmRestLauncher:
    kind = "slurm-rest"
    label = "Slurm job"
    start_timeout_s = 60.0  # a submit is one request, bounded by request_timeout_s
    request_timeout_s = 30.0

    def __init__(self, rest_url: str):
        if not rest_url:
            raise LaunchError("the cluster has no slurmrestd address: set its rest_url, e.g. http://login1:6820")
        self.rest_url = rest_url.rstrip("/")
        self.calls: list[list[str]] = []  # every request this launcher sent, as [method, path] (the batching is tested)

    # -- the interface

    def submit(self, request: SlurmRequest) -> StartedJob:
        path, script = write_batch_script(request)
        body = self._request("POST", "job/submit", self.dialect.submit_body(script, job_properties(request, script),
                                                                            job_environment()))
        job_id = body.get("job_id")
        if not isinstance(job_id, int):
            raise LaunchError(f"slurmrestd answered the submission without a job id: {body}")
        return StartedJob(job_id=str(job_id), command=["POST", self._url("job/submit"), str(path)], script=script)

    def find(self, request: SlurmRequest) -> str | None:
        for entry in self._jobs():
            if entry.get("name") == request.job_name:
                return str(entry["job_id"])
        return started_job_id(request)

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobState]:
        if not jobs:
            return {}
        listed = {str(entry.get("job_id")): entry for entry in self._jobs()}
        states = {job.job_id: _state(self.dialect, job, listed[job.job_id]) if job.job_id in listed else
                  forgotten_job_state(job, "Slurm no longer lists the job") for job in jobs}
        node_lists = {job_id: str(entry.get("nodes") or "") for job_id, entry in listed.items()}
        states = with_failed_nodes(states, node_lists, self._down_nodes)
        return with_memory_kills(states, {job.job_id: job for job in jobs})

    def _down_nodes(self) -> set[str]:
        """The nodes Slurm holds down, drained, failing or not responding (a job's NODE_FAIL names none)."""
        nodes = self._request("GET", "nodes").get("nodes") or []
        return {str(node.get("name")) for node in nodes if isinstance(node, dict)
                and DOWN_NODE_STATES & {str(w).upper() for w in _words(node.get("state"))}}

    def cancel(self, job: Job) -> None:
        try:
            self._request("DELETE", f"job/{job.job_id}")
        except SlurmRestError as exc:
            if not ALREADY_OVER & exc.error_numbers:
                raise

    def log_paths(self, job: Job) -> list[Path]:
        return [output_log(job)]

    def capacity(self) -> int | None:
        return None  # Slurm queues a job until its nodes are free

    def accounting(self, job_ids: list[str]) -> dict[str, JobRecord]:
        """Slurm's accounting record of each ended job, one GET slurmdb/<version>/job/<id> each: none where
        slurmrestd does not serve the slurmdbd endpoints (a 404) or speaks v0.0.38, whose shapes are not read."""
        records: dict[str, JobRecord] = {}
        if self.dialect is LEGACY:
            return records
        for job_id in job_ids:
            path = f"slurmdb/{self.version}/job/{job_id}"
            self.calls.append(["GET", path])
            try:
                answer = self._send("GET", f"{self.rest_url}/{path}", path, optional=True)
            except NotServed:
                return records
            for entry in answer.get("jobs") or []:
                if isinstance(entry, dict) and str(entry.get("job_id")) == job_id:
                    records[job_id] = self.dialect.accounting_record(entry)
        return records

    # -- the API's version

    @property
    def version(self) -> str:
        """The API version this launcher speaks to the server (asked once a process)."""
        if self.rest_url not in _VERSIONS:
            description = self._send("GET", f"{self.rest_url}/{OPENAPI_PATH}", OPENAPI_PATH)
            _VERSIONS[self.rest_url] = chosen_version(offered_versions(description), self.rest_url)
        return _VERSIONS[self.rest_url]

    @property
    def dialect(self) -> Dialect:
        return dialect(self.version)

    # -- HTTP

    def _url(self, path: str) -> str:
        return f"{self.rest_url}/slurm/{self.version}/{path}"

    def _jobs(self) -> list[dict[str, Any]]:
        jobs = self._request("GET", "jobs").get("jobs")
        if not isinstance(jobs, list):
            raise LaunchError(f"slurmrestd at {self.rest_url} answered GET jobs without a list of jobs")
        return jobs

    def _request(self, method: str, path: str, body: dict | None = None) -> dict[str, Any]:
        _credentials()  # no token: nothing is sent
        url = self._url(path)
        self.calls.append([method, path])
        return self._send(method, url, path, body)

    def _send(self, method: str, url: str, path: str, body: dict | None = None,
              optional: bool = False) -> dict[str, Any]:
        """``optional``: a path the server may lack (a 404 keeps the version it was asked in)."""
        headers = {**_credentials(), "Accept": "application/json"}
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout_s) as response:
                text = response.read().decode(errors="replace")
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            if optional and error.code == 404:
                raise NotServed(f"slurmrestd at {self.rest_url} does not serve {path}") from None
            raise self._refused(method, path, error.code, text) from None
        except (OSError, http.client.HTTPException) as error:  # refused, unreachable, timed out, cut off
            raise self._unanswered(method, path, error) from None
        answer = _json(text)
        if answer is None:
            raise LaunchError(f"slurmrestd at {self.rest_url} answered {method} {path} with something other than "
                              f"JSON: {text[:200]!r}")
        if answer.get("errors"):
            raise SlurmRestError(f"slurmrestd refused {method} {path}: {_errors(answer)}", answer)
        return answer

    def _unanswered(self, method: str, path: str, error: Exception) -> LaunchError:
        reason = error.reason if isinstance(error, urllib.error.URLError) else error
        what = (f"did not answer {method} {path} within {self.request_timeout_s:g} s"
                if isinstance(reason, TimeoutError) else f"does not answer: {reason}")
        return LaunchError(f"slurmrestd at {self.rest_url} {what}: check the cluster's rest_url and that slurmrestd "
                           f"runs and is reachable from this worker")

    def _refused(self, method: str, path: str, status: int, text: str) -> LaunchError:
        answer = _json(text) or {}
        said = _errors(answer) if answer.get("errors") else text.strip()[:200]
        if status == 401 or (status == 500 and UNVERIFIED_TOKEN & error_numbers(answer)):
            user = _credentials()["X-SLURM-USER-NAME"]
            return LaunchError(f"the token was refused: slurmrestd answered {method} {path} with {status} ({said}), "
                               f"as it does for a token slurmctld cannot verify (expired, or not this cluster's): set "
                               f"SLURM_JWT to a fresh token from `scontrol token username={user} lifespan=<seconds>`")
        if status == 404:
            version = _VERSIONS.pop(self.rest_url, None)  # asked again next time: the server may have changed
            where = f"slurm/{version}/{path}" if version and path != OPENAPI_PATH else path
            return LaunchError(f"slurmrestd at {self.rest_url} has no {where} (404): give the cluster's rest_url as "
                               f"slurmrestd's address alone (e.g. http://login1:6820)")
        return SlurmRestError(f"slurmrestd refused {method} {path} ({status}): {said}", answer)


def _credentials() -> dict[str, str]:
    """The token and user headers, from the worker's environment."""
    token = os.environ.get("SLURM_JWT", "").strip().removeprefix("SLURM_JWT=")
    if not token:
        raise LaunchError("no token for slurmrestd: set SLURM_JWT in the worker's environment to a token from "
                          "`scontrol token username=<user> lifespan=<seconds>` (and SLURM_JWT_USER to that user if "
                          "the worker runs as another)")
    user = os.environ.get("SLURM_JWT_USER", "").strip()
    if not user:
        try:
            user = getpass.getuser()
        except OSError:
            raise LaunchError("the worker's user has no name: set SLURM_JWT_USER to the user of SLURM_JWT's token"
                              ) from None
    return {"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": token}


def _json(text: str) -> dict[str, Any] | None:
    try:
        answer = json.loads(text)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def _errors(answer: dict[str, Any]) -> str:
    """slurmrestd's errors in words: its description, else Slurm's message, with Slurm's error number."""
    said = []
    for error in answer.get("errors") or []:
        if isinstance(error, dict):
            words = error.get("description") or error.get("error") or "unknown error"
            number = error.get("error_number", error.get("error_code"))
            said.append(f"{words} (error {number})" if number else words)
        else:
            said.append(str(error))
    return "; ".join(said)


def _words(value: Any) -> list:
    """A state as v0.0.38 gives it (a word, "down*") or later versions (a list of flags)."""
    return value if isinstance(value, list) else str(value or "").replace("*", " NOT_RESPONDING").split()


def _state(speaking: Dialect, job: Job, entry: dict[str, Any]) -> JobState:
    """A listed job's state; once it has ended, its exit code as Slurm recorded it (else as its script did)."""
    state = speaking.state(entry)
    code = None
    if state not in JobStates.ACTIVE:
        code = speaking.exit_code(entry)
        if code is None:
            code = recorded_exit_code(job)
    return job_state(state, str(entry.get("state_reason") or ""), code)
