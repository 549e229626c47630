"""How the suite is spread over pytest-xdist workers (`scripts/test.sh` runs it with ``-n 2 --dist loadgroup``).

Each worker process has its own session: its own test database (pytest-django adds a suffix), its own Redis
databases (tests.conftest), its own Celery worker, Triton and browser. Those are cheap to start twice. What is not:

- a fixture that trains or launches for a minute (the trainer's batched launches, a module's trained model): the
  tests that share such a fixture, directly or through another, form one xdist group, so it runs on one worker only;
- the one Slurm cluster the machine can hold: its tests form one group too, started first among their kind because
  they mostly wait on Slurm while the other worker computes;
- the trained checkpoints that tests of every package read: built once per test run, by whichever worker asks
  first, in a folder all workers share (``once_per_run``); the test command's two passes (PostgreSQL, then SQLite)
  share it too (``WORKBENCH_TEST_SHARED``).

Without xdist (``-p no:xdist``, or a plain ``pytest`` call) the groups mean nothing and the shared folder is the
session's own temporary folder.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
from filelock import FileLock

# Session fixtures of the project's tests that every worker may hold its own of: a server or a browser started in
# seconds, a folder, a prepared dataset; and the checkpoints built once per run through once_per_run.
PER_WORKER = frozenset({"redis_url", "worker", "worker_process", "triton", "chromium", "refused_port",
                        "served_model", "dataset", "runs", "shakespeare_checkpoint", "served_checkpoint",
                        "parallel_checkpoint"})
# Groups that start first among tests of their kind (pytest-django keeps its order of kinds: database, transactional,
# no database): their tests wait on a scheduler more than they compute.
WAITING_FIXTURES = ("slurm_cluster", "slurm_cluster_24")


def worker_index() -> int:
    """0 for the first pytest-xdist worker (gw0), 1 for the second, …; 0 without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") else 0


def _shared_keys(item: pytest.Item) -> list[str]:
    """The expensive fixtures ``item`` uses, directly or through others: those of the project's tests whose scope is
    wider than one test, as the instance the test gets (a module's own, or the session's)."""
    keys = []
    for name in item.fixturenames:
        definitions = item._fixtureinfo.name2fixturedefs.get(name)
        if not definitions or name in PER_WORKER:
            continue
        definition = definitions[-1]
        module = definition.func.__module__
        if definition.scope == "function" or not module.startswith("tests"):
            continue
        where = item.module.__name__ if definition.scope == "module" else module
        keys.append(f"{where}::{name}")
    return keys


def group_by_shared_fixtures(items: list[pytest.Item]) -> None:
    """Mark every test with the xdist group of the tests it shares an expensive fixture with (the connected parts of
    "shares a fixture"), named by the first fixture of the part in sorted order; move the waiting groups first."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    keys_of = {item: _shared_keys(item) for item in items}
    for keys in keys_of.values():
        for key in keys:
            parent[root(key)] = root(keys[0])
    members: dict[str, list[str]] = {}
    for key in list(parent):
        members.setdefault(root(key), []).append(key)
    names = {top: min(keys) for top, keys in members.items()}
    for item, keys in keys_of.items():
        if keys:
            item.add_marker(pytest.mark.xdist_group(names[root(keys[0])]))
    waiting = {root(k) for k in parent if k.rsplit("::", 1)[-1] in WAITING_FIXTURES}
    items.sort(key=lambda item: not any(root(k) in waiting for k in keys_of[item]))  # stable: order kept otherwise


def refuse_a_pytest_that_undoes_the_groups(config: pytest.Config) -> None:
    """pytest-xdist 3.8 marks a grouped test by rewriting its node id, which pytest 9.2's structured node ids undo
    without a word: every worker would then run what its group was meant to run once. Say so instead."""
    if config.getoption("dist", "no") != "loadgroup":
        return
    major, minor = (int(part) for part in pytest.__version__.split(".")[:2])
    if (major, minor) >= (9, 2):
        raise pytest.UsageError(f"pytest {pytest.__version__} ignores pytest-xdist's --dist loadgroup groups: "
                                f"install the pytest that pyproject.toml names (scripts/test.sh does)")


def run_temp_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary folder of the whole test run: under xdist the workers' common folder, which holds each worker's
    own and what once_per_run made; without xdist the session's. Data roots that must reach every test folder."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def data_roots(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The data roots under which the tests' datasets and checkpoints lie: the run's temporary folder and, under the
    test command, the folder its passes share (``once_per_run``)."""
    shared = os.environ.get("WORKBENCH_TEST_SHARED")
    return [run_temp_root(tmp_path_factory), *([Path(shared)] if shared else [])]


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]) -> Path:
    """The folder ``name``, made by ``make(folder)`` once for the whole test run: the first worker to ask makes it
    while the others wait on its lock, then all of them read it. A folder left half-made by a failure is made again.
    Under ``WORKBENCH_TEST_SHARED`` (a folder the test command makes for its passes, and removes), once for them all."""
    shared = Path(os.environ.get("WORKBENCH_TEST_SHARED") or run_temp_root(tmp_path_factory))
    folder, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            done.touch()
    return folder
