"""The parts of a Slurm batch script that come from a cluster's fields, for the Slurm launcher to write.

    #SBATCH --partition=<partition>       a Slurm name, checked again here
    #SBATCH --account=<account>           a Slurm name
    #SBATCH --qos=<qos>                   a Slurm name
    #SBATCH --time=<time_limit>           a Slurm time
    <env_setup line 1>                    staff's shell lines, verbatim (trusted input), one a line
    ...
    <command>                             every word quoted with shlex.quote (the container image is one word)

A directive's value cannot be quoted (sbatch reads ``#SBATCH`` lines itself, not through a shell), so it is checked
instead: the same rule as when the cluster was saved, once more here, so that a value written to the database by
any other way still cannot put a line break, and with it a directive or a command of its own, into the script.
"""
import shlex
from typing import Sequence

from webapp.models.clusterfields import env_setup_problems, slurm_name_problem, time_limit_problem


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
    problems = env_setup_problems(cluster.env_setup)
    if problems:
        raise UnsafeScriptValue("; ".join(problems))
    return list(cluster.env_setup)


def command_line(words: Sequence[str]) -> str:
    """One shell line running ``words`` exactly (paths, the container image, the trainer's arguments)."""
    return shlex.join(words)
