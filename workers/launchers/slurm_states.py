"""Slurm's job states and reasons in words a person can read, shared by the command-line and REST launchers."""
import pwd
import re

from .base import JobState, JobStates

_WHAT = {
    JobStates.TIMEOUT: "the job reached its time limit",
    JobStates.OUT_OF_MEMORY: "a node of the job ran out of memory (OUT_OF_MEMORY): lower the micro-batch, use "
                             "activation checkpointing or shard more of the state",
    JobStates.NODE_FAIL: "a node of the job failed (NODE_FAIL)",
    JobStates.PREEMPTED: "the job was preempted by a job of higher priority",
    JobStates.BOOT_FAIL: "a node of the job failed to boot (BOOT_FAIL)",
    JobStates.DEADLINE: "the job reached its deadline",
    JobStates.CANCELLED: "the job was cancelled",
}


def user_name(uid: str) -> str:
    try:
        return pwd.getpwuid(int(uid)).pw_name
    except (ValueError, KeyError):
        return uid


def job_state(state: str, reason: str = "", exit_code: int | None = None) -> JobState:
    """``state`` as squeue, sacct or slurmrestd give it (``CANCELLED by 1000`` included)."""
    words = state.split()
    name = words[0].rstrip("+") if words else JobStates.GONE
    if name == JobStates.CANCELLED and len(words) == 3 and words[1] == "by":
        return JobState(name, exit_code, f"the job was cancelled by {user_name(words[2])}")
    reason = "" if reason in ("None", "(null)") else reason
    if name in JobStates.ACTIVE:
        return JobState(name, exit_code, f"waiting: {reason}" if name == JobStates.PENDING and reason else reason)
    what = _WHAT.get(name)
    if name == JobStates.FAILED:
        what = f"the job failed with exit code {exit_code}" if exit_code is not None else "the job failed"
    elif name == JobStates.COMPLETED:
        what = ""
    return JobState(name, exit_code, "; ".join(filter(None, [what or (name.lower() if name != JobStates.COMPLETED
                                                                      else ""), reason])))


def exit_status(value: str) -> int | None:
    """``code:signal`` (scontrol, sacct) as one number: the code, or 128 + the signal that killed the job."""
    code, _, sig = value.partition(":")
    if not code.isdigit():
        return None
    return 128 + int(sig) if sig.isdigit() and int(sig) else int(code)


_RANGE = re.compile(r"([^,\[]*)\[([^\]]*)\]([^,]*)|([^,\[\]]+)")


def expand_hostlist(hostlist: str) -> list[str]:
    """A Slurm host list as jobs give it (``n1``, ``n[1-3,7]``, ``gpu[01-02],cpu1``) as node names, as
    ``scontrol show hostnames`` would (one bracket a name; zero-padded numbers stay padded)."""
    names = []
    for prefix, ranges, suffix, plain in _RANGE.findall(hostlist):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            if not last:
                names.append(f"{prefix}{first}{suffix}")
                continue
            names += [f"{prefix}{str(i).zfill(len(first))}{suffix}" for i in range(int(first), int(last) + 1)]
    return names
