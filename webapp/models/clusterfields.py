"""A cluster's scheduler fields, each checked by what it is.

Partition, account, QOS and time limit become ``#SBATCH`` directive values, so each must be exactly a Slurm name or
time: ASCII, and nothing (no space, newline, quote or ``#``) that could end the directive or start another line.
The container image is a registry reference, quoted when a command line carries it; environment setup lines are
staff's shell commands, written verbatim one a line, so a line may not hold a line break. docs/security.md says
which field reaches which part of a batch script.
"""
import os
import re
from pathlib import Path

from django.conf import settings

SLURM_NAME_LENGTH = 64
SLURM_NAME = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{SLURM_NAME_LENGTH - 1}}}")
# MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; [0-9], not \d, which also takes other scripts' digits.
_SIXTY = "[0-5][0-9]"
SLURM_TIME = re.compile(rf"[0-9]{{1,6}}(?::{_SIXTY}){{0,2}}|[0-9]{{1,4}}-(?:[01]?[0-9]|2[0-3])(?::{_SIXTY}){{0,2}}")
# The distribution (Docker/OCI) reference grammar: [domain[:port]/]path[:tag][@digest].
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]{{1,5}})?"
IMAGE_REFERENCE = re.compile(
    rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*"       # name
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"              # tag
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")  # digest
IMAGE_NAME_LENGTH = 255
ENV_SETUP_LINES, ENV_SETUP_LINE_LENGTH = 100, 1000


def slurm_name_problem(field: str, value: str) -> str:
    if not value or SLURM_NAME.fullmatch(value):
        return ""
    return (f"{field} {value!r} is not a Slurm name: use letters, digits, '_', '-' and '.' (ASCII, not starting "
            f"with '-' or '.'), at most {SLURM_NAME_LENGTH} characters")


def time_limit_problem(value: str) -> str:
    if not value or SLURM_TIME.fullmatch(value):
        return ""
    return (f"{value!r} is not a Slurm time: use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS with ASCII "
            f"digits (minutes and seconds 00-59, hours after a day 0-23), e.g. 90, 02:00:00 or 1-12:00:00")


def container_image_problem(value: str) -> str:
    if not value:
        return ""
    name = value.split("@")[0]
    if IMAGE_REFERENCE.fullmatch(value) and len(name) <= IMAGE_NAME_LENGTH:
        return ""
    return (f"{value!r} is not a container image reference: use [registry[:port]/]name[:tag][@digest], e.g. "
            f"nvcr.io/nvidia/pytorch:24.05-py3: lower-case name parts, no spaces or shell characters, a name of at "
            f"most {IMAGE_NAME_LENGTH} characters")


def env_setup_problems(value) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(line, str) for line in value):
        return [f"give the setup as a JSON list of strings, one shell line each (e.g. [\"module load cuda\"]), "
                f"got {type(value).__name__}"]
    problems = []
    if len(value) > ENV_SETUP_LINES:
        problems.append(f"{len(value)} lines; at most {ENV_SETUP_LINES}: source a script that holds the rest")
    for number, line in enumerate(value, start=1):
        if any(c in line for c in "\n\r\x00"):
            problems.append(f"line {number} holds a line break or NUL: give each shell line as its own string")
        elif len(line) > ENV_SETUP_LINE_LENGTH:
            problems.append(f"line {number} has {len(line)} characters; at most {ENV_SETUP_LINE_LENGTH}")
    return problems


# What a runs root may not hold, and why: it is the start of every run folder, and a run folder is also a part of
# the output file name sbatch (or slurmrestd) is given, and of the batch script.
RUNS_ROOT_CHARACTERS = {
    "\x00": "a NUL, which no path can hold",
    "\r": "a carriage return: sbatch refuses a script that holds one before a line break (DOS line breaks)",
    "%": "'%', which Slurm replaces in the output file name (%j: the job id, %x: its name, …)",
    "\\": "a backslash, which turns off Slurm's replacements in the output file name (and is dropped from it)",
}


def runs_root_problem(value: str) -> str:
    if not value:
        return ""
    for character, why in RUNS_ROOT_CHARACTERS.items():
        if character in value:
            return f"{value!r} holds {why}: give a folder whose path has none"
    allowed = [Path(os.path.realpath(r)) for r in settings.WORKBENCH["RUNS_ROOTS"]]
    path = Path(value)
    listed = ", ".join(str(r) for r in settings.WORKBENCH["RUNS_ROOTS"])
    if not path.is_absolute():
        return f"{value} is a relative path: give an absolute folder under one of {listed} (WORKBENCH_RUNS_ROOTS)"
    if not any(Path(os.path.realpath(path)).is_relative_to(root) for root in allowed):
        return (f"{value} is outside the runs roots: give a folder under one of {listed}, or have the server's "
                f"WORKBENCH_RUNS_ROOTS include it")
    return ""


def cluster_field_errors(cluster) -> dict[str, list[str]]:
    """``{field: [messages]}`` for every scheduler field of ``cluster`` that is not what it must be."""
    found = {field: slurm_name_problem(field, getattr(cluster, field)) for field in ("partition", "account", "qos")}
    found["time_limit"] = time_limit_problem(cluster.time_limit)
    found["container_image"] = container_image_problem(cluster.container_image)
    found["runs_root"] = runs_root_problem(cluster.runs_root)
    errors = {field: [message] for field, message in found.items() if message}
    setup = env_setup_problems(cluster.env_setup)
    if setup:
        errors["env_setup"] = setup
    return errors
