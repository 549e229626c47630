"""The versions of slurmrestd's API the REST launcher speaks, and each version's shapes, in this one place.

    Slurm   offers                      spoken here
    22.05   v0.0.36 … v0.0.38           v0.0.38
    23.02   v0.0.37 … v0.0.39           v0.0.38
    23.11   v0.0.38 … v0.0.40           v0.0.40
    24.05   v0.0.39 … v0.0.41           v0.0.41
    24.11   v0.0.40 … v0.0.42           v0.0.42
    25.05   v0.0.40 … v0.0.43           v0.0.42
    25.11   v0.0.41 … v0.0.44           v0.0.42

The launcher reads the server's OpenAPI description once (``GET /openapi/v3``: its paths name every version the
server loaded, ``/slurm/v0.0.41/job/submit``) and takes the newest version both sides know. What changed from
v0.0.38 to v0.0.40, and stayed through v0.0.42, for what the launcher uses:

    submit      the script inside the job (``job.script``; the top-level ``script`` is deprecated from v0.0.41);
                the environment as ``K=V`` strings; GPUs as ``tres_per_node``; a time limit as a number object
    job state   a list: the base state and its flags (``["PENDING", "REQUEUED"]``, ``["RUNNING", "COMPLETING"]``)
    exit code   an object: ``status``, ``return_code`` and ``signal.id``, each number as ``{set, infinite, number}``
    accounting  ``GET /slurmdb/<version>/job/<id>`` (where slurmrestd loads openapi/slurmdbd): the job's state as
                ``state.current``, ``kill_request_user``, ``time`` (submission, start, elapsed), ``tres.allocated``
                as a list of {type, name, count}, and its steps, each with ``tres.requested.max`` (peak memory)
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from .base import JobStates, LaunchError
from .slurm_accounting import JobRecord, StepRecord

SPOKEN = ("v0.0.42", "v0.0.41", "v0.0.40", "v0.0.38")  # newest first
OPENAPI_PATH = "openapi/v3"
_VERSION_PATH = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/")
# The base states of a job (the first of these in a v0.0.40+ state list); everything else in the list is a flag.
_BASE_STATES = frozenset({JobStates.PENDING, JobStates.RUNNING, "SUSPENDED", JobStates.COMPLETED, JobStates.CANCELLED,
                          JobStates.FAILED, JobStates.TIMEOUT, JobStates.NODE_FAIL, JobStates.PREEMPTED,
                          JobStates.BOOT_FAIL, JobStates.DEADLINE, JobStates.OUT_OF_MEMORY})


def offered_versions(description: dict[str, Any]) -> set[str]:
    """The API versions an OpenAPI description's paths serve."""
    paths = description.get("paths") if isinstance(description.get("paths"), dict) else {}
    return {m.group(1) for path in paths if (m := _VERSION_PATH.match(path))}


def _ordinal(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.lstrip("v").split("."))


def chosen_version(offered: Iterable[str], rest_url: str) -> str:
    """The newest version both the server and this launcher speak; LaunchError naming both sides' versions."""
    offered = sorted(set(offered), key=_ordinal)
    common = [v for v in SPOKEN if v in offered]
    if not common:
        raise LaunchError(f"slurmrestd at {rest_url} offers {', '.join(offered) or 'no Slurm API version'}; this "
                          f"launcher speaks {', '.join(reversed(SPOKEN))}: load one of these in slurmrestd "
                          f"(its -s option), or run a Slurm from 22.05 to 25.11")
    return common[0]


def dialect(version: str) -> "Dialect":
    return LEGACY if version == "v0.0.38" else Dialect(version)


