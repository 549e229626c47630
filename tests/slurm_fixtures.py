"""The Slurm cluster of tests/slurm_cluster.py as session fixtures, started on first use: only a session whose
tests ask for it pays its start-up.

Without root (or where network namespaces are not permitted) the tests that use it are skipped with the reason; on a
machine that can run it, a failure to start is an error of those tests, with the daemons' logs in its message.
"""
import pytest

from tests.slurm_cluster import SlurmCluster, ensure_slurm_installed, unavailable_reason


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running two-node cluster for the session (``SlurmCluster``); ``.run([...])`` runs a command against it."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    ensure_slurm_installed()
    cluster = SlurmCluster()
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def slurm_env(slurm_cluster, monkeypatch):
    """The cluster's environment (SLURM_CONF) in os.environ for one test: code under test that runs sbatch,
    squeue or scancel itself reaches the cluster."""
    for name, value in slurm_cluster.env.items():
        monkeypatch.setenv(name, value)
    return slurm_cluster
