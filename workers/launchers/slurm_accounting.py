"""What Slurm's accounting (slurmdbd, read with sacct) keeps of a job once it has ended: how it ended and who
cancelled it, how long it queued and ran, what it was allocated, and each step's state, exit code, run time and
peak memory (MaxRSS, sampled by jobacct_gather on the nodes).

    sacct --noheader --parsable2 --jobs=<id> --format=JobIDRaw,JobName,State,ExitCode,ElapsedRaw,AllocTRES,
          MaxRSS,NodeList,Submit,Start

sacct's parsable format is the same from Slurm 20 to 25, where its JSON output changes with every data parser
version; a cluster without accounting answers with an error or nothing, and the job has no record.
"""
from __future__ import annotations

import pwd
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime

from .slurm_states import exit_status

FIELDS = ("JobIDRaw", "JobName", "State", "ExitCode", "ElapsedRaw", "AllocTRES", "MaxRSS", "NodeList", "Submit",
          "Start")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclass(frozen=True)
class StepRecord:
    step: str                  # "batch", "extern", "0", "1", …
    name: str
    state: str
    exit_code: int | None      # the code, or 128 + the signal that ended it
    elapsed_s: int
    max_rss_bytes: int | None  # None where the step was too short to be sampled
    nodes: str


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    state: str
    cancelled_by: str          # the user who cancelled the job ("" unless it was cancelled)
    exit_code: int | None
    queued_s: int | None       # from submission to start
    elapsed_s: int
    allocated: dict[str, str]  # AllocTRES: cpu, mem (megabytes), node, gres/gpu, billing
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return int(self.allocated.get("gres/gpu", 0) or 0)

    @property
    def cpus(self) -> int:
        return int(self.allocated.get("cpu", 0) or 0)

    def to_dict(self) -> dict:
        return {**asdict(self), "gpu_seconds": self.gpus * self.elapsed_s, "cpu_seconds": self.cpus * self.elapsed_s}

    def summary(self) -> str:
        """One line a person reads: how the job ended, what it held for how long, and its steps."""
        how = self.state.lower() + (f" by {self.cancelled_by}" if self.cancelled_by else "")
        held = f"{self.gpus} GPU(s), " if self.gpus else ""
        steps = "; ".join(_step_words(s) for s in self.steps)
        queued = f", queued {self.queued_s} s" if self.queued_s is not None else ""
        return (f"job {self.job_id} {how} (exit {self.exit_code}){queued}, ran {self.elapsed_s} s on {held}"
                f"{self.cpus} CPU(s)" + (f"; steps: {steps}" if steps else ""))


def _step_words(step: StepRecord) -> str:
    rss = f", max RSS {step.max_rss_bytes / 2**20:.0f} MiB" if step.max_rss_bytes is not None else ""
    return f"{step.step} ({step.name}) {step.state.lower()} exit {step.exit_code}, {step.elapsed_s} s{rss}"


def sacct_arguments(job_ids: list[str]) -> list[str]:
    return ["--noheader", "--parsable2", f"--jobs={','.join(job_ids)}", f"--format={','.join(FIELDS)}"]


def parse_sacct(text: str) -> dict[str, JobRecord]:
    """sacct's parsable lines (FIELDS, in order), one record per job with its steps."""
    rows = [dict(zip(FIELDS, line.split("|"))) for line in text.splitlines() if line.count("|") == len(FIELDS) - 1]
    jobs: dict[str, JobRecord] = {}
    for row in rows:
        if "." not in row["JobIDRaw"]:
            state, _, by = row["State"].partition(" by ")
            jobs[row["JobIDRaw"]] = JobRecord(
                job_id=row["JobIDRaw"], state=state, cancelled_by=_user(by.strip()),
                exit_code=exit_status(row["ExitCode"]), queued_s=_seconds_between(row["Submit"], row["Start"]),
                elapsed_s=_int(row["ElapsedRaw"]), allocated=_tres(row["AllocTRES"]))
    for row in rows:
        job_id, dot, step = row["JobIDRaw"].partition(".")
        if dot and job_id in jobs:
            jobs[job_id].steps.append(StepRecord(
                step=step, name=row["JobName"], state=row["State"].partition(" by ")[0],
                exit_code=exit_status(row["ExitCode"]), elapsed_s=_int(row["ElapsedRaw"]),
                max_rss_bytes=_bytes(row["MaxRSS"]), nodes=row["NodeList"]))
    return jobs


def _user(uid: str) -> str:
    """sacct's "CANCELLED by <uid>" as a user name where this machine knows the uid."""
    if not uid.isdigit():
        return uid
    try:
        return pwd.getpwuid(int(uid)).pw_name
    except KeyError:
        return f"uid {uid}"


def _int(text: str) -> int:
    return int(text) if text.strip().isdigit() else 0


def _bytes(text: str) -> int | None:
    match = re.fullmatch(r"([\d.]+)([KMGT]?)", text.strip())
    return int(float(match.group(1)) * _UNITS[match.group(2)]) if match else None


def _tres(text: str) -> dict[str, str]:
    """AllocTRES as slurmrestd gives it too: memory in whole megabytes (sacct writes 8000M, or 7.81G)."""
    tres = dict(item.split("=", 1) for item in text.split(",") if "=" in item)
    if "mem" in tres and (size := _bytes(tres["mem"])) is not None:
        tres["mem"] = str(round(size / _UNITS["M"]))
    return tres


def _seconds_between(start: str, end: str) -> int | None:
    try:
        return max(0, int((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()))
    except ValueError:  # "Unknown", "None": the job never started
        return None
