"""The Slurm cluster of tests/slurm_cluster.py as session fixtures, started on first use: only a session whose
tests ask for it pays its start-up.

Without root (or where network namespaces are not permitted) the tests that use it are skipped with the reason; on a
machine that can run it, a failure to start is an error of those tests, with the daemons' logs in its message.
"""
import pytest

from tests.slurm_cluster import SlurmCluster, ensure_slurm_installed, ensure_slurm_root, unavailable_reason


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


@pytest.fixture(scope="session")
def slurm_cluster_24():
    """The same cluster on Slurm 24.11 (from a Debian 13 root, built on first use), beside the 22.05 one."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    ensure_slurm_root("24.11")
    cluster = SlurmCluster(release="24.11")
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(params=["22.05", "24.11"])
def any_slurm(request, slurm_cluster, slurm_cluster_24, monkeypatch):
    """Each test cluster in turn (a test that asks for it runs on both releases), its environment in os.environ as
    ``slurm_env`` puts it; the session's worker reaches it when the test also asks for ``broker``."""
    cluster = slurm_cluster if request.param == "22.05" else slurm_cluster_24
    for name, value in cluster.env.items():
        monkeypatch.setenv(name, value)
    return cluster