def _number(value: Any) -> int | None:
    """A number as v0.0.40+ writes it (``{"set": true, "infinite": false, "number": 3}``) or plainly."""
    if isinstance(value, dict):
        if not value.get("set") or value.get("infinite"):
            return None
        value = value.get("number")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Dialect:
    """v0.0.40 to v0.0.42: how a submission is written and a listed job read."""

    version: str

    def submit_body(self, script: str, job: dict[str, Any], environment: dict[str, str]) -> dict[str, Any]:
        job = dict(job)
        if "gres" in job:
            job["tres_per_node"] = f"gres/{job.pop('gres')}"
        if "nodes" in job:
            job["nodes"] = str(job["nodes"])
        if "time_limit" in job:
            job["time_limit"] = {"set": True, "infinite": False, "number": job["time_limit"]}
        if "excluded_nodes" in job:
            job["excluded_nodes"] = job["excluded_nodes"].split(",")
        return {"job": {**job, "script": script, "environment": [f"{k}={v}" for k, v in environment.items()]}}

    def state(self, entry: dict[str, Any]) -> str:
        """The job's state in squeue's words: its base state, or COMPLETING while it completes."""
        words = entry.get("job_state")
        words = [str(w) for w in words] if isinstance(words, list) else [str(words or "")]
        if JobStates.COMPLETING in words:
            return JobStates.COMPLETING
        return next((w for w in words if w in _BASE_STATES), words[0] if words else "")

    def exit_code(self, entry: dict[str, Any]) -> int | None:
        """The code the job ended with, or 128 + the signal that killed it; None where Slurm has none."""
        code = entry.get("exit_code")
        if not isinstance(code, dict):
            return None
        signal = _number((code.get("signal") or {}).get("id")) if isinstance(code.get("signal"), dict) else None
        if signal:
            return 128 + signal
        return _number(code.get("return_code"))


    def accounting_record(self, job: dict[str, Any]) -> JobRecord:
        """slurmdbd's record of a job (an entry of ``jobs`` in GET slurmdb/<version>/job/<id>)."""
        times = job.get("time") or {}
        submitted, started = _number(times.get("submission")), _number(times.get("start"))
        allocated = {(f"{t.get('type')}/{t['name']}" if t.get("name") else str(t.get("type"))): str(t.get("count"))
                     for t in (job.get("tres") or {}).get("allocated") or []
                     if isinstance(t, dict) and (_number(t.get("count")) or 0) >= 0}  # energy -2: not measured
        steps = []
        for step in job.get("steps") or []:
            peaks = ((step.get("tres") or {}).get("requested") or {}).get("max") or []
            rss = next((_number(t.get("count")) for t in peaks if isinstance(t, dict) and t.get("type") == "mem"),
                       None)
            steps.append(StepRecord(
                step=str((step.get("step") or {}).get("id", "")).partition(".")[2],
                name=str((step.get("step") or {}).get("name", "")), state=self.state({"job_state": step.get("state")}),
                exit_code=self.exit_code(step), elapsed_s=_number((step.get("time") or {}).get("elapsed")) or 0,
                max_rss_bytes=rss, nodes=str((step.get("nodes") or {}).get("range", ""))))
        return JobRecord(
            job_id=str(job.get("job_id")), state=self.state({"job_state": (job.get("state") or {}).get("current")}),
            cancelled_by=str(job.get("kill_request_user") or ""), exit_code=self.exit_code(job),
            queued_s=max(0, started - submitted) if started and submitted else None,
            elapsed_s=_number(times.get("elapsed")) or 0, allocated=allocated, steps=steps)


class _Legacy(Dialect):
    """v0.0.38 (Slurm 22.05 and 23.02): the script beside the job, the environment as an object, the state a string
    and the exit code a wait status."""

    def submit_body(self, script: str, job: dict[str, Any], environment: dict[str, str]) -> dict[str, Any]:
        return {"script": script, "job": {**job, "environment": environment}}

    def state(self, entry: dict[str, Any]) -> str:
        return str(entry.get("job_state") or "")

    def exit_code(self, entry: dict[str, Any]) -> int | None:
        wait_status = entry.get("exit_code")
        if not isinstance(wait_status, int) or isinstance(wait_status, bool):
            return None
        signal = wait_status & 0x7F
        return 128 + signal if signal else wait_status >> 8


LEGACY = _Legacy("v0.0.38")
