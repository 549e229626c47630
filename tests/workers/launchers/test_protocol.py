"""Every launcher implements the whole interface of workers/launchers/base.py: a worker asks any launcher anything
the interface names (submit a run's attempt or a command, find, poll, cancel, logs, accounting, capacity) and never
looks up what a launcher can do."""
import inspect

import pytest

from workers.launchers import Launcher, LocalLauncher, SlurmCLILauncher, SlurmRestLauncher

METHODS = sorted(name for name, value in vars(Launcher).items()
                 if callable(value) and not name.startswith("_"))
ATTRIBUTES = sorted(name for name in Launcher.__annotations__)


def _launchers():
    return [LocalLauncher(), SlurmCLILauncher(), SlurmRestLauncher("http://login1:6820")]


def test_the_interface_names_accounting_and_capacity():
    assert {"submit", "find", "poll", "cancel", "log_paths", "accounting", "capacity"} <= set(METHODS)
    assert {"kind", "label", "start_timeout_s", "calls"} <= set(ATTRIBUTES)


@pytest.mark.parametrize("launcher", _launchers(), ids=lambda launcher: type(launcher).__name__)
def test_every_launcher_implements_every_method_and_attribute_of_the_interface(launcher):
    for name in METHODS:
        method = getattr(type(launcher), name, None)
        assert callable(method), f"{type(launcher).__name__} lacks {name}"
        wanted = list(inspect.signature(getattr(Launcher, name)).parameters)
        assert list(inspect.signature(method).parameters)[:len(wanted)] == wanted, name
    for name in ATTRIBUTES:
        assert hasattr(launcher, name), f"{type(launcher).__name__} lacks {name}"
    assert isinstance(launcher, Launcher)


def test_only_the_local_launcher_counts_its_own_slots_and_it_keeps_no_accounting():
    local, cli, rest = _launchers()
    assert local.capacity() >= 1 and cli.capacity() is None and rest.capacity() is None
    assert local.accounting(["123:456"]) == {} and local.calls == []
